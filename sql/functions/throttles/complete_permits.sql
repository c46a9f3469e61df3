-- Ends live permits as completed, every item of each (a permits row per item, one answer per
-- permit), and returns those it ended: the others (unknown, already ended, expired) are left out,
-- and complete_permit() on each says why. Only the permits' own rows are touched, never a key's
-- state row, so ending a task never waits behind the decisions on its key: the next decision on the
-- key folds the end in (throttle_fold). The keys' waiters are woken (throttle_freed_by).
-- The permits are found by the index on id alone: the expiry test is written `(expires_at > c) IS
-- TRUE` so that it stays out of the index condition, and the planner settings keep the plan an
-- index scan however few rows the planner believes the table holds.
CREATE OR REPLACE FUNCTION {{schema}}.complete_permits(ids uuid[])
RETURNS TABLE (id uuid, name text, key text, outcome text, ended_at timestamptz, refunded boolean)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
  c timestamptz := clock_timestamp();
BEGIN
  RETURN QUERY
    WITH ended AS (
      UPDATE {{schema}}.permits AS p SET ended_at = greatest(c, p.acquired_at), outcome = 'completed'
       WHERE p.id = ANY (ids) AND p.ended_at IS NULL AND (p.expires_at > c) IS TRUE
      RETURNING p.id, p.name, p.key, p.ended_at)
    SELECT DISTINCT ON (e.id) e.id, e.name, e.key, 'completed'::text, e.ended_at, false FROM ended AS e
     ORDER BY e.id, e.name, e.key;
  PERFORM {{schema}}.throttle_freed_by(ids);
END $$;
