-- ordo 0037: throttles that grant starts without permits (permits: false).
--
-- A grant writes a permit row, which its end updates and the next decision on its key deletes:
-- three writes to a table of short-lived rows, and two indexes on it, for every start. That row
-- is what gives a start its lease (a concurrency limit counts the live ones), its end and
-- outcome ("did the last FOO fail?"), its refund and its hold. A throttle of rate limits only
-- (every, limit/per) whose user wants none of that, as a plain rate limiter, paid for it
-- anyway: on 1,000 keys ordo made about half the decisions a second of rate-limiter-flexible's
-- PostgreSQL limiter, which updates one counter row per call.
--
-- define_throttle(…, keep_permits => false) defines such a throttle: its lease_ms is null (no
-- lease, so no permit), and it takes no concurrency, lease or refund_on_failure, nor may a key
-- of it get its own concurrency (set_key_limits). acquire_all decides as before and writes
-- state as before, and a permit row only for items of throttles with a lease; a request none
-- of whose items has one is answered with its grant's id and a null expires_at, and nothing
-- is stored under that id (complete_permit, fail_permit and extend_permit answer OX007 for
-- it). A request mixing both kinds gets permit rows for its items with a lease, as before.
-- Redefining a throttle either way keeps each key's state; permits already granted live on
-- and end as before.
--
-- Measured (PostgreSQL 15, 32 callers on one pool, acquires on keys drawn from 1,000, the
-- permit insert taken out of 0036's acquire_all): 9,300 -> 16,300-18,200 decisions a second,
-- where rate-limiter-flexible's consume() made 9,900-12,800 on the same server.
--
-- Custom SQLSTATEs: none new.

ALTER TABLE {{schema}}.throttles
  ALTER COLUMN lease_ms DROP NOT NULL,
  ADD CONSTRAINT throttles_permits_check
    CHECK (lease_ms IS NOT NULL OR (concurrency IS NULL AND NOT refund_on_failure));

DROP FUNCTION {{schema}}.define_throttle(text, bigint, integer, bigint, integer, bigint, boolean, text);

-- 0004's, with keep_permits: false defines a throttle without permits (lease_ms null).
CREATE FUNCTION {{schema}}.define_throttle(
  throttle_name text, new_every_ms bigint, new_rate_limit integer, new_per_ms bigint,
  new_concurrency integer, new_lease_ms bigint, new_refund_on_failure boolean, mode text,
  keep_permits boolean DEFAULT true)
RETURNS TABLE (outcome text, definition {{schema}}.throttles)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  result {{schema}}.throttles;
  lease bigint := CASE WHEN keep_permits IS NOT false THEN coalesce(new_lease_ms, 300000) END;
BEGIN
  IF mode IS NULL OR mode NOT IN ('create', 'if_not_exists', 'overwrite') THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('unknown define mode %L', mode);
  END IF;
  IF throttle_name IS NULL OR throttle_name !~ '^[A-Za-z_][A-Za-z0-9_]{0,62}$' THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = format('A throttle name must be an identifier (a letter or underscore, then letters, digits or underscores, at most 63 characters), not %L', throttle_name);
  END IF;
  IF new_every_ms IS NULL AND new_rate_limit IS NULL AND new_concurrency IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = 'A throttle needs at least one policy: every, limit with per, or concurrency';
  END IF;
  IF (new_rate_limit IS NULL) <> (new_per_ms IS NULL) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = 'limit and per go together: give both or neither';
  END IF;
  IF keep_permits IS false AND (new_concurrency IS NOT NULL OR new_lease_ms IS NOT NULL OR new_refund_on_failure) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The throttle %L grants no permits (permits: false): it takes every and limit with per only, not %s (they need a permit that lives until it ends)',
      throttle_name, CASE WHEN new_concurrency IS NOT NULL THEN 'concurrency'
                          WHEN new_lease_ms IS NOT NULL THEN 'a lease' ELSE 'refundOnFailure' END);
  END IF;
  -- Out of range values fail the table's CHECKs (invalid_argument).
  LOOP
    INSERT INTO {{schema}}.throttles AS d
      (name, every_ms, rate_limit, per_ms, concurrency, lease_ms, refund_on_failure)
    VALUES (throttle_name, new_every_ms, new_rate_limit, new_per_ms, new_concurrency,
            lease, coalesce(new_refund_on_failure, false))
    ON CONFLICT (name) DO NOTHING
    RETURNING d.* INTO result;
    IF FOUND THEN
      RETURN QUERY SELECT 'created'::text, result;
      RETURN;
    END IF;
    IF mode = 'overwrite' THEN
      -- A key's own concurrency needs permits: a throttle that drops them drops that too.
      UPDATE {{schema}}.throttles AS d
         SET every_ms = new_every_ms, rate_limit = new_rate_limit, per_ms = new_per_ms,
             concurrency = new_concurrency, lease_ms = lease,
             refund_on_failure = coalesce(new_refund_on_failure, false), updated_at = now()
       WHERE d.name = throttle_name
      RETURNING d.* INTO result;
      IF FOUND THEN
        IF lease IS NULL THEN
          UPDATE {{schema}}.throttle_state AS st SET own_concurrency = NULL
           WHERE st.name = throttle_name AND st.own_concurrency IS NOT NULL;
        END IF;
        RETURN QUERY SELECT 'overwritten'::text, result;
        RETURN;
      END IF;
    ELSE
      SELECT * INTO result FROM {{schema}}.throttles AS d WHERE d.name = throttle_name;
      IF FOUND THEN
        RETURN QUERY SELECT 'exists'::text, result;
        RETURN;
      END IF;
    END IF;
    -- Removed between the two statements: try again.
  END LOOP;
