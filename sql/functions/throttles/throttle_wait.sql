-- A request waiting in line: enqueued (or, called again, renewed for alive_ms), its lines served,
-- then its answer: granted with the permit (it leaves the line), or not yet, with the wait and
-- reason it was last given ('queued' while others are ahead of it in its lane), and when the line
-- is next worth serving. Same items as acquire_all's; a bad item raises, and nothing is enqueued.
-- It waits at most 500 ms for a key's lock (a caller's transaction may hold one), then fails with
-- 55P03 lock_not_available, and the client calls again shortly.
-- OX003 invalid_argument: not 1 to 16 items, arrays of different lengths, alive_ms outside 100 ms
-- to 10 minutes, or a bad item (throttle_check_items). OX005 throttle_not_found.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_wait(waiter uuid, names text[], keys text[], costs integer[], waiter_holder text,
                                         alive_ms bigint)
RETURNS TABLE (granted boolean, permit_id uuid, holder text, acquired_at timestamptz, expires_at timestamptz,
               retry_after_ms bigint, reason text, limit_name text, limit_key text, next_ms bigint)
LANGUAGE plpgsql VOLATILE
SET lock_timeout = '500ms'
AS $$
#variable_conflict use_column
DECLARE
  w {{schema}}.throttle_waiters;
  s record;
  n integer := cardinality(names);
BEGIN
  IF n IS NULL OR n = 0 OR n > 16 OR cardinality(keys) IS DISTINCT FROM n OR cardinality(costs) IS DISTINCT FROM n
     OR alive_ms IS NULL OR alive_ms NOT BETWEEN 100 AND 600000 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = 'A waiting request is 1 to 16 items of a throttle, a key and a cost, alive 100 ms to 10 minutes at a time';
  END IF;
  INSERT INTO {{schema}}.throttle_waiters AS t (id, lane, names, keys, costs, holder, alive_until)
  SELECT waiter, md5(json_agg(json_build_array(x.n, x.k) ORDER BY x.n, x.k)::text), names, keys, costs,
         waiter_holder, clock_timestamp() + alive_ms * interval '1 millisecond'
    FROM unnest(names, keys) AS x(n, k)
  ON CONFLICT (id) DO UPDATE SET alive_until = EXCLUDED.alive_until
  RETURNING t.* INTO w;
  IF NOT EXISTS (SELECT 1 FROM {{schema}}.throttle_waiter_items AS i WHERE i.waiter = throttle_wait.waiter) THEN
    -- Checked once, on arrival: nothing that cannot be served stands in a line.
    PERFORM {{schema}}.throttle_check_items(names, keys, costs, waiter_holder);
    INSERT INTO {{schema}}.throttle_waiter_items (name, key, waiter)
    SELECT x.n, x.k, throttle_wait.waiter FROM unnest(names, keys) AS x(n, k);
  END IF;
  s := {{schema}}.throttle_serve(names, keys);
  SELECT * INTO w FROM {{schema}}.throttle_waiters AS t WHERE t.id = throttle_wait.waiter;
  IF w.permit_id IS NOT NULL THEN
    DELETE FROM {{schema}}.throttle_waiters AS t WHERE t.id = throttle_wait.waiter;
    RETURN QUERY SELECT true, w.permit_id, w.permit_holder, w.acquired_at, w.expires_at, 0::bigint,
                        NULL::text, NULL::text, NULL::text, s.next_ms;
    RETURN;
  END IF;
  RETURN QUERY SELECT false, NULL::uuid, NULL::text, NULL::timestamptz, NULL::timestamptz,
                      coalesce(w.last_wait_ms, 50), coalesce(w.last_reason, 'queued'), w.last_name, w.last_key,
                      s.next_ms;
END $$;
