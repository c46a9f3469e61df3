-- ordo 0010: throttles that real workloads need, decided by functions a person can read.
--
-- * Several limits at once: a request is a set of items (throttle, key, cost), granted only if
--   every item grants, in one statement. One permit id covers them all (a permits row per
--   item, sharing the id), so complete / fail / extend end or renew every item together.
-- * Costs: an item of cost n takes n tokens of a bucket and n units of a concurrency limit.
-- * Per-key limits: a key's own every / limit / per / concurrency replace the throttle's.
-- * Pauses: a throttle, or one key of it, holds every request until a time (reason 'paused');
--   a permit failed with a hold pauses its keys, as a downstream 429 with Retry-After asks.
-- * Waiting in line: a request may wait (throttle_wait) instead of being refused. Waiters that
--   ask the same throttles and keys form a lane, served in arrival order; lanes that share a
--   limit are served round-robin (the lane served least recently first). A line is served
--   (throttle_serve) by whoever has a reason to: a new waiter, a waiter's timer, a process
--   told that a permit ended. Grants are made on the waiter's behalf and announced by NOTIFY.
--   A request that does not wait is refused (reason 'queued') while a live waiter asks for
--   any of its keys, so a poller never jumps the line.
--
-- The decision of 0004 kept its state in some 48 parallel arrays. Here each key of a decision
-- is one value of the composite type throttle_key, and the decision is four named steps:
-- throttle_lock (lock what no one holds, refuse from a snapshot what is refused anyway, wait
-- for the rest in order), throttle_fold (what ended since the last decision), the decision in
-- request order (throttle_verdict per item), and the write-back. Same guarantees and lock
-- order as 0004: decisions on a key are serialized under its row lock on the database clock,
-- and ending a permit touches only its own rows.

ALTER TABLE {{schema}}.throttles ADD COLUMN paused_until timestamptz;

ALTER TABLE {{schema}}.throttle_state
  ADD COLUMN paused_until    timestamptz,
  ADD COLUMN own_every_ms    bigint  CHECK (own_every_ms BETWEEN 1 AND 31536000000),
  ADD COLUMN own_rate_limit  integer CHECK (own_rate_limit BETWEEN 1 AND 1000000),
  ADD COLUMN own_per_ms      bigint  CHECK (own_per_ms BETWEEN 1 AND 31536000000),
  ADD COLUMN own_concurrency integer CHECK (own_concurrency BETWEEN 1 AND 1000000);

ALTER TABLE {{schema}}.permits
  ADD COLUMN cost integer NOT NULL DEFAULT 1 CHECK (cost BETWEEN 1 AND 1000000),
  -- fail(…, hold): the next decision on the key pauses it until then.
  ADD COLUMN hold_until timestamptz,
  DROP CONSTRAINT permits_pkey,
  ADD PRIMARY KEY (id, name, key);
-- Keys with something to apply under their lock (a refund, a hold): a decision on them always
-- takes the lock, even when a snapshot refuses.
DROP INDEX {{schema}}.permits_refunds;
CREATE INDEX permits_to_fold ON {{schema}}.permits (name, key) WHERE refund OR hold_until IS NOT NULL;

-- Requests waiting in line. A waiter is alive while its process renews alive_until (a process
-- killed leaves the line when it lapses); served, it holds the permit until its process picks
-- it up. last_*: the answer it got when it last was at the head of its lane.
CREATE TABLE {{schema}}.throttle_waiters (
  id              uuid PRIMARY KEY,
  seq             bigint GENERATED ALWAYS AS IDENTITY,
  lane            text NOT NULL,
  names           text[] NOT NULL,
  keys            text[] NOT NULL,
  costs           integer[] NOT NULL,
  holder          text,
  enqueued_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
  alive_until     timestamptz NOT NULL,
  permit_id       uuid,
  permit_holder   text,
  acquired_at     timestamptz,
  expires_at      timestamptz,
  last_wait_ms    bigint,
  last_reason     text,
  last_name       text,
  last_key        text
);
-- The lines a waiter stands in: one per (throttle, key) it asks for.
CREATE TABLE {{schema}}.throttle_waiter_items (
  name    text NOT NULL,
  key     text NOT NULL,
  waiter  uuid NOT NULL REFERENCES {{schema}}.throttle_waiters (id) ON DELETE CASCADE,
  PRIMARY KEY (name, key, waiter)
);
CREATE INDEX throttle_waiter_items_waiter ON {{schema}}.throttle_waiter_items (waiter);
-- When each lane was last served: the lane served least recently goes first.
CREATE TABLE {{schema}}.throttle_lanes (
  lane       text PRIMARY KEY,
  served_at  timestamptz NOT NULL
);

