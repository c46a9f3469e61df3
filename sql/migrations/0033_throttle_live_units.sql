-- ordo 0033: a key's live units kept in its state row, not counted from its permits.
--
-- A decision on a key with a concurrency limit counted its live permits: every permit of the
-- key whose lease had not run out, read through the index and the heap. Permits come and go
-- by the thousand; while any transaction on the server keeps an old snapshot (a session idle
-- in a transaction, a long report, a replica's feedback), vacuum can remove none of them, and
-- that count read each one of the last lease's worth of permits. Measured on PostgreSQL 15
-- (32 callers, acquire + complete on one key with a concurrency limit, lease 1 minute, a
-- REPEATABLE READ session left idle): 3,400 decisions a second in the first 5 s, 190 after
-- 35 s; without the idle session it stays at 6,500 to 7,000. With this migration: 4,000, then
-- 800 after 40 s, as for a key without a concurrency limit (the decisions still look through
-- the key's permits for those ended since the last one, and read the state row's versions),
-- where rate-limiter-flexible's consume() on one key goes from 1,260 to 280 a second.
--
-- throttle_state.live_units now holds the units of the key's permits of its incarnation that
-- have not been folded as ended: added by the decision that grants them, taken away by the
-- decision that folds their end (completed or failed), or that marks them expired, or by
-- maintain() when it deletes an end nobody folded (under the key's lock, taken first as a
-- decision takes it; a key locked at that moment is left to the decision that holds it).
-- After throttle_fold it is the live units. throttle_glance, which reads a key another
-- transaction has locked, counts from the permits only when that counter leaves no room (it
-- counts ended permits not yet folded, so it is an upper bound); throttle_fold reads the first
-- lease to run out only for a key with no room left, for the wait a refusal gives: a request
-- of several units refused while the key has room for fewer is told 100 ms, as when no lease
-- runs out sooner.
--
-- Custom SQLSTATEs: none new.

-- Decisions on every key wait while this runs (ALTER TABLE locks throttle_state), so no
-- permit is granted or marked expired between the count and the new functions; a permit
-- completed meanwhile is counted either way (ended, not folded).
ALTER TABLE {{schema}}.throttle_state ADD COLUMN live_units bigint NOT NULL DEFAULT 0;
UPDATE {{schema}}.throttle_state AS st SET live_units = x.units
  FROM (SELECT p.name, p.key, p.incarnation, sum(p.cost) AS units FROM {{schema}}.permits AS p
         WHERE p.ended_at IS NULL OR p.outcome <> 'expired'
         GROUP BY p.name, p.key, p.incarnation) AS x
 WHERE st.name = x.name AND st.key = x.key AND st.incarnation = x.incarnation;

-- 0025's, the live units read from the state row.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_key_of(d {{schema}}.throttles, st {{schema}}.throttle_state,
                                                      key_name text, locked boolean)
RETURNS {{schema}}.throttle_key
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  RETURN ROW(
    d.name, key_name, d.incarnation,
    coalesce(st.own_every_ms, d.every_ms),
    coalesce(st.own_rate_limit, d.rate_limit),
    coalesce(st.own_per_ms, d.per_ms),
    coalesce(st.own_concurrency, d.concurrency),
    d.lease_ms,
    {{schema}}.throttle_cost(coalesce(st.own_rate_limit, d.rate_limit), coalesce(st.own_per_ms, d.per_ms)),
    d.paused_until,
    st.incarnation, st.last_start, st.every_from, st.tat, st.last_end, st.last_outcome, st.last_error,
    st.last_permit, coalesce(st.starts, 0), st.decided_at, st.swept_until, st.paused_until,
    st.own_every_ms, st.own_rate_limit, st.own_per_ms, st.own_concurrency,
    locked, false, NULL, coalesce(st.live_units, 0), NULL, NULL, NULL, false)::{{schema}}.throttle_key;
END $$;

