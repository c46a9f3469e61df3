-- The throttle decision: many requests in one call. Item i belongs to request req[i] and asks
-- `costs[i]` units of throttle names[i] for key keys[i], for holders[i] (null:
-- application_name:pid). A request is the items sharing a number, in the order of their first item;
-- it is granted only if all its items are, with one permit id for all of them. Requests are decided
-- in order, so on one key the earlier comes first. One row per request: granted with the permit, or
-- refused with how long to wait, why, and which throttle and key waits longest. line_first: a
-- request on a key whose line a live waiter holds is refused ('queued'), so a poller never jumps
-- the line; the line's own service (throttle_serve) passes false.
--
-- Steps: (1) throttle_lock locks the keys in (throttle, key) order, or refuses from a snapshot what
-- is refused anyway; (2) throttle_fold folds in what ended since the last decision, at a clock read
-- after every lock; (3) the requests are decided in rounds; (4) each key's new state is written
-- back; (5) the permit rows are written and each request answered. Decisions on a key are
-- serialized under its throttle_state row lock, on the database clock; ending a permit never takes
-- that lock. Inside a caller's transaction the locks are held until it ends: callers bound the wait
-- with lock_timeout, as throttle_batch does.
--
-- A throttle without permits (lease_ms null) stores no permit row: a batch all granted with no item
-- of a throttle with a lease is answered without step 5, with no expiry.
--
-- Every statement here is an index-driven nested loop over a few keys: planned once per session
-- (custom plans would be made again on every call, since the statements take arrays), and never as
-- a scan of a whole table or a hash join, whatever the statistics say. throttle_lock,
-- throttle_glance and throttle_fold have no settings of their own and run under these (a SET clause
-- is saved and restored on every call).
--
-- OX003 invalid_argument: arrays of different lengths, an item without a request number, throttle,
-- key or cost, a key or holder over 200 characters, a cost outside 1 to 1000000, a request naming a
-- throttle and key twice, or a cost above a key's limits (throttle_item). OX005 throttle_not_found.
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
  req_first integer[];       -- each request's first item
  req_ids uuid[];            -- each request's permit id, if it is granted
  base text;                 -- a random uuid, the ids of starts without permit rows are made of it
  g_names text[];
  g_keys text[];
  g_units integer[];
  queued boolean[];          -- per key: live waiters stand in its line
  decided boolean[];         -- per request: granted, refused, or not yet known
  fits boolean;              -- every request fits
  leased boolean;            -- some item's throttle has a lease: a grant writes permit rows
  bad boolean;
  ascending boolean := true;  -- request numbers rise item by item: a request of one item each
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
    ascending := ascending AND (i = 1 OR req[i] > req[i - 1]);
  END LOOP;
  IF bad THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = 'Each item needs a request number, a throttle name, a key (a text of at most 200 characters), a cost from 1 to 1000000 and a holder of at most 200 characters (null: the session)';
  END IF;
  -- (An IF with a subquery is run as a query, even where n > 1 is false.)
  IF n > 1 AND NOT ascending THEN
    IF EXISTS (SELECT 1 FROM unnest(req, names, keys) AS u(r, n, k) GROUP BY u.r, u.n, u.k HAVING count(*) > 1) THEN
      RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = 'A request names each throttle and key at most once';
    END IF;
  END IF;

  -- The distinct keys in lock order, each with the smallest cost asked of it; each item's key
  -- and request (one item: itself, with no statement; items that are each a request, in
  -- order: their keys ranked, nothing to number).
  IF n = 1 THEN
    g_names := names; g_keys := keys; g_units := costs; item_key := ARRAY[1]; item_req := ARRAY[1];
    req_first := ARRAY[1];
  ELSE
    SELECT array_agg(x.n ORDER BY x.n, x.k), array_agg(x.k ORDER BY x.n, x.k), array_agg(x.u ORDER BY x.n, x.k)
      INTO g_names, g_keys, g_units
      FROM (SELECT u.n, u.k, min(u.c) AS u FROM unnest(names, keys, costs) AS u(n, k, c) GROUP BY u.n, u.k) AS x;
    IF ascending THEN
      SELECT array_agg(x.g ORDER BY x.i), array_agg(x.i::integer ORDER BY x.i)
        INTO item_key, item_req
        FROM (SELECT u.i, dense_rank() OVER (ORDER BY u.n, u.k)::integer AS g
                FROM unnest(names, keys) WITH ORDINALITY AS u(n, k, i)) AS x;
      req_first := item_req;
    ELSE
      SELECT array_agg(x.g ORDER BY x.i), array_agg(x.r ORDER BY x.i),
             array_agg(x.i ORDER BY x.i) FILTER (WHERE x.i = x.first)
        INTO item_key, item_req, req_first
        FROM (SELECT y.i, y.first, dense_rank() OVER (ORDER BY y.n, y.k)::integer AS g,
                     dense_rank() OVER (ORDER BY y.first)::integer AS r
                FROM (SELECT u.i, u.n, u.k, min(u.i) OVER (PARTITION BY u.r) AS first
                        FROM unnest(req, names, keys) WITH ORDINALITY AS u(r, n, k, i)) AS y) AS x;
    END IF;
  END IF;
  ks := {{schema}}.throttle_fold({{schema}}.throttle_lock(g_names, g_keys, g_units));
  -- The table is empty unless someone waits: then nothing more is read.
  IF line_first AND EXISTS (SELECT 1 FROM {{schema}}.throttle_waiter_items) THEN
    queued := {{schema}}.throttle_queued(g_names, g_keys);
  END IF;

  -- Step 3. Each round: for each undecided request, the grants before it on each of its keys,
  -- counting the undecided ones (upper) or not (lower). An item fits at the upper count (1), at
  -- the lower only (0), or not even there (-1). A request that fits even if every undecided one
  -- before it is granted is granted; one that does not fit even if none of them is, is refused
  -- (a refused request takes nothing). The first undecided request has all before it decided,
  -- so each round decides at least one, and the answers are those of deciding the requests one
  -- by one, in order.
  -- Every request is granted when on each key its last item fits after all the others on it:
  -- grants only tighten a key (throttle_item), so each item before it fits too; this is
  -- the first round's answer, for one throttle_item per key instead of one per item.
  IF n = 1 THEN
    fits := ({{schema}}.throttle_item(ks[1], costs[1], queued[1], line_first)).reason IS NULL;
    leased := (ks[1]).lease_ms IS NOT NULL;
  ELSE
    SELECT bool_and(({{schema}}.throttle_item(CASE WHEN x.n > 1 THEN {{schema}}.throttle_after(ks[x.g], x.n - 1, x.units - x.cost)
                                                   ELSE ks[x.g] END,
                                              x.cost, queued[x.g], line_first)).reason IS NULL),
           bool_or((ks[x.g]).lease_ms IS NOT NULL)
      INTO fits, leased
      FROM (SELECT DISTINCT ON (u.g) u.g, u.cost, count(*) OVER w AS n, sum(u.cost) OVER w AS units
              FROM unnest(item_req, item_key, costs) AS u(r, g, cost)
            WINDOW w AS (PARTITION BY u.g)
             ORDER BY u.g, u.r DESC) AS x;
  END IF;
  decided := array_fill(CASE WHEN fits THEN true END, ARRAY[item_req[n]]);
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

  -- Step 4. Each key as it stands after its grants, written back (with what the fold changed).
  -- OFFSET 0 keeps the subquery whole, so that WHERE x.changed reads the row throttle_after
  -- built instead of being pushed down into the aggregate as a second call.
  UPDATE {{schema}}.throttle_state AS st
     SET incarnation = x.state_incarnation, last_start = x.last_start, every_from = x.every_from, tat = x.tat,
         last_end = x.last_end, last_outcome = x.last_outcome, last_error = x.last_error,
         last_permit = x.last_permit, starts = x.starts, decided_at = x.c, swept_until = x.c,
         paused_until = x.paused_until, own_every_ms = x.own_every_ms, own_rate_limit = x.own_rate_limit,
         own_per_ms = x.own_per_ms, own_concurrency = x.own_concurrency, live_units = x.live
    FROM (SELECT (t.k).* FROM (
            SELECT {{schema}}.throttle_after(ks[u.g], count(*) FILTER (WHERE decided[u.r]),
                                             coalesce(sum(u.cost) FILTER (WHERE decided[u.r]), 0)) AS k
              FROM unnest(item_req, item_key, costs) AS u(r, g, cost)
             GROUP BY u.g
            OFFSET 0) AS t) AS x
   WHERE x.changed AND st.name = x.name AND st.key = x.key;

  -- Every request granted and no permit row to write: each answers with its first key's instant.
  -- Its id is one random uuid per batch with the request's number in its last 12 hex digits:
  -- nothing is stored under it, so it must be unique, not unguessable.
  IF fits AND NOT leased THEN
    base := gen_random_uuid()::text;
    RETURN QUERY
    SELECT req[req_first[r]], true, (left(base, 24) || lpad(to_hex(r), 12, '0'))::uuid,
           coalesce(holders[req_first[r]], default_holder), (ks[item_key[req_first[r]]]).c, NULL::timestamptz,
           0::bigint, NULL::text, NULL::text, NULL::text
      FROM generate_subscripts(req_first, 1) AS r;
    RETURN;
  END IF;

  -- Step 5. Each item with its key as it stood before it; a refused request answers with the item
  -- that waits longest (the first of them on a tie). Each request's values are read from arrays
  -- or aggregated: no join of the items to themselves, which are as many as 256 (with hash joins
  -- off, a nested loop over them is quadratic). A refusal's throttle_item runs for refused items
  -- only: OFFSET 0 keeps its subquery whole, so that WHERE NOT item.ok gates the call instead of
  -- filtering its rows afterwards.
  req_ids := '{}';
  FOR r IN 1..cardinality(req_first) LOOP
    req_ids := req_ids || gen_random_uuid();
  END LOOP;
  RETURN QUERY
  WITH item AS (
    SELECT u.i, u.r, u.g, u.cost, decided[u.r] AS ok, u.i = req_first[u.r] AS leads,
           CASE WHEN count(*) FILTER (WHERE decided[u.r]) OVER before > 0
                THEN {{schema}}.throttle_after(ks[u.g], count(*) FILTER (WHERE decided[u.r]) OVER before,
                                               coalesce(sum(u.cost) FILTER (WHERE decided[u.r]) OVER before, 0))
                ELSE ks[u.g] END AS k
      FROM unnest(item_req, item_key, costs) WITH ORDINALITY AS u(r, g, cost, i)
    WINDOW before AS (PARTITION BY u.g ORDER BY u.r ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
  ), verdict AS (
    SELECT item.*, v.wait, v.reason
      FROM item
      LEFT JOIN LATERAL (SELECT * FROM {{schema}}.throttle_item(item.k, item.cost, queued[item.g], line_first)
                          WHERE NOT item.ok OFFSET 0) AS v ON true
  ), answer AS (
    SELECT v.r, v.ok, min((v.k).c) FILTER (WHERE v.leads) AS acquired_at,
           min((v.k).c + (v.k).lease_ms * interval '1 millisecond') AS until
      FROM verdict AS v
     GROUP BY v.r, v.ok
  ), refusal AS (
    SELECT DISTINCT ON (v.r) v.r, v.i, v.wait, v.reason
      FROM verdict AS v
     WHERE v.reason IS NOT NULL
     ORDER BY v.r, v.wait DESC, v.i
  ), permit AS (
    INSERT INTO {{schema}}.permits AS p
      (id, name, key, incarnation, holder, acquired_at, expires_at, every_before, rate_cost, cost)
    SELECT req_ids[v.r], (v.k).name, (v.k).key, (v.k).incarnation, coalesce(holders[req_first[v.r]], default_holder),
           (v.k).c, (v.k).c + (v.k).lease_ms * interval '1 millisecond', (v.k).every_from, (v.k).unit * v.cost, v.cost
      FROM verdict AS v
     WHERE v.ok AND (v.k).lease_ms IS NOT NULL
  )
  SELECT req[req_first[a.r]], a.ok, CASE WHEN a.ok THEN req_ids[a.r] END,
         CASE WHEN a.ok THEN coalesce(holders[req_first[a.r]], default_holder) END,
         CASE WHEN a.ok THEN a.acquired_at END, CASE WHEN a.ok THEN a.until END,
         CASE WHEN a.ok THEN 0 ELSE {{schema}}.throttle_ms(w.wait) END, w.reason, names[w.i], keys[w.i]
    FROM answer AS a
    LEFT JOIN refusal AS w ON w.r = a.r
   ORDER BY a.r;
END $$;