-- One key of a decision: its definition (the key's own limits over the throttle's), its state
-- as it will be written back, and what this decision found.
CREATE TYPE {{schema}}.throttle_key AS (
  name            text,
  key             text,
  incarnation     bigint,
  every_ms        bigint,
  rate_limit      integer,
  per_ms          bigint,
  concurrency     integer,
  lease_ms        bigint,
  unit            interval,      -- a token's emission interval
  throttle_paused timestamptz,
  -- throttle_state's columns
  state_incarnation bigint,
  last_start      timestamptz,
  every_from      timestamptz,
  tat             timestamptz,
  last_end        timestamptz,
  last_outcome    text,
  last_error      text,
  last_permit     uuid,
  starts          bigint,
  decided_at      timestamptz,
  swept_until     timestamptz,
  paused_until    timestamptz,
  own_every_ms    bigint,
  own_rate_limit  integer,
  own_per_ms      bigint,
  own_concurrency integer,
  -- this decision
  locked          boolean,
  to_fold         boolean,       -- a refund or a hold waits in its permits
  c               timestamptz,   -- the clock the key is decided at
  live            bigint,        -- units of live permits
  earliest        timestamptz,   -- the first live lease to run out
  wait            interval,      -- refused from a snapshot: how long, and why
  reason          text,
  changed         boolean
);

-- A key as a decision sees it, from its definition and state rows (st null: a new key).
CREATE FUNCTION {{schema}}.throttle_key_of(d {{schema}}.throttles, st {{schema}}.throttle_state,
                                           key_name text, locked boolean)
RETURNS {{schema}}.throttle_key
LANGUAGE sql IMMUTABLE AS $$
  SELECT ROW(
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
    locked, false, NULL, 0, NULL, NULL, NULL, false)::{{schema}}.throttle_key
$$;

-- Whether `units` more may start on key k at its clock. Allowed when `reason` is null;
-- otherwise `wait` is how long until every rate policy and pause would allow, and `reason`
-- names the one that waits longest. A concurrency refusal cannot know when a running permit
-- will end, so its wait is the time to the first lease running out, at most 100 ms.
CREATE FUNCTION {{schema}}.throttle_verdict(k {{schema}}.throttle_key, units integer,
                                            OUT wait interval, OUT reason text, OUT new_tat timestamptz)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  w interval;
BEGIN
  wait := interval '0';
  w := greatest(k.paused_until, k.throttle_paused) - k.c;
  IF w > wait THEN
    wait := w; reason := 'paused';
  END IF;
  IF k.every_ms IS NOT NULL AND k.every_from IS NOT NULL THEN
    w := k.every_from + k.every_ms * interval '1 millisecond' - k.c;
    IF w > wait THEN
      wait := w; reason := 'every';
    END IF;
  END IF;
  IF k.unit IS NOT NULL THEN
    new_tat := greatest(k.tat, k.c) + k.unit * units;
    w := new_tat - k.unit * k.rate_limit - k.c;
    IF w > wait THEN
      wait := w; reason := 'rate';
    END IF;
  END IF;
  IF k.concurrency IS NOT NULL AND k.live + units > k.concurrency THEN
    w := least(k.earliest - k.c, interval '100 milliseconds');
    IF reason IS NULL OR w > wait THEN
      wait := greatest(w, wait); reason := 'concurrency';
    END IF;
  END IF;
END $$;

-- Step 1. The keys (distinct, in (throttle, key) order), with the definition of each:
--   * rows no one holds are locked at once (SKIP LOCKED: no waiting, so no order to keep);
--   * the others (held, or new) are read from a snapshot, and those it already refuses for
--     `units` (the smallest cost asked of the key) are answered without waiting: grants only
--     tighten a key, and what loosens it (an end) was seen or commits after this decision. A
--     key with a refund or hold to fold goes on to the lock;
--   * the rest are created if new and locked in order, so two decisions never deadlock on them.
-- The clock is read after every lock: a decision the previous holder committed is never later.
CREATE FUNCTION {{schema}}.throttle_lock(names text[], keys text[], units integer[])
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
  waiting integer[] := '{}';
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
        CONTINUE;
      END IF;
    END IF;
    waiting := waiting || r.g;
  END LOOP;
  IF cardinality(waiting) > 0 THEN
    INSERT INTO {{schema}}.throttle_state AS st (name, key, incarnation)
    SELECT names[u.g], keys[u.g], ks[u.g].incarnation FROM unnest(waiting) AS u(g) ORDER BY 1, 2
    ON CONFLICT DO NOTHING;
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

-- Step 2. For each locked key, at a clock read after every lock: a state left by a removed
-- incarnation starts afresh; what ended since the last decision is folded in (completed and
-- failed permits deleted, expired ones a day after their end; refunds give back what they
-- consumed, newest first; holds pause the key); leases that ran out are marked expired (which
-- locks them, so an extend racing with this either committed first or finds them expired);
-- and the live units are counted.
CREATE FUNCTION {{schema}}.throttle_fold(ks {{schema}}.throttle_key[])
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
    SELECT u.g, sum(p.cost) AS live, min(p.expires_at) AS earliest
      FROM unnest(locked) AS u(g)
      JOIN {{schema}}.permits AS p
        ON p.name = (ks[u.g]).name AND p.key = (ks[u.g]).key AND p.ended_at IS NULL AND p.expires_at > (ks[u.g]).c
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

