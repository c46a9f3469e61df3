-- What nothing needs any more, deleted: idempotency records older than a day; permits that ended
-- more than a day ago (their holders get permit_not_found after that, not permit_expired),
-- except one whose refund is still to be given back or whose hold (fail() with retryAfter) is
-- still to come; range ownership rows older than a week (collect_batches()); waiters whose
-- process stopped renewing them a minute ago, and lanes not served for a day. Records, waiters
-- and the permits of 10,000 keys at most go per call, so that no call runs long. Every node
-- calls it now and then; a try-lock lets one at a time do the work, and the others return
-- nothing.
CREATE OR REPLACE FUNCTION {{schema}}.maintain() RETURNS TABLE (what text, deleted bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  n bigint;
BEGIN
  IF NOT pg_try_advisory_xact_lock(hashtext('{{schema}}.maintain')) THEN
    RETURN;
  END IF;
  DELETE FROM {{schema}}.issued WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {{schema}}.issued WHERE issued_at < now() - interval '1 day' LIMIT 10000));
  GET DIAGNOSTICS n = ROW_COUNT;
  what := 'idempotency keys'; deleted := n; RETURN NEXT;
  -- A completed or failed permit that no decision has folded still counts in its key's live
  -- units (an expired one no longer does), so deleting it takes its units out of them. The key's
  -- state row is locked first, as a decision locks it, and never waited for: a key being decided
  -- is folded by that decision.
  WITH candidates AS (
    SELECT DISTINCT p.name, p.key FROM {{schema}}.permits AS p
     WHERE p.ended_at < now() - interval '1 day' AND NOT p.refund
       AND (p.hold_until IS NULL OR p.hold_until < now())
     LIMIT 10000
  ), keys AS (
    SELECT st.name, st.key FROM {{schema}}.throttle_state AS st
      JOIN candidates AS c ON c.name = st.name AND c.key = st.key
     ORDER BY st.name, st.key
       FOR UPDATE OF st SKIP LOCKED
  ), gone AS (
    DELETE FROM {{schema}}.permits AS p USING keys AS k
     WHERE p.name = k.name AND p.key = k.key AND p.ended_at < now() - interval '1 day' AND NOT p.refund
       AND (p.hold_until IS NULL OR p.hold_until < now())
    RETURNING p.name, p.key, p.incarnation, p.cost, p.outcome
  ), unfolded AS (
    UPDATE {{schema}}.throttle_state AS st SET live_units = st.live_units - x.units
      FROM (SELECT g.name, g.key, g.incarnation, sum(g.cost) AS units FROM gone AS g
             WHERE g.outcome <> 'expired' GROUP BY g.name, g.key, g.incarnation) AS x
     WHERE st.name = x.name AND st.key = x.key AND st.incarnation = x.incarnation
  )
  SELECT count(*) INTO n FROM gone;
  what := 'ended permits'; deleted := n; RETURN NEXT;
  deleted := {{schema}}.collect_batches(interval '7 days');
  what := 'range ownership'; RETURN NEXT;
  DELETE FROM {{schema}}.throttle_waiters WHERE id = ANY (ARRAY(
    SELECT id FROM {{schema}}.throttle_waiters WHERE alive_until < now() - interval '1 minute' LIMIT 10000));
  GET DIAGNOSTICS n = ROW_COUNT;
  DELETE FROM {{schema}}.throttle_lanes WHERE served_at < now() - interval '1 day';
  GET DIAGNOSTICS deleted = ROW_COUNT;
  what := 'abandoned waiters and lanes'; deleted := deleted + n; RETURN NEXT;
END $$;
