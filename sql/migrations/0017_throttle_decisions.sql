-- ordo 0017: the throttle decision read as sets.
--
-- acquire_all decided a batch request by request in a plpgsql loop, each grant copying the key's
-- state in and out of an array and appending to seven parallel arrays of permits; on 1,000 keys
-- that loop was half of every statement's time. Now a request's place in its keys' queues is a
-- window: the grants before it on a key are a count and a sum of costs, and the key as it would
-- stand after them (throttle_after) is what the request is decided against (throttle_item, with
-- 0010's throttle_verdict inside). Whether the requests before it were granted is what a request
-- needs to know, and a refused request takes nothing: so the decision runs in rounds. A request
-- granted even if every undecided request before it were granted is granted; one refused even if
-- none were is refused; the first undecided request always has all before it decided, so each
-- round decides at least one, and a batch whose requests all fit is decided in one. The result is
-- exactly the loop's (the same state before each request, the same verdict), in a few statements:
-- the rounds, then one that writes the permits and the keys' state and answers.
--
-- Requests are the items sharing a request number (as the README says), in the order of their
-- first item; the loop took runs of equal numbers, which differs only for numbers repeated apart.

-- The key after n more grants of `units` in all, at its clock.
CREATE FUNCTION {{schema}}.throttle_after(k {{schema}}.throttle_key, n bigint, units bigint)
RETURNS {{schema}}.throttle_key
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF n > 0 THEN
    k.last_start := k.c;
    k.every_from := k.c;
    IF k.unit IS NOT NULL THEN
      k.tat := greatest(k.tat, k.c) + k.unit * units;
    END IF;
    k.starts := k.starts + n;
    k.live := k.live + units;
    k.earliest := least(k.earliest, k.c + k.lease_ms * interval '1 millisecond');
    k.changed := true;
  END IF;
  RETURN k;
END $$;

-- Whether one item of `cost` may start on key k as it stands (reason null), else how long to wait
-- and why: refused from a snapshot (throttle_glance), a cost above the key's limits (an error for
-- a caller; a waiter, whose key's limit was lowered below its cost since it came, waits on rather
-- than failing everyone else's line), the limits (throttle_verdict), or others waiting in line.
CREATE FUNCTION {{schema}}.throttle_item(k {{schema}}.throttle_key, cost integer, queued boolean,
                                         line_first boolean, OUT wait interval, OUT reason text)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  v record;
BEGIN
  IF k.reason IS NOT NULL THEN
    wait := k.wait; reason := k.reason;
  ELSIF cost > least(k.concurrency, k.rate_limit) AND line_first THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = format('A cost of %s can never be granted by the throttle %L for the key %L: its limit is %s',
                       cost, k.name, k.key, least(k.concurrency, k.rate_limit));
  ELSIF cost > least(k.concurrency, k.rate_limit) THEN
    wait := interval '1 second'; reason := CASE WHEN cost > k.concurrency THEN 'concurrency' ELSE 'rate' END;
  ELSE
    v := {{schema}}.throttle_verdict(k, cost);
    wait := v.wait; reason := v.reason;
    IF reason IS NULL AND queued THEN
      -- Free, but others wait for it: the line is served first (poll again shortly, or wait).
      wait := interval '50 milliseconds'; reason := 'queued';
    END IF;
  END IF;
END $$;

-- Steps 1 and 2 as before (throttle_lock, throttle_fold); step 3 decides the requests in rounds;
-- step 4 writes the permits granted and the keys' new state, and answers each request.
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
  default_holder text := coalesce(nullif(current_setting('application_name'), ''), 'sql') || ':' || pg_backend_pid();
BEGIN
  IF n IS NULL OR n = 0 THEN
    RETURN;
  END IF;
  IF cardinality(names) IS DISTINCT FROM n OR cardinality(keys) IS DISTINCT FROM n
     OR cardinality(costs) IS DISTINCT FROM n OR cardinality(holders) IS DISTINCT FROM n
     OR array_position(req, NULL) IS NOT NULL OR array_position(names, NULL) IS NOT NULL
     OR array_position(keys, NULL) IS NOT NULL OR array_position(costs, NULL) IS NOT NULL
     OR EXISTS (SELECT 1 FROM unnest(keys, holders, costs) AS u(k, h, c)
                 WHERE length(u.k) > 200 OR length(u.h) > 200 OR u.c NOT BETWEEN 1 AND 1000000) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = 'Each item needs a request number, a throttle name, a key (a text of at most 200 characters), a cost from 1 to 1000000 and a holder of at most 200 characters (null: the session)';
  END IF;
  IF EXISTS (SELECT 1 FROM unnest(req, names, keys) AS u(r, n, k) GROUP BY u.r, u.n, u.k HAVING count(*) > 1) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = 'A request names each throttle and key at most once';
  END IF;

  -- The distinct keys in lock order, each with the smallest cost asked of it; each item's key
  -- and request.
  SELECT array_agg(x.n ORDER BY x.n, x.k), array_agg(x.k ORDER BY x.n, x.k), array_agg(x.u ORDER BY x.n, x.k)
    INTO g_names, g_keys, g_units
    FROM (SELECT u.n, u.k, min(u.c) AS u FROM unnest(names, keys, costs) AS u(n, k, c) GROUP BY u.n, u.k) AS x;
  SELECT array_agg(x.g ORDER BY x.i), array_agg(x.r ORDER BY x.i) INTO item_key, item_req
    FROM (SELECT y.i, dense_rank() OVER (ORDER BY y.n, y.k)::integer AS g, dense_rank() OVER (ORDER BY y.first)::integer AS r
            FROM (SELECT u.i, u.n, u.k, min(u.i) OVER (PARTITION BY u.r) AS first
                    FROM unnest(req, names, keys) WITH ORDINALITY AS u(r, n, k, i)) AS y) AS x;

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
                          WHERE NOT item.ok) AS v ON true
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
           own_per_ms = x.own_per_ms, own_concurrency = x.own_concurrency
      FROM (SELECT (t.k).* FROM (
              SELECT {{schema}}.throttle_after(ks[g.g], count(v.i), coalesce(sum(v.cost), 0)) AS k
                FROM generate_subscripts(ks, 1) AS g(g)
                LEFT JOIN verdict AS v ON v.g = g.g AND v.ok
               GROUP BY g.g) AS t) AS x
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

