-- ordo 0027: the decision's last statement calls each function once where it needs it.
--
-- In acquire_all's last statement (0017) two calls ran where none or one was needed:
-- * throttle_item, the reason a request was refused, was called for every item, granted ones
--   too: its WHERE NOT item.ok became a filter applied after the function scan (EXPLAIN: the
--   function scan loops once per item, and the filter then removes the granted ones). OFFSET 0
--   keeps the subquery whole, so its WHERE gates the call: refused items only.
-- * throttle_after, a key's state after its grants, was called twice per key: once for the
--   UPDATE's values, and once more for its WHERE x.changed, which the planner pushed down into
--   the aggregate as a filter of its own. OFFSET 0 keeps the subquery whole, so the filter reads
--   the row already built.
-- The answers and the state written are the same; only the calls go.
--
-- Custom SQLSTATEs: none new.

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
           own_per_ms = x.own_per_ms, own_concurrency = x.own_concurrency
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
