-- Ends one permit as completed, every item of it (complete_permits). When nothing was ended, raises
-- why (permit_gone): OX008 permit_expired, or OX007 permit_not_found (unknown, already ended, or
-- the start of a throttle without permits, under whose id nothing is stored).
CREATE OR REPLACE FUNCTION {{schema}}.complete_permit(permit_id uuid)
RETURNS TABLE (id uuid, name text, key text, outcome text, ended_at timestamptz, refunded boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY SELECT * FROM {{schema}}.complete_permits(ARRAY[permit_id]);
  IF NOT FOUND THEN
    PERFORM {{schema}}.permit_gone(permit_id, clock_timestamp());
  END IF;
END $$;
