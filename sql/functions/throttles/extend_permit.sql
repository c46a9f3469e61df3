-- Renews a live permit's lease: each item's expires_at becomes the clock plus its throttle's lease,
-- never earlier than it was. Returns the earliest new expires_at. Only the permit's rows are
-- touched, found by the index on id alone (see complete_permits); an item of another incarnation of
-- its throttle (removed, maybe defined again) is not renewed. The fold marks run-out leases expired
-- under their row locks, so an extend racing with it either commits first or finds the permit
-- expired. When nothing was renewed, raises why (permit_gone): OX008 permit_expired or
-- OX007 permit_not_found.
CREATE OR REPLACE FUNCTION {{schema}}.extend_permit(permit_id uuid) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  c timestamptz := clock_timestamp();
  until timestamptz;
BEGIN
  WITH renewed AS (
    UPDATE {{schema}}.permits AS p
       SET expires_at = greatest(p.expires_at, c + d.lease_ms * interval '1 millisecond')
      FROM {{schema}}.throttles AS d
     WHERE d.name = p.name AND d.incarnation = p.incarnation
       AND p.id = permit_id AND p.ended_at IS NULL AND (p.expires_at > c) IS TRUE
    RETURNING p.expires_at)
  SELECT min(r.expires_at) INTO until FROM renewed AS r;
  IF until IS NULL THEN
    PERFORM {{schema}}.permit_gone(permit_id, c);
  END IF;
  RETURN until;
END $$;
