-- ordo 0014: fixes to throttles found by test/throttles-lines.int.test.ts (workers in several
-- processes; every check on the database clock).
--
-- * Lock order. throttle_lock took every free key at once (SKIP LOCKED), then waited for the
--   busy ones in order: a decision holding a later key while it waited for an earlier one, and
--   another holding the earlier one while it waited for the later (the global key and a
--   tenant's, taken by acquireAll in two processes), deadlocked. Now a decision waits for a key
--   only while every key it holds comes before it; otherwise what it took at once is given back
--   (a subtransaction rolled back) and it takes its keys in order. New keys are created and
--   existing ones locked by one statement, in that same order. A line's service decides in
--   rounds, each taking locks: after the first, a round takes only lanes whose keys it can lock
--   without waiting.
-- * The decision's clock. Permits end without their keys' locks, so an end could commit
--   between the clock a decision read and its count of live permits: the grant could then be
--   dated before the end of a permit it no longer counted, and on the database clock more ran
--   than the limit allowed.
-- * A waiter that dies. A permit granted to a waiter whose process was killed before it took
--   the permit held the key until its lease ran out, the line stuck behind it; it is now given
--   back when the waiter's renewals stop.
-- * 'queued'. A request that does not wait was refused while any live waiter stood on any of
--   its keys, even one blocked by its own tenant's cap; now only while a lane's first waiter
--   waits for that very limit (or has not been decided yet).

-- What a decision can know at once: free keys locked (SKIP LOCKED); for the others (held, or
-- new), those a snapshot already refuses for `units` answered (reason and wait), a refund or
-- hold to fold sending them on to the lock. The keys left unlocked without a reason are to be
-- waited for.
CREATE FUNCTION {{schema}}.throttle_glance(names text[], keys text[], units integer[])
RETURNS {{schema}}.throttle_key[]
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_bitmapscan = off
AS $$
DECLARE
  ks {{schema}}.throttle_key[];
  k {{schema}}.throttle_key;
  r record;
  v record;
  c timestamptz;
BEGIN
  SELECT array_agg({{schema}}.throttle_key_of(d, s.st, x.k, coalesce(s.locked, false)) ORDER BY x.i)
    INTO ks
    FROM unnest(names, keys) WITH ORDINALITY AS x(n, k, i)
    LEFT JOIN {{schema}}.throttles AS d ON d.name = x.n
    LEFT JOIN LATERAL (SELECT t, true FROM {{schema}}.throttle_state AS t
                        WHERE t.name = x.n AND t.key = x.k FOR UPDATE SKIP LOCKED) AS s(st, locked) ON true;
  c := clock_timestamp();
  FOR r IN
    SELECT x.i::integer AS g, st AS state,
           EXISTS (SELECT 1 FROM {{schema}}.permits AS p
                    WHERE p.name = x.n AND p.key = x.k AND (p.refund OR p.hold_until IS NOT NULL)) AS to_fold,
           y.live, y.earliest
      FROM unnest(names, keys, units) WITH ORDINALITY AS x(n, k, u, i)
      LEFT JOIN {{schema}}.throttle_state AS st ON st.name = x.n AND st.key = x.k
      CROSS JOIN LATERAL (
        SELECT coalesce(sum(p.cost), 0) AS live, min(p.expires_at) AS earliest FROM {{schema}}.permits AS p
         WHERE p.name = x.n AND p.key = x.k AND p.ended_at IS NULL
           AND p.expires_at > greatest(c, st.decided_at) AND p.incarnation = st.incarnation
           AND (ks[x.i]).concurrency IS NOT NULL) AS y
     WHERE NOT (ks[x.i]).locked
  LOOP
    k := ks[r.g];
    IF k.incarnation IS NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'OX005', MESSAGE = format('The throttle %L does not exist', names[r.g]);
    END IF;
    IF (r.state).incarnation = k.incarnation AND NOT r.to_fold THEN
      k := {{schema}}.throttle_key_of((SELECT d FROM {{schema}}.throttles AS d WHERE d.name = k.name), r.state, k.key, false);
      k.c := greatest(c, k.decided_at);
      k.live := r.live;
      k.earliest := r.earliest;
      v := {{schema}}.throttle_verdict(k, units[r.g]);
      IF v.reason IS NOT NULL THEN
        k.wait := v.wait;
        k.reason := v.reason;
        ks[r.g] := k;
      END IF;
    END IF;
  END LOOP;
  RETURN ks;
END $$;

-- Step 1. The keys (distinct, in (throttle, key) order), with the definition of each: what
-- throttle_glance knows at once, then the keys to wait for, created if new and locked in order.
-- Waiting for a key while holding a later one could deadlock with a decision that holds the
-- first and waits for the second: when the keys taken at once are not all before the first one
-- to wait for, they are given back (the subtransaction is rolled back; the snapshot's refusals
-- stay valid) and every key not refused is taken in order. A decision of one key never waits
-- holding another, and skips the subtransaction.
-- The clock is read after every lock: a decision the previous holder committed is never later.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_lock(names text[], keys text[], units integer[])
RETURNS {{schema}}.throttle_key[]
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_bitmapscan = off
AS $$
DECLARE
  ks {{schema}}.throttle_key[];
  k {{schema}}.throttle_key;
  r record;
  i integer;
  first_wait integer;
  last_locked integer;
  waiting integer[];
BEGIN
  IF cardinality(names) = 1 THEN
    ks := {{schema}}.throttle_glance(names, keys, units);
  ELSE
    BEGIN
      ks := {{schema}}.throttle_glance(names, keys, units);
      SELECT min(j) FILTER (WHERE NOT (ks[j]).locked AND (ks[j]).reason IS NULL), max(j) FILTER (WHERE (ks[j]).locked)
        INTO first_wait, last_locked
        FROM generate_subscripts(ks, 1) AS j;
      IF first_wait < last_locked THEN
        RAISE EXCEPTION USING ERRCODE = 'OX099', MESSAGE = 'out of order';
      END IF;
    EXCEPTION WHEN SQLSTATE 'OX099' THEN
      FOR i IN 1..cardinality(ks) LOOP
        k := ks[i];
        k.locked := false;
        ks[i] := k;
      END LOOP;
    END;
  END IF;
  SELECT coalesce(array_agg(j ORDER BY j), '{}') INTO waiting
    FROM generate_subscripts(ks, 1) AS j WHERE NOT (ks[j]).locked AND (ks[j]).reason IS NULL;
  IF cardinality(waiting) > 0 THEN
    -- One statement, in key order: new keys created, existing ones locked (ON CONFLICT DO
    -- UPDATE locks the row even when its WHERE updates nothing).
    INSERT INTO {{schema}}.throttle_state AS st (name, key, incarnation)
    SELECT names[u.g], keys[u.g], (ks[u.g]).incarnation FROM unnest(waiting) AS u(g) ORDER BY u.g
    ON CONFLICT (name, key) DO UPDATE SET incarnation = st.incarnation WHERE false;
    FOR r IN
      SELECT u.g, s.st AS state
        FROM unnest(waiting) AS u(g)
        CROSS JOIN LATERAL (SELECT t FROM {{schema}}.throttle_state AS t
                             WHERE t.name = names[u.g] AND t.key = keys[u.g] FOR UPDATE) AS s(st)
    LOOP
      ks[r.g] := {{schema}}.throttle_key_of(
        (SELECT d FROM {{schema}}.throttles AS d WHERE d.name = names[r.g]), r.state, keys[r.g], true);
    END LOOP;
  END IF;
  RETURN ks;
END $$;

-- Step 2 (0010's), with the decision's clock kept after every end it sees. Permits end without
-- the key's lock (complete and fail touch only their own rows), so an end may commit after the
-- fold read its clock and before it counts the live units: counted as ended, that permit would
-- have ended after the decision's instant, and a grant at that instant would make one more
-- running than the limit on the database clock (6, then 7 running under a limit of 5 in the
-- test of 50 workers). Now the clock moves up to every end folded, and a permit whose end is
-- later than the clock still counts as live at it.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_fold(ks {{schema}}.throttle_key[])
RETURNS {{schema}}.throttle_key[]
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_bitmapscan = off
AS $$
DECLARE
  k {{schema}}.throttle_key;
  r record;
  g integer;
  c timestamptz := clock_timestamp();
  locked integer[];
BEGIN
  SELECT coalesce(array_agg(i), '{}') INTO locked FROM generate_subscripts(ks, 1) AS i WHERE (ks[i]).locked;
  IF cardinality(locked) = 0 THEN
    RETURN ks;
  END IF;
  FOREACH g IN ARRAY locked LOOP
    k := ks[g];
    IF k.state_incarnation < k.incarnation THEN
      DELETE FROM {{schema}}.permits AS p WHERE p.name = k.name AND p.key = k.key AND p.incarnation < k.incarnation;
      k := {{schema}}.throttle_key_of((SELECT d FROM {{schema}}.throttles AS d WHERE d.name = k.name), NULL, k.key, true);
      k.state_incarnation := k.incarnation;
      k.changed := true;
    ELSIF k.state_incarnation > k.incarnation THEN
      -- Removed and defined again since the definition was read: decide by the new one.
      k := {{schema}}.throttle_key_of((SELECT d FROM {{schema}}.throttles AS d WHERE d.name = k.name),
                                      (SELECT st FROM {{schema}}.throttle_state AS st WHERE st.name = k.name AND st.key = k.key),
                                      k.key, true);
    END IF;
    IF k.incarnation IS NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'OX005', MESSAGE = format('The throttle %L does not exist', (ks[g]).name);
    END IF;
    k.c := greatest(c, k.decided_at);
    k.live := 0;
    ks[g] := k;
  END LOOP;

  FOR r IN
    WITH gone AS (
      DELETE FROM {{schema}}.permits AS p USING unnest(locked) AS u(g)
       WHERE p.name = (ks[u.g]).name AND p.key = (ks[u.g]).key AND p.ended_at IS NOT NULL
         AND (p.outcome <> 'expired' OR p.ended_at < (ks[u.g]).c - interval '1 day')
      RETURNING u.g, p.id, p.incarnation, p.acquired_at, p.ended_at, p.outcome, p.error, p.refund, p.every_before,
                p.rate_cost, p.hold_until)
    SELECT * FROM gone ORDER BY gone.g, gone.acquired_at DESC
  LOOP
    k := ks[r.g];
    CONTINUE WHEN r.incarnation <> k.incarnation;
    k.changed := true;
    -- Decided no earlier than any end it counts as ended.
    k.c := greatest(k.c, r.ended_at);
    IF k.last_end IS NULL OR r.ended_at > k.last_end OR (r.ended_at = k.last_end AND r.id <> k.last_permit) THEN
      k.last_end := r.ended_at; k.last_outcome := r.outcome; k.last_error := r.error; k.last_permit := r.id;
    END IF;
    IF r.refund THEN
      k.tat := k.tat - r.rate_cost;
      -- Newest first, each refunded start gives the `every` interval back to the one before it.
      IF k.every_from = r.acquired_at THEN
        k.every_from := r.every_before;
      END IF;
    END IF;
    k.paused_until := greatest(k.paused_until, r.hold_until);
    ks[r.g] := k;
  END LOOP;

  FOR r IN
    UPDATE {{schema}}.permits AS p SET ended_at = p.expires_at, outcome = 'expired'
      FROM unnest(locked) AS u(g)
     WHERE p.name = (ks[u.g]).name AND p.key = (ks[u.g]).key AND p.ended_at IS NULL
       AND p.expires_at > coalesce((ks[u.g]).swept_until, '-infinity') AND p.expires_at <= (ks[u.g]).c
    RETURNING u.g, p.id, p.incarnation, p.ended_at
  LOOP
    k := ks[r.g];
    CONTINUE WHEN r.incarnation <> k.incarnation;
    k.changed := true;
    IF k.last_end IS NULL OR r.ended_at > k.last_end OR (r.ended_at = k.last_end AND r.id <> k.last_permit) THEN
      k.last_end := r.ended_at; k.last_outcome := 'expired'; k.last_error := NULL; k.last_permit := r.id;
    END IF;
    ks[r.g] := k;
  END LOOP;

  FOR r IN
    SELECT u.g, sum(p.cost) AS live, min(least(p.expires_at, p.ended_at)) AS earliest
      FROM unnest(locked) AS u(g)
      JOIN {{schema}}.permits AS p
        ON p.name = (ks[u.g]).name AND p.key = (ks[u.g]).key AND (p.ended_at IS NULL OR p.ended_at > (ks[u.g]).c)
       AND p.expires_at > (ks[u.g]).c
       AND p.incarnation = (ks[u.g]).incarnation
     WHERE (ks[u.g]).concurrency IS NOT NULL
     GROUP BY u.g
  LOOP
    k := ks[r.g];
    k.live := r.live;
    k.earliest := r.earliest;
    ks[r.g] := k;
  END LOOP;
  RETURN ks;
END $$;

-- Serves the lines of (line_names[i], line_keys[i]) as 0010 did (in rounds, each lane's first
-- live waiter, lanes served least recently first), with two changes:
-- * waiters whose process stopped renewing them leave the line, served or not: a permit granted
--   to a waiter that died before it took it is given back (failed, refunded), so the line goes
--   on without it instead of waiting for the lease to run out (a minute, in the test);
-- * after the first round, only lanes whose keys are free or already this call's (SKIP LOCKED)
--   are decided: a round holds the keys of the rounds before it, and waiting for another one
--   then could deadlock. The lanes left out are served by whoever holds their keys, or later.
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

-- Whether each line of (names[i], keys[i]) has a live waiter that a request not waiting must let
-- go first. 0010 answered yes for any live waiter standing in it, so a poller of tenant b was
-- refused ('queued') a free slot of the global limit for as long as a waiter of tenant a stood
-- there blocked by a's own cap, which nobody in line could use. Now only a lane whose first live
-- waiter has not been decided yet, or was last refused by this very limit, holds the line: a
-- lane refused by another of its limits waits for that one, and the slot goes to whoever can
-- take it. (When a's cap frees, a permit ends and its NOTIFY has the line served at once; a
-- poller asking at that very moment may still take the slot first.)
CREATE OR REPLACE FUNCTION {{schema}}.throttle_queued(names text[], keys text[]) RETURNS boolean[]
LANGUAGE sql STABLE AS $$
  SELECT array_agg(EXISTS (
           SELECT 1
             FROM (SELECT DISTINCT ON (w.lane) w.last_reason, w.last_name, w.last_key
                     FROM {{schema}}.throttle_waiter_items AS i
                     JOIN {{schema}}.throttle_waiters AS w ON w.id = i.waiter
                    WHERE i.name = x.n AND i.key = x.k AND w.permit_id IS NULL
                      AND w.alive_until >= clock_timestamp()
                    ORDER BY w.lane, w.seq) AS head
            WHERE head.last_reason IS NULL OR (head.last_name = x.n AND head.last_key = x.k))
         ORDER BY x.i)
    FROM unnest(names, keys) WITH ORDINALITY AS x(n, k, i)
$$;