-- An end wakes the line it may unblock. A lane whose first waiter was last refused by one of its
-- own limits (a tenant's cap) lets pollers take the other limits' free slots (0014's
-- throttle_queued), rightly, since nobody in line could use them; but once a permit of that very
-- limit ends, the waiter may be servable, and until its line is served (at the NOTIFY this end
-- sends) a poller could still take the shared slot it needs. Now the end marks such a first
-- waiter undecided again (its reason only: its own retry timing stays), so pollers are refused
-- 'queued' until the line has been served. A waiter being served at that moment is skipped (SKIP
-- LOCKED: its service records its own answer; waiting for it could deadlock with a decision
-- folding this end).
CREATE OR REPLACE FUNCTION {{schema}}.throttle_freed_by(permit_ids uuid[]) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM {{schema}}.throttle_waiter_items) THEN
    UPDATE {{schema}}.throttle_waiters AS w SET last_reason = NULL
     WHERE w.id IN (
       SELECT h.id
         FROM (SELECT DISTINCT ON (x.lane) x.id, x.last_name, x.last_key
                 FROM {{schema}}.permits AS p
                 JOIN {{schema}}.throttle_waiter_items AS i ON i.name = p.name AND i.key = p.key
                 JOIN {{schema}}.throttle_waiters AS x ON x.id = i.waiter
                WHERE p.id = ANY (permit_ids) AND x.permit_id IS NULL AND x.alive_until >= clock_timestamp()
                ORDER BY x.lane, x.seq) AS h
         JOIN {{schema}}.permits AS p ON p.id = ANY (permit_ids) AND p.name = h.last_name AND p.key = h.last_key)
       AND w.id IN (SELECT y.id FROM {{schema}}.throttle_waiters AS y WHERE y.id = w.id FOR UPDATE SKIP LOCKED);
    PERFORM {{schema}}.throttle_freed(ARRAY(SELECT DISTINCT p.name FROM {{schema}}.permits AS p WHERE p.id = ANY (permit_ids)));
  END IF;
END $$;
