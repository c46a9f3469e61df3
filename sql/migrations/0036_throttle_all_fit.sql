-- ordo 0036: a batch decided without the rounds when all of it fits, and answered without
-- joining its items to themselves.
--
-- acquire_all (0017) decides a batch in rounds: each round evaluates every undecided item
-- against its key as it would stand after the undecided grants before it and after the
-- decided ones only, and a batch whose requests all fit is decided in the first. That round
-- evaluated each item of a key in turn, with windows over the items; on one hot key, 16
-- items meant 16 evaluations and a sort, for a batch where the answer hangs on the last.
-- Grants only tighten a key (throttle_verdict: a pause does not move, `every` counts from the
-- last start, the bucket's arrival time and the live units only grow), so when the last item
-- on each key fits after all the others on it, every item before it fits after those before
-- it: every request is granted, which is the first round's answer. That is checked with one
-- evaluation per key; when it does not hold (a refusal, a line, a cost above a limit: an
-- error, as before) the rounds run as before and decide as before.
--
-- The statement that writes the permits and the keys' state and answers joined the items to
-- the requests' answers and to themselves four times, by nested loops (hash joins are off in
-- these functions, for the plans over ordo's tables): quadratic in a batch's size, which is
-- up to 256 items. Each request's permit id and first item are now arrays made with the
-- items' numbering, its answer an aggregate, its refusal the item that waits longest (DISTINCT
-- ON, over the refused items only), each key's new state read off the row of its first item.
-- A batch of 256 acquires (and the completions of the previous 256) on keys drawn from 1,000:
-- 50 ms -> 23 ms a statement; on one key, 30 ms -> 11 ms (PostgreSQL 15, one connection,
-- track_functions on).
--
-- Also: the check that a request names each key once ran as a query even for a one-item
-- batch (plpgsql runs an IF with a subquery as a query, whatever comes before the AND).
--
-- callgrind (npx tsx bench/instructions.ts, PostgreSQL 18 single-user, acquires then the
-- completions of their permits through throttle_batch, as the library's batcher sends them):
--   throttle-hot:16 (16 acquires on one key)     8.11 -> 6.62 million instructions
--   throttle:16     (16 on random keys of 1,000) 11.22 -> 10.15 million
--   throttle:1                                    3.28 -> 3.03 million
--
-- Custom SQLSTATEs: none new.

-- 0033's, with the first round answered per key when every request fits, and step 4 without joins.
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
  g_names text[];
  g_keys text[];
  g_units integer[];
  queued boolean[];          -- per key: live waiters stand in its line
  decided boolean[];         -- per request: granted, refused, or not yet known
  fits boolean;              -- every request fits
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
  -- (An IF with a subquery is run as a query, even where n > 1 is false.)
  IF n > 1 THEN
    IF EXISTS (SELECT 1 FROM unnest(req, names, keys) AS u(r, n, k) GROUP BY u.r, u.n, u.k HAVING count(*) > 1) THEN
      RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = 'A request names each throttle and key at most once';
    END IF;
  END IF;

  -- The distinct keys in lock order, each with the smallest cost asked of it; each item's key
  -- and request (one item: itself, with no statement).
  IF n = 1 THEN
    g_names := names; g_keys := keys; g_units := costs; item_key := ARRAY[1]; item_req := ARRAY[1];
    req_first := ARRAY[1]; req_ids := ARRAY[gen_random_uuid()];
  ELSE
    SELECT array_agg(x.n ORDER BY x.n, x.k), array_agg(x.k ORDER BY x.n, x.k), array_agg(x.u ORDER BY x.n, x.k)
      INTO g_names, g_keys, g_units
      FROM (SELECT u.n, u.k, min(u.c) AS u FROM unnest(names, keys, costs) AS u(n, k, c) GROUP BY u.n, u.k) AS x;
    SELECT array_agg(x.g ORDER BY x.i), array_agg(x.r ORDER BY x.i),
           array_agg(x.i ORDER BY x.i) FILTER (WHERE x.i = x.first), array_agg(gen_random_uuid()) FILTER (WHERE x.i = x.first)
      INTO item_key, item_req, req_first, req_ids
      FROM (SELECT y.i, y.first, dense_rank() OVER (ORDER BY y.n, y.k)::integer AS g,
                   dense_rank() OVER (ORDER BY y.first)::integer AS r
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
  -- Every request is granted when on each key its last item fits after all the others on it:
  -- grants only tighten a key (throttle_verdict), so each item before it fits too; this is
  -- the first round's answer, for one throttle_item per key instead of one per item.
  IF n = 1 THEN
    fits := ({{schema}}.throttle_item(ks[1], costs[1], queued[1], line_first)).reason IS NULL;
  ELSE
    SELECT bool_and(({{schema}}.throttle_item({{schema}}.throttle_after(ks[x.g], x.n - 1, x.units - x.cost),
                                              x.cost, queued[x.g], line_first)).reason IS NULL)
      INTO fits
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

  -- Step 4. Each item with its key as it stood before it; a refused request answers with the item
  -- that waits longest (the first of them on a tie). Each request's values are read from arrays
  -- or aggregated, each key's from its first item's row: no join of the items to themselves,
  -- which are as many as 256 (a nested loop over them was quadratic).
  RETURN QUERY
  WITH item AS (
    SELECT u.i, u.r, u.g, u.cost, decided[u.r] AS ok, u.i = req_first[u.r] AS leads,
           row_number() OVER before = 1 AS key_first,
           count(*) FILTER (WHERE decided[u.r]) OVER whole AS key_n,
           coalesce(sum(u.cost) FILTER (WHERE decided[u.r]) OVER whole, 0) AS key_units,
           {{schema}}.throttle_after(ks[u.g], count(*) FILTER (WHERE decided[u.r]) OVER before,
                                     coalesce(sum(u.cost) FILTER (WHERE decided[u.r]) OVER before, 0)) AS k
      FROM unnest(item_req, item_key, costs) WITH ORDINALITY AS u(r, g, cost, i)
    WINDOW before AS (PARTITION BY u.g ORDER BY u.r ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
           whole AS (PARTITION BY u.g)
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
     WHERE v.ok
  ), state AS (
    UPDATE {{schema}}.throttle_state AS st
       SET incarnation = x.state_incarnation, last_start = x.last_start, every_from = x.every_from, tat = x.tat,
           last_end = x.last_end, last_outcome = x.last_outcome, last_error = x.last_error,
           last_permit = x.last_permit, starts = x.starts, decided_at = x.c, swept_until = x.c,
           paused_until = x.paused_until, own_every_ms = x.own_every_ms, own_rate_limit = x.own_rate_limit,
           own_per_ms = x.own_per_ms, own_concurrency = x.own_concurrency, live_units = x.live
      FROM (SELECT (t.k).* FROM (
              SELECT {{schema}}.throttle_after(ks[v.g], v.key_n, v.key_units) AS k
                FROM verdict AS v
               WHERE v.key_first
              OFFSET 0) AS t) AS x
     WHERE x.changed AND st.name = x.name AND st.key = x.key
  )
  SELECT req[req_first[a.r]], a.ok, CASE WHEN a.ok THEN req_ids[a.r] END,
         CASE WHEN a.ok THEN coalesce(holders[req_first[a.r]], default_holder) END,
         CASE WHEN a.ok THEN a.acquired_at END, CASE WHEN a.ok THEN a.until END,
         CASE WHEN a.ok THEN 0 ELSE {{schema}}.throttle_ms(w.wait) END, w.reason, names[w.i], keys[w.i]
    FROM answer AS a
    LEFT JOIN refusal AS w ON w.r = a.r
   ORDER BY a.r;
END $$;