-- Decisions for many requests in one call. Item i belongs to request req[i] (items of one
-- request are adjacent, requests in ascending order) and asks `costs[i]` units of throttle
-- names[i] for key keys[i]; a request is granted only if all its items are, with one permit
-- id for all of them. Requests are decided in order, so on one key the earlier comes first.
-- One row per request: granted with the permit, or refused with how long to wait, why, and
-- which throttle and key waits longest. Inside a caller's transaction the keys' row locks
-- are held until it ends; callers bound the wait with lock_timeout, as throttle_batch does.
-- line_first: a request on a key that live waiters ask for is refused ('queued'); the line's
-- own service (throttle_serve) passes false.
CREATE FUNCTION {{schema}}.acquire_all(req integer[], names text[], keys text[], costs integer[], holders text[],
                                       line_first boolean DEFAULT true)
RETURNS TABLE (request integer, granted boolean, permit_id uuid, holder text, acquired_at timestamptz,
               expires_at timestamptz, retry_after_ms bigint, reason text, limit_name text, limit_key text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  n integer := cardinality(req);
  ks {{schema}}.throttle_key[];
  k {{schema}}.throttle_key;
  item_key integer[];        -- each item's place in ks
  g_names text[];
  g_keys text[];
  g_units integer[];
  default_holder text;
  lo integer := 1;
  hi integer;
  i integer;
  v record;
  v_wait interval[];
  v_reason text[];
  v_tat timestamptz[];
  worst integer;
  queued boolean[];          -- per distinct key: live waiters stand in its line
  id uuid;
  c timestamptz;
  until timestamptz;
  p_id uuid[] := '{}';
  p_key integer[] := '{}';
  p_holder text[] := '{}';
  p_cost integer[] := '{}';
  p_at timestamptz[] := '{}';
  p_every_before timestamptz[] := '{}';
  p_rate_cost interval[] := '{}';
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
  default_holder := coalesce(nullif(current_setting('application_name'), ''), 'sql') || ':' || pg_backend_pid();

  -- The distinct keys in lock order, each with the smallest cost asked of it; each item's key.
  SELECT array_agg(x.n ORDER BY x.n, x.k), array_agg(x.k ORDER BY x.n, x.k), array_agg(x.u ORDER BY x.n, x.k)
    INTO g_names, g_keys, g_units
    FROM (SELECT u.n, u.k, min(u.c) AS u FROM unnest(names, keys, costs) AS u(n, k, c) GROUP BY u.n, u.k) AS x;
  SELECT array_agg(x.g ORDER BY x.i) INTO item_key
    FROM (SELECT u.i, dense_rank() OVER (ORDER BY u.n, u.k)::integer AS g
            FROM unnest(names, keys) WITH ORDINALITY AS u(n, k, i)) AS x;

  ks := {{schema}}.throttle_fold({{schema}}.throttle_lock(g_names, g_keys, g_units));
  -- The table is empty unless someone waits: then nothing more is read.
  IF line_first AND EXISTS (SELECT 1 FROM {{schema}}.throttle_waiter_items) THEN
    queued := {{schema}}.throttle_queued(g_names, g_keys);
  END IF;

  -- Step 3: each request in order, all its items or none.
  WHILE lo <= n LOOP
    hi := lo;
    WHILE hi < n AND req[hi + 1] = req[lo] LOOP
      hi := hi + 1;
    END LOOP;
    worst := NULL;
    FOR i IN lo..hi LOOP
      k := ks[item_key[i]];
      IF k.reason IS NOT NULL THEN
        v_wait[i] := k.wait; v_reason[i] := k.reason; v_tat[i] := NULL;
      ELSE
        IF costs[i] > least(k.concurrency, k.rate_limit) AND line_first THEN
          RAISE EXCEPTION USING ERRCODE = 'OX003',
            MESSAGE = format('A cost of %s can never be granted by the throttle %L for the key %L: its limit is %s',
                             costs[i], k.name, k.key, least(k.concurrency, k.rate_limit));
        ELSIF costs[i] > least(k.concurrency, k.rate_limit) THEN
          -- A waiter whose key's limit was lowered below its cost since it came: it waits on
          -- (until it gives up) rather than failing the service of everyone else's line.
          v_wait[i] := interval '1 second'; v_reason[i] := CASE WHEN costs[i] > k.concurrency THEN 'concurrency' ELSE 'rate' END;
          v_tat[i] := NULL;
        ELSE
          v := {{schema}}.throttle_verdict(k, costs[i]);
          v_wait[i] := v.wait; v_reason[i] := v.reason; v_tat[i] := v.new_tat;
        END IF;
      END IF;
      IF v_reason[i] IS NULL AND queued[item_key[i]] THEN
        -- Free, but others wait for it: the line is served first (poll again shortly, or wait).
        v_wait[i] := interval '50 milliseconds'; v_reason[i] := 'queued';
      END IF;
      IF v_reason[i] IS NOT NULL AND (worst IS NULL OR v_wait[i] > v_wait[worst]) THEN
        worst := i;
      END IF;
    END LOOP;

    request := req[lo];
    IF worst IS NULL THEN
      id := gen_random_uuid();
      holder := coalesce(holders[lo], default_holder);
      expires_at := NULL;
      FOR i IN lo..hi LOOP
        k := ks[item_key[i]];
        until := k.c + k.lease_ms * interval '1 millisecond';
        p_id := p_id || id; p_key := p_key || item_key[i]; p_holder := p_holder || holder;
        p_cost := p_cost || costs[i]; p_at := p_at || k.c; p_every_before := p_every_before || k.every_from;
        p_rate_cost := p_rate_cost || (k.unit * costs[i]);
        k.last_start := k.c; k.every_from := k.c; k.tat := coalesce(v_tat[i], k.tat);
        k.starts := k.starts + 1;
        k.live := k.live + costs[i];
        k.earliest := least(k.earliest, until);
        k.changed := true;
        ks[item_key[i]] := k;
        expires_at := least(expires_at, until);
      END LOOP;
      granted := true; permit_id := id; acquired_at := (ks[item_key[lo]]).c;
      retry_after_ms := 0; reason := NULL; limit_name := NULL; limit_key := NULL;
    ELSE
      granted := false; permit_id := NULL; holder := NULL; acquired_at := NULL; expires_at := NULL;
      retry_after_ms := {{schema}}.throttle_ms(v_wait[worst]);
      reason := v_reason[worst];
      limit_name := names[worst]; limit_key := keys[worst];
    END IF;
    RETURN NEXT;
    lo := hi + 1;
  END LOOP;

  -- Step 4: the permits granted, and the keys' new state.
  IF cardinality(p_id) > 0 THEN
    INSERT INTO {{schema}}.permits AS p
      (id, name, key, incarnation, holder, acquired_at, expires_at, every_before, rate_cost, cost)
    SELECT u.id, (ks[u.g]).name, (ks[u.g]).key, (ks[u.g]).incarnation, u.h, u.a,
           u.a + (ks[u.g]).lease_ms * interval '1 millisecond', u.b, u.rc, u.cost
      FROM unnest(p_id, p_key, p_holder, p_at, p_every_before, p_rate_cost, p_cost) AS u(id, g, h, a, b, rc, cost);
  END IF;
  UPDATE {{schema}}.throttle_state AS st
     SET incarnation = x.state_incarnation, last_start = x.last_start, every_from = x.every_from, tat = x.tat,
         last_end = x.last_end, last_outcome = x.last_outcome, last_error = x.last_error,
         last_permit = x.last_permit, starts = x.starts, decided_at = x.c, swept_until = x.c,
         paused_until = x.paused_until, own_every_ms = x.own_every_ms, own_rate_limit = x.own_rate_limit,
         own_per_ms = x.own_per_ms, own_concurrency = x.own_concurrency
    FROM unnest(ks) AS x
   WHERE x.changed AND st.name = x.name AND st.key = x.key;
END $$;

-- 0004's entry points, now requests of one item of cost 1.
DROP FUNCTION {{schema}}.throttle_batch(uuid[], text[], text[], text[]);
DROP FUNCTION {{schema}}.try_acquire(text, text, text);
DROP FUNCTION {{schema}}.try_acquire_many(text[], text[], text[]);
DROP FUNCTION {{schema}}.throttle_verdict(bigint, interval, integer, integer, timestamptz, timestamptz,
                                          timestamptz, bigint, timestamptz);

CREATE FUNCTION {{schema}}.try_acquire_many(names text[], keys text[], holders text[])
RETURNS TABLE (request integer, granted boolean, permit_id uuid, holder text, acquired_at timestamptz,
               expires_at timestamptz, retry_after_ms bigint, reason text)
LANGUAGE sql VOLATILE AS $$
  SELECT a.request, a.granted, a.permit_id, a.holder, a.acquired_at, a.expires_at, a.retry_after_ms, a.reason
    FROM {{schema}}.acquire_all(ARRAY(SELECT generate_series(1, cardinality(names))), names, keys,
                                array_fill(1, ARRAY[cardinality(names)]), holders) AS a
$$;

-- One decision: (throttle, key) with a cost (default 1). holder NULL: application_name:pid.
CREATE FUNCTION {{schema}}.try_acquire(throttle_name text, throttle_key text DEFAULT '', permit_holder text DEFAULT NULL,
                                       cost integer DEFAULT 1)
RETURNS TABLE (granted boolean, permit_id uuid, holder text, acquired_at timestamptz, expires_at timestamptz,
               retry_after_ms bigint, reason text)
LANGUAGE sql VOLATILE AS $$
  SELECT a.granted, a.permit_id, a.holder, a.acquired_at, a.expires_at, a.retry_after_ms, a.reason
    FROM {{schema}}.acquire_all(ARRAY[1], ARRAY[throttle_name], ARRAY[throttle_key], ARRAY[cost],
                                ARRAY[permit_holder]) AS a
$$;

-- Completes permits and decides requests in one call (one round trip and one commit for a
-- client's queued calls of both kinds); the ends come first, so the decisions see them. Rows
-- with a request number answer a decision; rows without one are the permits completed. Like
-- every shared statement (take_many too: src/db/batcher.ts, BATCH_LOCK_WAIT_MS), it waits at
-- most 50 ms for a row lock and then fails with lock_not_available: the client serves its
-- calls alone instead, so that a key held by a caller's transaction does not hold up the others.
CREATE FUNCTION {{schema}}.throttle_batch(complete_ids uuid[], req integer[], names text[], keys text[],
                                          costs integer[], holders text[])
RETURNS TABLE (request integer, permit_id uuid, granted boolean, holder text, acquired_at timestamptz,
               expires_at timestamptz, retry_after_ms bigint, reason text, limit_name text, limit_key text,
               name text, key text, ended_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET lock_timeout = '50ms'
AS $$
BEGIN
  IF cardinality(complete_ids) > 0 THEN
    RETURN QUERY
      SELECT NULL::integer, e.id, NULL::boolean, NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::bigint,
             NULL::text, NULL::text, NULL::text, e.name, e.key, e.ended_at
        FROM {{schema}}.complete_permits(complete_ids) AS e;
  END IF;
  IF cardinality(req) > 0 THEN
    RETURN QUERY
      SELECT a.request, a.permit_id, a.granted, a.holder, a.acquired_at, a.expires_at, a.retry_after_ms, a.reason,
             a.limit_name, a.limit_key, NULL::text, NULL::text, NULL::timestamptz
        FROM {{schema}}.acquire_all(req, names, keys, costs, holders) AS a;
  END IF;
END $$;

-- Ending and renewing, for permits of several items: each function acts on every item of the
-- permit and answers one row per permit.
CREATE OR REPLACE FUNCTION {{schema}}.complete_permits(ids uuid[])
RETURNS TABLE (id uuid, name text, key text, outcome text, ended_at timestamptz, refunded boolean)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
  c timestamptz := clock_timestamp();
BEGIN
  RETURN QUERY
    WITH ended AS (
      UPDATE {{schema}}.permits AS p SET ended_at = greatest(c, p.acquired_at), outcome = 'completed'
       WHERE p.id = ANY (ids) AND p.ended_at IS NULL AND p.expires_at > c
      RETURNING p.id, p.name, p.key, p.ended_at)
    SELECT DISTINCT ON (e.id) e.id, e.name, e.key, 'completed'::text, e.ended_at, false FROM ended AS e
     ORDER BY e.id, e.name, e.key;
  PERFORM {{schema}}.throttle_freed_by(ids);
END $$;

CREATE OR REPLACE FUNCTION {{schema}}.complete_permit(permit_id uuid)
RETURNS TABLE (id uuid, name text, key text, outcome text, ended_at timestamptz, refunded boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY SELECT * FROM {{schema}}.complete_permits(ARRAY[permit_id]);
  IF NOT FOUND THEN
    PERFORM {{schema}}.permit_gone(permit_id, clock_timestamp());
  END IF;
END $$;

-- Ends a live permit as failed, with an error text. give_back: return what the permit consumed
-- (its `every` start, its tokens) so that a retry may start at once; NULL: the throttle's
-- refund_on_failure. hold_ms: pause the permit's keys that long (a downstream 429's
-- Retry-After). The next decision on each key applies both.
DROP FUNCTION {{schema}}.fail_permit(uuid, text, boolean);
CREATE FUNCTION {{schema}}.fail_permit(permit_id uuid, error_text text DEFAULT NULL, give_back boolean DEFAULT NULL,
                                       hold_ms bigint DEFAULT NULL)
RETURNS TABLE (id uuid, name text, key text, outcome text, ended_at timestamptz, refunded boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  c timestamptz := clock_timestamp();
BEGIN
  IF hold_ms IS NOT NULL AND hold_ms NOT BETWEEN 1 AND 31536000000 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('A hold is 1 ms to a year (got %s ms)', hold_ms);
  END IF;
  RETURN QUERY
    WITH ended AS (
      UPDATE {{schema}}.permits AS p
         SET ended_at = greatest(c, p.acquired_at), outcome = 'failed', error = left(error_text, 2000),
             refund = coalesce(give_back,
                               (SELECT d.refund_on_failure FROM {{schema}}.throttles AS d WHERE d.name = p.name), false),
             hold_until = c + hold_ms * interval '1 millisecond'
       WHERE p.id = permit_id AND p.ended_at IS NULL AND p.expires_at > c
      RETURNING p.id, p.name, p.key, p.ended_at, p.refund)
    SELECT DISTINCT ON (e.id) e.id, e.name, e.key, 'failed'::text, e.ended_at, e.refund FROM ended AS e
     ORDER BY e.id, e.name, e.key;
  IF FOUND THEN
    PERFORM {{schema}}.throttle_freed_by(ARRAY[permit_id]);
  ELSE
    PERFORM {{schema}}.permit_gone(permit_id, c);
  END IF;
END $$;

-- Renews a live permit's lease: each item's expires_at = clock + its throttle's lease (never
-- earlier than it was). Returns the earliest new expires_at.
CREATE OR REPLACE FUNCTION {{schema}}.extend_permit(permit_id uuid) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  c timestamptz := clock_timestamp();
  until timestamptz;
BEGIN
  WITH renewed AS (
    UPDATE {{schema}}.permits AS p
       SET expires_at = greatest(p.expires_at, c + d.lease_ms * interval '1 millisecond')
      FROM {{schema}}.throttles AS d
     WHERE d.name = p.name AND d.incarnation = p.incarnation
       AND p.id = permit_id AND p.ended_at IS NULL AND p.expires_at > c
    RETURNING p.expires_at)
  SELECT min(r.expires_at) INTO until FROM renewed AS r;
  IF until IS NULL THEN
    PERFORM {{schema}}.permit_gone(permit_id, c);
  END IF;
  RETURN until;
END $$;

-- A key's own limits (null: the throttle's), for tiers such as a premium tenant. Returns the
-- limits the key now has. Decisions on the key use them from the next one on.
CREATE FUNCTION {{schema}}.set_key_limits(throttle_name text, throttle_key text, new_every_ms bigint,
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
  IF (coalesce(new_rate_limit, d.rate_limit) IS NULL) <> (coalesce(new_per_ms, d.per_ms) IS NULL) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = format('limit and per go together: the throttle %L has no rate limit, so give both', throttle_name);
  END IF;
  -- Out of range values fail the table's CHECKs (invalid_argument).
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

-- Holds a throttle (key null) or one of its keys until `until` (null: no longer held): every
-- request is refused with reason 'paused' meanwhile. Returns whether anything changed.
CREATE FUNCTION {{schema}}.pause_throttle(throttle_name text, throttle_key text, until timestamptz)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  d {{schema}}.throttles;
BEGIN
  IF throttle_key IS NULL THEN
    UPDATE {{schema}}.throttles AS t SET paused_until = until WHERE t.name = throttle_name;
    IF NOT FOUND THEN
      RAISE EXCEPTION USING ERRCODE = 'OX005', MESSAGE = format('The throttle %L does not exist', throttle_name);
    END IF;
    PERFORM {{schema}}.throttle_freed(ARRAY[throttle_name]);
    RETURN true;
  END IF;
  SELECT * INTO d FROM {{schema}}.throttles AS t WHERE t.name = throttle_name FOR KEY SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX005', MESSAGE = format('The throttle %L does not exist', throttle_name);
  END IF;
  IF length(throttle_key) > 200 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = 'A key is a text of at most 200 characters';
  END IF;
  INSERT INTO {{schema}}.throttle_state AS st (name, key, incarnation, paused_until)
  VALUES (throttle_name, throttle_key, d.incarnation, until)
  ON CONFLICT (name, key) DO UPDATE SET paused_until = EXCLUDED.paused_until;
  PERFORM {{schema}}.throttle_freed(ARRAY[throttle_name]);
  RETURN true;
END $$;

-- Whether live waiters stand in each line of (names[i], keys[i]) (one probe each; the table is
-- empty unless someone waits).
CREATE FUNCTION {{schema}}.throttle_queued(names text[], keys text[]) RETURNS boolean[]
LANGUAGE sql STABLE AS $$
  SELECT array_agg(EXISTS (
           SELECT 1 FROM {{schema}}.throttle_waiter_items AS i
             JOIN {{schema}}.throttle_waiters AS w ON w.id = i.waiter
            WHERE i.name = x.n AND i.key = x.k AND w.permit_id IS NULL AND w.alive_until >= clock_timestamp())
         ORDER BY x.i)
    FROM unnest(names, keys) WITH ORDINALITY AS x(n, k, i)
$$;

-- Serves the lines of (line_names[i], line_keys[i]): in rounds, the first live waiter of each
-- lane standing in them, lanes served least recently first, decided together as requests in
-- that order (acquire_all, under the keys' locks). A round that grants nothing ends the
-- service: every lane's first waiter was refused, so those behind it wait too (arrival order
-- within a lane). Each grant is announced ('granted:<waiter>'); next_ms is the shortest wait a
-- refused first waiter was given, when the line should be served again if nothing ends sooner.
-- Waiters being served by another call (their rows locked) are left to it.
CREATE FUNCTION {{schema}}.throttle_serve(line_names text[], line_keys text[], OUT granted integer, OUT next_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  heads uuid[];
  rounds integer := 0;
  round_grants integer;
  r record;
  f_req integer[]; f_names text[]; f_keys text[]; f_costs integer[]; f_holders text[];
BEGIN
  granted := 0;
  DELETE FROM {{schema}}.throttle_waiters AS w
   USING unnest(line_names, line_keys) AS l(n, k), {{schema}}.throttle_waiter_items AS i
   WHERE i.name = l.n AND i.key = l.k AND i.waiter = w.id AND w.permit_id IS NULL
     AND w.alive_until < clock_timestamp();
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

-- The checks of a request's items that do not depend on the moment: every throttle exists,
-- no (throttle, key) twice, texts within bounds, and no cost beyond the key's limits.
CREATE FUNCTION {{schema}}.throttle_check_items(names text[], keys text[], costs integer[], holder text)
RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
  r record;
BEGIN
  IF array_position(names, NULL) IS NOT NULL OR array_position(keys, NULL) IS NOT NULL
     OR array_position(costs, NULL) IS NOT NULL OR length(holder) > 200
     OR EXISTS (SELECT 1 FROM unnest(keys, costs) AS u(k, c) WHERE length(u.k) > 200 OR u.c NOT BETWEEN 1 AND 1000000) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = 'Each item needs a throttle name, a key (a text of at most 200 characters) and a cost from 1 to 1000000; a holder is at most 200 characters';
  END IF;
  IF EXISTS (SELECT 1 FROM unnest(names, keys) AS u(n, k) GROUP BY u.n, u.k HAVING count(*) > 1) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = 'A request names each throttle and key at most once';
  END IF;
  FOR r IN
    SELECT x.n, x.k, x.c, d.name AS found, k.concurrency, k.rate_limit
      FROM unnest(names, keys, costs) AS x(n, k, c)
      LEFT JOIN {{schema}}.throttles AS d ON d.name = x.n
      LEFT JOIN {{schema}}.throttle_state AS st ON st.name = x.n AND st.key = x.k AND st.incarnation = d.incarnation
      LEFT JOIN LATERAL (SELECT (q).concurrency, (q).rate_limit
                           FROM (SELECT {{schema}}.throttle_key_of(d, st, x.k, false) AS q) AS z) AS k ON true
  LOOP
    IF r.found IS NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'OX005', MESSAGE = format('The throttle %L does not exist', r.n);
    END IF;
    IF r.c > least(r.concurrency, r.rate_limit) THEN
      RAISE EXCEPTION USING ERRCODE = 'OX003',
        MESSAGE = format('A cost of %s can never be granted by the throttle %L for the key %L: its limit is %s',
                         r.c, r.n, r.k, least(r.concurrency, r.rate_limit));
    END IF;
  END LOOP;
END $$;

-- A request waiting in line: enqueued (or, called again, renewed for alive_ms), its lines
-- served, then its answer: granted with the permit (it leaves the line), or not yet, with the
-- wait and reason it was last given ('queued' while others are ahead of it in its lane), and
-- when the line is next worth serving. Same items as acquire_all's; a bad item raises, and
-- nothing is enqueued.
CREATE FUNCTION {{schema}}.throttle_wait(waiter uuid, names text[], keys text[], costs integer[], waiter_holder text,
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

-- A waiter leaves the line (it gave up): its permit, if it was served meanwhile, is returned
-- so that the caller may use it (or end it).
CREATE FUNCTION {{schema}}.throttle_leave(waiter uuid)
RETURNS TABLE (permit_id uuid, holder text, acquired_at timestamptz, expires_at timestamptz)
LANGUAGE sql VOLATILE AS $$
  DELETE FROM {{schema}}.throttle_waiters AS w WHERE w.id = waiter
  RETURNING w.permit_id, w.permit_holder, w.acquired_at, w.expires_at
$$;

-- A process's waiters are still there: renewed for alive_ms. Answers those served meanwhile.
CREATE FUNCTION {{schema}}.throttle_keep_waiting(waiters uuid[], alive_ms bigint)
RETURNS TABLE (waiter uuid, served boolean)
LANGUAGE sql VOLATILE AS $$
  UPDATE {{schema}}.throttle_waiters AS w SET alive_until = clock_timestamp() + alive_ms * interval '1 millisecond'
   WHERE w.id = ANY (waiters)
  RETURNING w.id, w.permit_id IS NOT NULL
$$;

-- What ends or loosens a throttle wakes those waiting on it: one NOTIFY per statement, only
-- when someone waits (NOTIFY serializes commits: the hot path without waiters never sends it).
CREATE FUNCTION {{schema}}.throttle_freed(throttle_names text[]) RETURNS void
LANGUAGE sql VOLATILE AS $$
  SELECT pg_notify('ordo_throttles.{{schema_name}}', 'freed:' || x.n)
    FROM (SELECT DISTINCT u.n FROM unnest(throttle_names) AS u(n)) AS x
   WHERE EXISTS (SELECT 1 FROM {{schema}}.throttle_waiter_items AS i WHERE i.name = x.n)
$$;

-- The throttles of ended permits wake their waiters; nothing at all is read when no one waits.
CREATE FUNCTION {{schema}}.throttle_freed_by(permit_ids uuid[]) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM {{schema}}.throttle_waiter_items) THEN
    PERFORM {{schema}}.throttle_freed(ARRAY(SELECT DISTINCT p.name FROM {{schema}}.permits AS p WHERE p.id = ANY (permit_ids)));
  END IF;
END $$;

-- A removed throttle's waiters leave its lines (their next call finds it gone).
CREATE OR REPLACE FUNCTION {{schema}}.remove_throttle(throttle_name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  removed boolean;
BEGIN
  DELETE FROM {{schema}}.throttles AS d WHERE d.name = throttle_name;
  removed := FOUND;
  DELETE FROM {{schema}}.throttle_state AS s WHERE s.name = throttle_name;
  DELETE FROM {{schema}}.permits AS p WHERE p.name = throttle_name;
  DELETE FROM {{schema}}.throttle_waiters AS w
   WHERE w.id IN (SELECT i.waiter FROM {{schema}}.throttle_waiter_items AS i WHERE i.name = throttle_name);
  PERFORM pg_notify('ordo_throttles.{{schema_name}}', 'freed:' || throttle_name);
  RETURN removed;
END $$;

-- maintain() also clears what waiting leaves behind: waiters whose process stopped renewing
-- them a minute ago (nobody served their line since), and lanes not served for a day.
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
  DELETE FROM {{schema}}.permits WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {{schema}}.permits
     WHERE ended_at < now() - interval '1 day' AND NOT refund LIMIT 10000));
  GET DIAGNOSTICS n = ROW_COUNT;
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

-- A key's state with its own limits and pause, and how many wait in its line.
CREATE FUNCTION {{schema}}.throttle_key_state(throttle_name text, throttle_key text)
RETURNS TABLE (name text, key text, last_start timestamptz, starts bigint, last_end timestamptz, last_outcome text,
               last_error text, last_permit uuid, observed_at timestamptz, own_every_ms bigint,
               own_rate_limit integer, own_per_ms bigint, own_concurrency integer, paused_until timestamptz,
               throttle_paused_until timestamptz, waiting bigint, permits json)
LANGUAGE plpgsql STABLE AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM {{schema}}.throttles AS d WHERE d.name = throttle_name) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX005', MESSAGE = format('The throttle %L does not exist', throttle_name);
  END IF;
  RETURN QUERY
  SELECT throttle_name, throttle_key, st.last_start, st.starts, st.last_end, st.last_outcome, st.last_error,
         st.last_permit, st.observed_at, o.own_every_ms, o.own_rate_limit, o.own_per_ms, o.own_concurrency,
         CASE WHEN o.paused_until > st.observed_at THEN o.paused_until END,
         CASE WHEN d.paused_until > st.observed_at THEN d.paused_until END,
         (SELECT count(*) FROM {{schema}}.throttle_waiter_items AS i
            JOIN {{schema}}.throttle_waiters AS w ON w.id = i.waiter
           WHERE i.name = throttle_name AND i.key = throttle_key AND w.permit_id IS NULL
             AND w.alive_until >= st.observed_at),
         (SELECT coalesce(json_agg(json_build_object('id', p.id, 'holder', p.holder, 'cost', p.cost,
                   'acquired_at', p.acquired_at, 'expires_at', p.expires_at) ORDER BY p.acquired_at, p.id), '[]')
            FROM {{schema}}.permits AS p
           WHERE p.name = throttle_name AND p.key = throttle_key AND p.incarnation = d.incarnation
             AND p.ended_at IS NULL AND p.expires_at > st.observed_at)
    FROM {{schema}}.throttle_status(throttle_name, throttle_key) AS st
    JOIN {{schema}}.throttles AS d ON d.name = throttle_name
    LEFT JOIN {{schema}}.throttle_state AS o
      ON o.name = throttle_name AND o.key = throttle_key AND o.incarnation = d.incarnation;
END $$;

-- The keys of a throttle with a state, the most recently active first.
CREATE FUNCTION {{schema}}.throttle_keys(throttle_name text, max_rows integer)
RETURNS SETOF text
LANGUAGE plpgsql STABLE AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM {{schema}}.throttles AS d WHERE d.name = throttle_name) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX005', MESSAGE = format('The throttle %L does not exist', throttle_name);
  END IF;
  RETURN QUERY
    SELECT st.key FROM {{schema}}.throttle_state AS st
      JOIN {{schema}}.throttles AS d ON d.name = st.name AND d.incarnation = st.incarnation
     WHERE st.name = throttle_name
     ORDER BY greatest(st.decided_at, st.last_start, st.last_end) DESC NULLS LAST, st.key
     LIMIT max_rows;
END $$;