-- 0029's, counting live permits only where the counter leaves no room.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_glance(names text[], keys text[], units integer[])
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
  all_locked boolean := true;
BEGIN
  SELECT array_agg({{schema}}.throttle_key_of(d, s.st, x.k, coalesce(s.locked, false)) ORDER BY x.i)
    INTO ks
    FROM unnest(names, keys) WITH ORDINALITY AS x(n, k, i)
    LEFT JOIN {{schema}}.throttles AS d ON d.name = x.n
    LEFT JOIN LATERAL (SELECT t, true FROM {{schema}}.throttle_state AS t
                        WHERE t.name = x.n AND t.key = x.k FOR UPDATE SKIP LOCKED) AS s(st, locked) ON true;
  -- Every key locked at once (the usual case): nothing to read from a snapshot.
  FOR i IN 1..coalesce(cardinality(ks), 0) LOOP
    all_locked := all_locked AND (ks[i]).locked;
  END LOOP;
  IF all_locked THEN
    RETURN ks;
  END IF;
  c := clock_timestamp();
  FOR r IN
    SELECT x.i::integer AS g, st AS state,
           EXISTS (SELECT 1 FROM {{schema}}.permits AS p
                    WHERE p.name = x.n AND p.key = x.k AND (p.refund OR p.hold_until IS NOT NULL)) AS to_fold,
           y.counted, y.live, y.earliest
      FROM unnest(names, keys, units) WITH ORDINALITY AS x(n, k, u, i)
      LEFT JOIN {{schema}}.throttle_state AS st ON st.name = x.n AND st.key = x.k
      CROSS JOIN LATERAL (
        -- Counted only where the key's counter (an upper bound: it counts ended permits until
        -- they are folded) leaves no room for the request.
        SELECT count(*) > 0 AS counted, coalesce(sum(p.cost), 0) AS live, min(p.expires_at) AS earliest
          FROM (SELECT 1 WHERE st.live_units + x.u > (ks[x.i]).concurrency) AS no_room
          LEFT JOIN {{schema}}.permits AS p
            ON p.name = x.n AND p.key = x.k AND p.ended_at IS NULL
           AND p.expires_at > greatest(c, st.decided_at) AND p.incarnation = st.incarnation) AS y
     WHERE NOT (ks[x.i]).locked
  LOOP
    k := ks[r.g];
    IF k.incarnation IS NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'OX005', MESSAGE = format('The throttle %L does not exist', names[r.g]);
    END IF;
    IF (r.state).incarnation = k.incarnation AND NOT r.to_fold THEN
      k := {{schema}}.throttle_key_of((SELECT d FROM {{schema}}.throttles AS d WHERE d.name = k.name), r.state, k.key, false);
      k.c := greatest(c, k.decided_at);
      IF r.counted THEN
        k.live := r.live;
        k.earliest := r.earliest;
      END IF;
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

-- 0029's, keeping the counter instead of counting.
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
  no_room integer[];          -- locked keys whose concurrency limit their live units reach
