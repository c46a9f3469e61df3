-- Serves the lines of (line_names[i], line_keys[i]): in rounds, the first live waiter of each lane
-- standing in them, lanes served least recently first, decided together as requests in that order
-- (acquire_all with line_first false, under the keys' locks). A round that grants nothing ends the
-- service (so does the 64th): every lane's first waiter was refused, so those behind it wait too
-- (arrival order within a lane). Each grant is recorded on its waiter and announced
-- ('granted:<waiter>'); next_ms is the shortest wait a refused first waiter was given, when the
-- line is next worth serving if nothing ends sooner, and is announced to other processes
-- ('serve:…') when something was granted.
-- * Waiters whose process stopped renewing them leave the line first, served or not: a permit
--   granted to a waiter that died before it took it is given back (failed, refunded), so the line
--   goes on without it instead of waiting for the lease to run out.
-- * Waiters being served by another call (their rows locked) are left to it.
-- * After the first round, only lanes whose keys are free or already this call's (SKIP LOCKED) are
--   decided: a round holds the keys of the rounds before it, and waiting for another one then could
--   deadlock. The lanes left out are served by whoever holds their keys, or later.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_serve(line_names text[], line_keys text[], OUT granted integer,
                                                     OUT next_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  heads uuid[];
  rounds integer := 0;
  round_grants integer;
  r record;
  f_req integer[]; f_names text[]; f_keys text[]; f_costs integer[]; f_holders text[];
BEGIN
  granted := 0;
  WITH gone AS (
    DELETE FROM {{schema}}.throttle_waiters AS w
     USING unnest(line_names, line_keys) AS l(n, k), {{schema}}.throttle_waiter_items AS i
     WHERE i.name = l.n AND i.key = l.k AND i.waiter = w.id AND w.alive_until < clock_timestamp()
    RETURNING w.permit_id)
  UPDATE {{schema}}.permits AS p
     SET ended_at = greatest(clock_timestamp(), p.acquired_at), outcome = 'failed', refund = true,
         error = 'granted to a waiter that left the line before it took the permit'
    FROM gone
   WHERE p.id = gone.permit_id AND p.ended_at IS NULL AND p.expires_at > clock_timestamp();
  LOOP
    rounds := rounds + 1;
    SELECT array_agg(h.id ORDER BY h.served_at NULLS FIRST, h.seq) INTO heads
      FROM (SELECT DISTINCT ON (w.lane) w.id, w.seq, ln.served_at
              FROM {{schema}}.throttle_waiters AS w
              LEFT JOIN {{schema}}.throttle_lanes AS ln ON ln.lane = w.lane
             WHERE w.id IN (SELECT i.waiter FROM unnest(line_names, line_keys) AS l(n, k)
                              JOIN {{schema}}.throttle_waiter_items AS i ON i.name = l.n AND i.key = l.k)
               AND w.permit_id IS NULL AND w.alive_until >= clock_timestamp()
             ORDER BY w.lane, w.seq) AS h;
    EXIT WHEN heads IS NULL;
    -- Another call serving one of them decides it; the order of the rest is kept.
    SELECT array_agg(u.id ORDER BY u.o) INTO heads
      FROM unnest(heads) WITH ORDINALITY AS u(id, o)
     WHERE u.id IN (SELECT w.id FROM {{schema}}.throttle_waiters AS w
                     WHERE w.id = ANY (heads) AND w.permit_id IS NULL FOR UPDATE SKIP LOCKED);
    EXIT WHEN heads IS NULL;
    IF rounds > 1 THEN
      SELECT array_agg(u.id ORDER BY u.o) INTO heads
        FROM unnest(heads) WITH ORDINALITY AS u(id, o)
        JOIN {{schema}}.throttle_waiters AS w ON w.id = u.id
       WHERE cardinality(w.names) = (SELECT count(*) FROM (
               SELECT 1 FROM {{schema}}.throttle_state AS t
                 JOIN unnest(w.names, w.keys) AS x(n, k) ON t.name = x.n AND t.key = x.k
                  FOR UPDATE OF t SKIP LOCKED) AS z);
      EXIT WHEN heads IS NULL;
    END IF;
    SELECT array_agg(x.o ORDER BY x.o, x.j), array_agg(x.names[x.j] ORDER BY x.o, x.j),
           array_agg(x.keys[x.j] ORDER BY x.o, x.j), array_agg(x.costs[x.j] ORDER BY x.o, x.j),
           array_agg(x.holder ORDER BY x.o, x.j)
      INTO f_req, f_names, f_keys, f_costs, f_holders
      FROM (SELECT u.o::integer AS o, j, w.names, w.keys, w.costs, w.holder
              FROM unnest(heads) WITH ORDINALITY AS u(id, o)
              JOIN {{schema}}.throttle_waiters AS w ON w.id = u.id
             CROSS JOIN generate_subscripts(w.names, 1) AS j) AS x;
    round_grants := 0;
    FOR r IN SELECT * FROM {{schema}}.acquire_all(f_req, f_names, f_keys, f_costs, f_holders, false) LOOP
      IF r.granted THEN
        round_grants := round_grants + 1;
        UPDATE {{schema}}.throttle_waiters AS w
           SET permit_id = r.permit_id, permit_holder = r.holder, acquired_at = r.acquired_at,
               expires_at = r.expires_at, last_wait_ms = NULL, last_reason = NULL
         WHERE w.id = heads[r.request];
        INSERT INTO {{schema}}.throttle_lanes AS ln (lane, served_at)
        SELECT w.lane, clock_timestamp() FROM {{schema}}.throttle_waiters AS w WHERE w.id = heads[r.request]
        ON CONFLICT (lane) DO UPDATE SET served_at = EXCLUDED.served_at;
        PERFORM pg_notify('ordo_throttles.{{schema_name}}', 'granted:' || heads[r.request]);
      ELSE
        UPDATE {{schema}}.throttle_waiters AS w
           SET last_wait_ms = r.retry_after_ms, last_reason = r.reason, last_name = r.limit_name,
               last_key = r.limit_key
         WHERE w.id = heads[r.request];
        next_ms := least(next_ms, r.retry_after_ms);
      END IF;
    END LOOP;
    granted := granted + round_grants;
    EXIT WHEN round_grants = 0 OR rounds >= 64;
  END LOOP;
  IF granted > 0 AND next_ms IS NOT NULL THEN
    -- Other processes' waiters learn when the line is next worth serving.
    PERFORM pg_notify('ordo_throttles.{{schema_name}}', 'serve:' || next_ms || ':' || array_to_string(line_names, ','));
  END IF;
END $$;
