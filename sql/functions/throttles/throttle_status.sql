-- A key's last start, the permit that ended last and how, and how many permits run, read without a
-- lock: ends not yet folded in by a decision (and leases that ran out) count.
-- OX005 throttle_not_found.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_status(throttle_name text, throttle_key text DEFAULT '')
RETURNS TABLE (last_start timestamptz, starts bigint, last_end timestamptz, last_outcome text, last_error text,
               last_permit uuid, running integer, observed_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
  c timestamptz := clock_timestamp();
  generation bigint;
  s {{schema}}.throttle_state;
  e record;
BEGIN
  SELECT d.incarnation INTO generation FROM {{schema}}.throttles AS d WHERE d.name = throttle_name;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX005', MESSAGE = format('The throttle %L does not exist', throttle_name);
  END IF;
  SELECT * INTO s FROM {{schema}}.throttle_state AS st
   WHERE st.name = throttle_name AND st.key = throttle_key AND st.incarnation = generation;
  SELECT p.id, coalesce(p.ended_at, p.expires_at) AS ended_at, coalesce(p.outcome, 'expired') AS outcome, p.error
    INTO e
    FROM {{schema}}.permits AS p
   WHERE p.name = throttle_name AND p.key = throttle_key AND p.incarnation = generation
     AND (p.ended_at IS NOT NULL OR p.expires_at <= c)
   ORDER BY 2 DESC, p.id
   LIMIT 1;
  IF e.id IS NOT NULL AND (s.last_end IS NULL OR e.ended_at > s.last_end) THEN
    s.last_end := e.ended_at;
    s.last_outcome := e.outcome;
    s.last_error := e.error;
    s.last_permit := e.id;
  END IF;
  RETURN QUERY
    SELECT s.last_start, coalesce(s.starts, 0), s.last_end, s.last_outcome, s.last_error, s.last_permit,
           (SELECT count(*)::integer FROM {{schema}}.permits AS p
             WHERE p.name = throttle_name AND p.key = throttle_key AND p.incarnation = generation
               AND p.ended_at IS NULL AND p.expires_at > c),
           c;
END $$;