BEGIN
  locked := '{}';
  FOR i IN 1..coalesce(cardinality(ks), 0) LOOP
    IF (ks[i]).locked THEN
      locked := locked || i;
    END IF;
  END LOOP;
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
    ks[g] := k;
  END LOOP;

  FOR r IN
    WITH gone AS (
      DELETE FROM {{schema}}.permits AS p USING unnest(locked) AS u(g)
       WHERE p.name = (ks[u.g]).name AND p.key = (ks[u.g]).key AND p.ended_at IS NOT NULL
         AND (p.outcome <> 'expired' OR p.ended_at < (ks[u.g]).c - interval '1 day')
      RETURNING u.g, p.id, p.incarnation, p.acquired_at, p.ended_at, p.outcome, p.error, p.refund, p.every_before,
                p.rate_cost, p.hold_until, p.cost)
    SELECT * FROM gone ORDER BY gone.g, gone.acquired_at DESC
  LOOP
    k := ks[r.g];
    CONTINUE WHEN r.incarnation <> k.incarnation;
    k.changed := true;
    -- An expired permit left the live units when it was marked expired.
    IF r.outcome <> 'expired' THEN
      k.live := k.live - r.cost;
    END IF;
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
    RETURNING u.g, p.id, p.incarnation, p.ended_at, p.cost
  LOOP
    k := ks[r.g];
    CONTINUE WHEN r.incarnation <> k.incarnation;
    k.changed := true;
    k.live := k.live - r.cost;
    IF k.last_end IS NULL OR r.ended_at > k.last_end OR (r.ended_at = k.last_end AND r.id <> k.last_permit) THEN
      k.last_end := r.ended_at; k.last_outcome := 'expired'; k.last_error := NULL; k.last_permit := r.id;
    END IF;
    ks[r.g] := k;
  END LOOP;

  -- Every ended permit is folded now: the counter is the live units. When a key has no room
  -- left, a refusal says when its first lease runs out.
  no_room := '{}';
  FOREACH g IN ARRAY locked LOOP
    IF (ks[g]).live >= (ks[g]).concurrency THEN
      no_room := no_room || g;
    END IF;
  END LOOP;
  IF cardinality(no_room) > 0 THEN
    FOR r IN
      SELECT u.g, min(p.expires_at) AS earliest
        FROM unnest(no_room) AS u(g)
        JOIN {{schema}}.permits AS p
          ON p.name = (ks[u.g]).name AND p.key = (ks[u.g]).key AND p.ended_at IS NULL
         AND p.expires_at > (ks[u.g]).c AND p.incarnation = (ks[u.g]).incarnation
       GROUP BY u.g
    LOOP
      k := ks[r.g];
      k.earliest := r.earliest;
      ks[r.g] := k;
    END LOOP;
  END IF;
  RETURN ks;
END $$;

-- 0029's, writing the counter back.
CREATE OR REPLACE FUNCTION {{schema}}.acquire_all(req integer[], names text[], keys text[], costs integer[],
                                                  holders text[], line_first boolean DEFAULT true)
RETURNS TABLE (request integer, granted boolean, permit_id uuid, holder text, acquired_at timestamptz,
               expires_at timestamptz, retry_after_ms bigint, reason text, limit_name text, limit_key text)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
  n integer := cardinality(req);
  ks {{schema}}.throttle_key[];
  item_key integer[];        -- each item's place in ks
  item_req integer[];        -- each item's request, 1.. in the order of their first items
  g_names text[];
  g_keys text[];
  g_units integer[];
  queued boolean[];          -- per key: live waiters stand in its line
  decided boolean[];         -- per request: granted, refused, or not yet known
  bad boolean;
  default_holder text := coalesce(nullif(current_setting('application_name'), ''), 'sql') || ':' || pg_backend_pid();