END $$;

-- fail(error, { retryAfter }) of a start without a permit: its keys are held until then at
-- once (there is no permit for the next decision to fold), never shortening a longer pause,
-- as a permit's hold does not. Keys in lock order; a throttle removed meanwhile is skipped.
CREATE FUNCTION {{schema}}.hold_keys(names text[], keys text[], hold_ms bigint) RETURNS void
LANGUAGE sql VOLATILE AS $$
  INSERT INTO {{schema}}.throttle_state AS st (name, key, incarnation, paused_until)
  SELECT d.name, u.k, d.incarnation, clock_timestamp() + hold_ms * interval '1 millisecond'
    FROM unnest(names, keys) AS u(n, k)
    JOIN {{schema}}.throttles AS d ON d.name = u.n
   ORDER BY d.name, u.k
  ON CONFLICT (name, key) DO UPDATE SET paused_until = greatest(st.paused_until, EXCLUDED.paused_until)
$$;

-- 0030's, refusing a key's own concurrency on a throttle without permits.
CREATE OR REPLACE FUNCTION {{schema}}.set_key_limits(throttle_name text, throttle_key text, new_every_ms bigint,
                                                     new_rate_limit integer, new_per_ms bigint, new_concurrency integer)
RETURNS TABLE (every_ms bigint, rate_limit integer, per_ms bigint, concurrency integer)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  d {{schema}}.throttles;
BEGIN
  SELECT * INTO d FROM {{schema}}.throttles AS t WHERE t.name = throttle_name FOR KEY SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX005', MESSAGE = format('The throttle %L does not exist', throttle_name);
  END IF;
  IF throttle_key IS NULL OR length(throttle_key) > 200 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = 'A key is a text of at most 200 characters';
  END IF;
  IF new_every_ms NOT BETWEEN 1 AND 31536000000 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'every is 1 ms to 365 days (31536000000 ms), or null for the throttle''s (got %s ms)', new_every_ms);
  END IF;
  IF new_per_ms NOT BETWEEN 1 AND 31536000000 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'per is 1 ms to 365 days (31536000000 ms), or null for the throttle''s (got %s ms)', new_per_ms);
  END IF;
  IF new_rate_limit NOT BETWEEN 1 AND 1000000 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'limit is 1 to 1000000, or null for the throttle''s (got %s)', new_rate_limit);
  END IF;
  IF new_concurrency NOT BETWEEN 1 AND 1000000 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'concurrency is 1 to 1000000, or null for the throttle''s (got %s)', new_concurrency);
  END IF;
  IF new_concurrency IS NOT NULL AND d.lease_ms IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The throttle %L grants no permits (permits: false), so a key of it cannot have a concurrency limit: define it with permits to count live starts', throttle_name);
  END IF;
  IF (coalesce(new_rate_limit, d.rate_limit) IS NULL) <> (coalesce(new_per_ms, d.per_ms) IS NULL) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = format('limit and per go together: the throttle %L has no rate limit, so give both', throttle_name);
  END IF;
  INSERT INTO {{schema}}.throttle_state AS st
    (name, key, incarnation, own_every_ms, own_rate_limit, own_per_ms, own_concurrency)
  VALUES (throttle_name, throttle_key, d.incarnation, new_every_ms, new_rate_limit, new_per_ms, new_concurrency)
  ON CONFLICT (name, key) DO UPDATE
    SET own_every_ms = EXCLUDED.own_every_ms, own_rate_limit = EXCLUDED.own_rate_limit,
        own_per_ms = EXCLUDED.own_per_ms, own_concurrency = EXCLUDED.own_concurrency;
  PERFORM {{schema}}.throttle_freed(ARRAY[throttle_name]);
  RETURN QUERY SELECT coalesce(new_every_ms, d.every_ms), coalesce(new_rate_limit, d.rate_limit),
                      coalesce(new_per_ms, d.per_ms), coalesce(new_concurrency, d.concurrency);
END $$;

-- 0033's: a key of a throttle without permits has no concurrency limit, whatever its own
-- limits say (set_key_limits refuses one, but may race with a redefinition).
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
    CASE WHEN d.lease_ms IS NOT NULL THEN coalesce(st.own_concurrency, d.concurrency) END,
    d.lease_ms,
    {{schema}}.throttle_cost(coalesce(st.own_rate_limit, d.rate_limit), coalesce(st.own_per_ms, d.per_ms)),
    d.paused_until,
    st.incarnation, st.last_start, st.every_from, st.tat, st.last_end, st.last_outcome, st.last_error,
    st.last_permit, coalesce(st.starts, 0), st.decided_at, st.swept_until, st.paused_until,
    st.own_every_ms, st.own_rate_limit, st.own_per_ms, st.own_concurrency,
    locked, false, NULL, coalesce(st.live_units, 0), NULL, NULL, NULL, false)::{{schema}}.throttle_key;
END $$;

-- 0017's: live units count permits, so a grant without one adds none (a throttle redefined
-- with permits later starts from the units of its permits).
CREATE OR REPLACE FUNCTION {{schema}}.throttle_after(k {{schema}}.throttle_key, n bigint, units bigint)
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
    IF k.lease_ms IS NOT NULL THEN
      k.live := k.live + units;
    END IF;
    k.earliest := least(k.earliest, k.c + k.lease_ms * interval '1 millisecond');
    k.changed := true;
  END IF;
  RETURN k;
END $$;

-- 0036's, writing permit rows only for items of throttles with a lease.
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
     WHERE v.ok AND (v.k).lease_ms IS NOT NULL
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

