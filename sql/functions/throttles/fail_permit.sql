-- Ends a live permit as failed, every item of it, with an error text (its first 2,000 characters).
-- give_back: return what the permit consumed (its `every` start, its tokens) so that a retry may
-- start at once; null: the throttle's refund_on_failure. hold_ms: pause the permit's keys that long
-- (a downstream 429's Retry-After). The next decision on each key applies both (throttle_fold).
-- Only the permit's rows are touched, found by the index on id alone (see complete_permits), and
-- the keys' waiters are woken.
-- OX003 invalid_argument: a hold outside 1 ms to a year. When nothing was ended, raises why
-- (permit_gone): OX008 permit_expired or OX007 permit_not_found.
CREATE OR REPLACE FUNCTION {{schema}}.fail_permit(permit_id uuid, error_text text DEFAULT NULL, give_back boolean DEFAULT NULL,
                                       hold_ms bigint DEFAULT NULL)
RETURNS TABLE (id uuid, name text, key text, outcome text, ended_at timestamptz, refunded boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  c timestamptz := clock_timestamp();
BEGIN
  IF hold_ms IS NOT NULL AND hold_ms NOT BETWEEN 1 AND 31536000000 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('A hold is 1 ms to a year (got %s ms)', hold_ms);
  END IF;
  RETURN QUERY
    WITH ended AS (
      UPDATE {{schema}}.permits AS p
         SET ended_at = greatest(c, p.acquired_at), outcome = 'failed', error = left(error_text, 2000),
             refund = coalesce(give_back,
                               (SELECT d.refund_on_failure FROM {{schema}}.throttles AS d WHERE d.name = p.name), false),
             hold_until = c + hold_ms * interval '1 millisecond'
       WHERE p.id = permit_id AND p.ended_at IS NULL AND (p.expires_at > c) IS TRUE
      RETURNING p.id, p.name, p.key, p.ended_at, p.refund)
    SELECT DISTINCT ON (e.id) e.id, e.name, e.key, 'failed'::text, e.ended_at, e.refund FROM ended AS e
     ORDER BY e.id, e.name, e.key;
  IF FOUND THEN
    PERFORM {{schema}}.throttle_freed_by(ARRAY[permit_id]);
  ELSE
    PERFORM {{schema}}.permit_gone(permit_id, c);
  END IF;
END $$;