BEGIN
  IF n IS NULL OR n = 0 THEN
    RETURN;
  END IF;
  bad := cardinality(names) IS DISTINCT FROM n OR cardinality(keys) IS DISTINCT FROM n
         OR cardinality(costs) IS DISTINCT FROM n OR cardinality(holders) IS DISTINCT FROM n;
  FOR i IN 1..n LOOP
    EXIT WHEN bad;
    bad := req[i] IS NULL OR names[i] IS NULL OR keys[i] IS NULL OR costs[i] IS NULL OR length(keys[i]) > 200
           OR coalesce(length(holders[i]) > 200, false) OR costs[i] NOT BETWEEN 1 AND 1000000;
  END LOOP;
  IF bad THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = 'Each item needs a request number, a throttle name, a key (a text of at most 200 characters), a cost from 1 to 1000000 and a holder of at most 200 characters (null: the session)';
  END IF;
  IF n > 1 AND EXISTS (SELECT 1 FROM unnest(req, names, keys) AS u(r, n, k) GROUP BY u.r, u.n, u.k HAVING count(*) > 1) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = 'A request names each throttle and key at most once';
  END IF;

  -- The distinct keys in lock order, each with the smallest cost asked of it; each item's key
  -- and request (one item: itself, with no statement).
  IF n = 1 THEN
    g_names := names; g_keys := keys; g_units := costs; item_key := ARRAY[1]; item_req := ARRAY[1];
  ELSE
    SELECT array_agg(x.n ORDER BY x.n, x.k), array_agg(x.k ORDER BY x.n, x.k), array_agg(x.u ORDER BY x.n, x.k)
      INTO g_names, g_keys, g_units
      FROM (SELECT u.n, u.k, min(u.c) AS u FROM unnest(names, keys, costs) AS u(n, k, c) GROUP BY u.n, u.k) AS x;
    SELECT array_agg(x.g ORDER BY x.i), array_agg(x.r ORDER BY x.i) INTO item_key, item_req
      FROM (SELECT y.i, dense_rank() OVER (ORDER BY y.n, y.k)::integer AS g, dense_rank() OVER (ORDER BY y.first)::integer AS r
              FROM (SELECT u.i, u.n, u.k, min(u.i) OVER (PARTITION BY u.r) AS first
                      FROM unnest(req, names, keys) WITH ORDINALITY AS u(r, n, k, i)) AS y) AS x;
  END IF;
  ks := {{schema}}.throttle_fold({{schema}}.throttle_lock(g_names, g_keys, g_units));
  -- The table is empty unless someone waits: then nothing more is read.
  IF line_first AND EXISTS (SELECT 1 FROM {{schema}}.throttle_waiter_items) THEN
    queued := {{schema}}.throttle_queued(g_names, g_keys);
  END IF;

  -- Step 3. Each round: for each undecided request, the grants before it on each of its keys,
  -- counting the undecided ones (upper) or not (lower). An item fits at the upper count (1), at
  -- the lower only (0), or not even there (-1).
  decided := array_fill(NULL::boolean, ARRAY[item_req[n]]);
  WHILE array_position(decided, NULL) IS NOT NULL LOOP
    SELECT array_agg(coalesce(decided[x.r], x.verdict) ORDER BY x.r) INTO decided
      FROM (SELECT z.r, CASE min(z.fit) WHEN 1 THEN true WHEN -1 THEN false END AS verdict
              FROM (SELECT y.r,
                           CASE WHEN ({{schema}}.throttle_item({{schema}}.throttle_after(ks[y.g], y.up_n, y.up_units),
                                                               y.cost, queued[y.g], line_first)).reason IS NULL THEN 1
                                WHEN ({{schema}}.throttle_item({{schema}}.throttle_after(ks[y.g], y.lo_n, y.lo_units),
                                                               y.cost, queued[y.g], line_first)).reason IS NULL THEN 0
                                ELSE -1 END AS fit
                      FROM (SELECT u.r, u.g, u.cost,
                                   count(*) FILTER (WHERE decided[u.r] IS NOT false) OVER before AS up_n,
                                   coalesce(sum(u.cost) FILTER (WHERE decided[u.r] IS NOT false) OVER before, 0) AS up_units,
                                   count(*) FILTER (WHERE decided[u.r]) OVER before AS lo_n,
                                   coalesce(sum(u.cost) FILTER (WHERE decided[u.r]) OVER before, 0) AS lo_units
                              FROM unnest(item_req, item_key, costs) AS u(r, g, cost)
                            WINDOW before AS (PARTITION BY u.g ORDER BY u.r ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                           ) AS y
                     WHERE decided[y.r] IS NULL) AS z
             GROUP BY z.r
             UNION ALL
            SELECT r, NULL FROM generate_subscripts(decided, 1) AS r WHERE decided[r] IS NOT NULL) AS x;
  END LOOP;

  -- Step 4. Each item with its key as it stood before it; a refused request answers with the item
  -- that waits longest (the first of them on a tie).
  RETURN QUERY
  WITH item AS (
    SELECT u.i, u.r, u.g, u.cost, decided[u.r] AS ok,
           {{schema}}.throttle_after(ks[u.g], count(*) FILTER (WHERE decided[u.r]) OVER before,
                                     coalesce(sum(u.cost) FILTER (WHERE decided[u.r]) OVER before, 0)) AS k
      FROM unnest(item_req, item_key, costs) WITH ORDINALITY AS u(r, g, cost, i)
    WINDOW before AS (PARTITION BY u.g ORDER BY u.r ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
  ), verdict AS (
    SELECT item.*, v.wait, v.reason
      FROM item
      LEFT JOIN LATERAL (SELECT * FROM {{schema}}.throttle_item(item.k, item.cost, queued[item.g], line_first)
                          WHERE NOT item.ok OFFSET 0) AS v ON true
  ), answer AS (
    SELECT v.r, v.ok, min(v.i) AS first,
           CASE WHEN v.ok THEN gen_random_uuid() END AS id,
           CASE WHEN v.ok THEN coalesce(holders[min(v.i)], default_holder) END AS holder,
           (array_agg(v.i ORDER BY v.wait DESC, v.i) FILTER (WHERE v.reason IS NOT NULL))[1] AS worst,
           min((v.k).c + (v.k).lease_ms * interval '1 millisecond') AS until
      FROM verdict AS v
     GROUP BY v.r, v.ok
  ), permit AS (
    INSERT INTO {{schema}}.permits AS p
      (id, name, key, incarnation, holder, acquired_at, expires_at, every_before, rate_cost, cost)
    SELECT a.id, (v.k).name, (v.k).key, (v.k).incarnation, a.holder, (v.k).c,
           (v.k).c + (v.k).lease_ms * interval '1 millisecond', (v.k).every_from, (v.k).unit * v.cost, v.cost
      FROM verdict AS v JOIN answer AS a ON a.r = v.r
     WHERE v.ok
  ), state AS (
    UPDATE {{schema}}.throttle_state AS st
       SET incarnation = x.state_incarnation, last_start = x.last_start, every_from = x.every_from, tat = x.tat,
           last_end = x.last_end, last_outcome = x.last_outcome, last_error = x.last_error,
           last_permit = x.last_permit, starts = x.starts, decided_at = x.c, swept_until = x.c,
           paused_until = x.paused_until, own_every_ms = x.own_every_ms, own_rate_limit = x.own_rate_limit,
           own_per_ms = x.own_per_ms, own_concurrency = x.own_concurrency, live_units = x.live
      FROM (SELECT (t.k).* FROM (
              SELECT {{schema}}.throttle_after(ks[g.g], count(v.i), coalesce(sum(v.cost), 0)) AS k
                FROM generate_subscripts(ks, 1) AS g(g)
                LEFT JOIN verdict AS v ON v.g = g.g AND v.ok
               GROUP BY g.g
              OFFSET 0) AS t) AS x
     WHERE x.changed AND st.name = x.name AND st.key = x.key
  )
  SELECT req[a.first], a.ok, a.id, a.holder, CASE WHEN a.ok THEN (v.k).c END, CASE WHEN a.ok THEN a.until END,
         CASE WHEN a.ok THEN 0 ELSE {{schema}}.throttle_ms(w.wait) END, w.reason,
         names[a.worst], keys[a.worst]
    FROM answer AS a
    JOIN verdict AS v ON v.i = a.first
    LEFT JOIN verdict AS w ON w.i = a.worst
   ORDER BY a.r;
END $$;

-- 0023's, taking an unfolded end it deletes out of the counter, under the key's lock.
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
  -- A completed or failed permit no decision has folded still counts in its key's live units,
  -- so the key's state row is locked before its permits are deleted, as a decision locks them,
  -- and never waited for: a key being decided is folded by that decision.
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
