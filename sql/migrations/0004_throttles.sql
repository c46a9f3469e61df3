-- ordo 0004: throttles. At most one start per interval (`every`), token buckets (GCRA:
-- `rate_limit` per `per_ms`) and concurrency limits per key, with leases that know how each
-- task ended. Every decision is one call of try_acquire(), on the database clock.
-- {{schema}} is replaced by the quoted schema name, {{schema_name}} by the bare name.
-- Custom SQLSTATEs (mapped to OrdoError codes in src/errors.ts):
--   OX003 invalid_argument   OX005 throttle_not_found   OX006 throttle_exists
--   OX007 permit_not_found (unknown, or already completed / failed)   OX008 permit_expired
--
-- How a key's state moves: a decision locks the key's throttle_state row, reads the clock
-- after the lock, folds in what ended since the last decision (permits completed, failed,
-- refunded, or whose lease ran out), decides and, on a grant, inserts the permit. complete /
-- fail / extend touch only the permit's own row, so ending a task never waits behind the
-- decisions on its key; the next decision (or throttle_status) picks the outcome up. When
-- another session holds the key, a decision that a snapshot already refuses takes no lock.

-- A throttle removed and defined again is a new incarnation: rows its previous incarnation
-- may have left behind (a decision racing with the removal) are recognised and never count.
CREATE SEQUENCE {{schema}}.throttle_incarnations AS bigint;

CREATE TABLE {{schema}}.throttles (
  name              text PRIMARY KEY CHECK (name ~ '^[A-Za-z_][A-Za-z0-9_]{0,62}$'),
  -- At most one start per every_ms per key.
  every_ms          bigint CHECK (every_ms BETWEEN 1 AND 31536000000),
  -- A token bucket per key: bursts of rate_limit, refilled at rate_limit per per_ms.
  -- (`limit` is a reserved word in SQL, hence rate_limit.)
  rate_limit        integer CHECK (rate_limit BETWEEN 1 AND 1000000),
  per_ms            bigint CHECK (per_ms BETWEEN 1 AND 31536000000),
  -- At most this many live permits per key.
  concurrency       integer CHECK (concurrency BETWEEN 1 AND 1000000),
  -- A permit not completed, failed or extended within lease_ms is dead.
  lease_ms          bigint NOT NULL DEFAULT 300000 CHECK (lease_ms BETWEEN 1 AND 31536000000),
  -- What fail_permit() does when the caller does not say: give the start back or not.
  refund_on_failure boolean NOT NULL DEFAULT false,
  incarnation       bigint NOT NULL DEFAULT nextval('{{schema}}.throttle_incarnations'),
  created_at        timestamptz NOT NULL DEFAULT now(),
  updated_at        timestamptz NOT NULL DEFAULT now(),
  CHECK ((rate_limit IS NULL) = (per_ms IS NULL)),
  CHECK (every_ms IS NOT NULL OR rate_limit IS NOT NULL OR concurrency IS NOT NULL)
);

-- One row per (throttle, key) ever used. Its row lock serializes the decisions on the key.
-- fillfactor: the row is rewritten by every grant; room on the page keeps those updates HOT.
CREATE TABLE {{schema}}.throttle_state (
  name         text NOT NULL,
  key          text NOT NULL,
  incarnation  bigint NOT NULL,
  -- The last granted start, as shown to users.
  last_start   timestamptz,
  -- The start the `every` interval runs from: last_start, or the one before it after a refund.
  every_from   timestamptz,
  -- GCRA theoretical arrival time: the bucket is full when tat <= now.
  tat          timestamptz,
  -- The permit that ended last (by its end time), and how.
  last_end     timestamptz,
  last_outcome text CHECK (last_outcome IN ('completed', 'failed', 'expired')),
  last_error   text,
  last_permit  uuid,
  starts       bigint NOT NULL DEFAULT 0,
  -- The clock of the last decision that wrote this row: a decision never uses an earlier one.
  decided_at   timestamptz,
  -- Every permit whose lease ran out by then is marked expired: the next decision looks only
  -- at leases that ended after it.
  swept_until  timestamptz,
  PRIMARY KEY (name, key)
) WITH (fillfactor = 70);

-- Live permits, and ended ones until the next decision on their key folds them into
-- throttle_state (completed and failed permits are then deleted; expired ones are kept for a
-- day, so that their holder is told permit_expired rather than permit_not_found).
CREATE TABLE {{schema}}.permits (
  id           uuid PRIMARY KEY,
  name         text NOT NULL,
  key          text NOT NULL,
  incarnation  bigint NOT NULL,
  holder       text NOT NULL,
  acquired_at  timestamptz NOT NULL,
  expires_at   timestamptz NOT NULL,
  ended_at     timestamptz,
  outcome      text CHECK (outcome IN ('completed', 'failed', 'expired')),
  error        text,
  -- fail_permit(…, refund): the next decision gives back what this permit consumed.
  refund       boolean NOT NULL DEFAULT false,
  -- What the grant consumed, so that a refund gives back exactly that: the `every` start it
  -- replaced, and the emission interval its token cost.
  every_before timestamptz,
  rate_cost    interval,
  CHECK ((ended_at IS NULL) = (outcome IS NULL))
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.0, autovacuum_vacuum_threshold = 5000,
        autovacuum_vacuum_insert_scale_factor = 0.0, autovacuum_vacuum_insert_threshold = 5000);
-- A key's permits by expiry: counting the live ones, finding the ended ones and the leases
-- that ran out. ended_at is not indexed (nor in an index predicate), so that complete and fail
-- are HOT updates, which the table's fillfactor leaves room for. Permits come and go quickly:
-- autovacuum visits the table every few thousand of them, whatever its size.
CREATE INDEX permits_by_key ON {{schema}}.permits (name, key, expires_at);
-- Keys with a refund to apply: a decision on them always takes the lock.
CREATE INDEX permits_refunds ON {{schema}}.permits (name, key) WHERE refund;

-- The emission interval of a bucket, in whole microseconds rounded up, so that rate_limit
-- tokens never take less than per_ms.
CREATE FUNCTION {{schema}}.throttle_cost(rate_limit integer, per_ms bigint) RETURNS interval
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN rate_limit IS NOT NULL THEN ceil(per_ms * 1000.0 / rate_limit)::float8 * interval '1 microsecond' END
$$;

-- The decision itself, for a key's state at clock c with `live` permits alive. Allowed when
-- `reason` is NULL; otherwise `wait` is how long until every rate policy (`every`, `rate`)
-- would allow, and `reason` names the policy that waits longest. A concurrency refusal cannot
-- know when a running permit will end (complete may come any moment), so its wait is the time
-- until the earliest live lease runs out, at most 100 ms: a poll interval short enough to
-- start soon after a completion, and cheap, since a refusal takes no lock.
CREATE FUNCTION {{schema}}.throttle_verdict(
  every_ms bigint, cost interval, rate_limit integer, concurrency integer,
  every_from timestamptz, tat timestamptz, c timestamptz, live bigint, earliest_expiry timestamptz,
  OUT wait interval, OUT reason text, OUT new_tat timestamptz)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  w interval;
BEGIN
  wait := interval '0';
  IF every_ms IS NOT NULL AND every_from IS NOT NULL THEN
    w := every_from + every_ms * interval '1 millisecond' - c;
    IF w > wait THEN
      wait := w;
      reason := 'every';
    END IF;
  END IF;
  IF cost IS NOT NULL THEN
    new_tat := greatest(tat, c) + cost;
    w := new_tat - cost * rate_limit - c;
    IF w > wait THEN
      wait := w;
      reason := 'rate';
    END IF;
  END IF;
  IF concurrency IS NOT NULL AND live >= concurrency THEN
    w := least(earliest_expiry - c, interval '100 milliseconds');
    IF reason IS NULL OR w > wait THEN
      wait := greatest(w, wait);
      reason := 'concurrency';
    END IF;
  END IF;
END $$;

-- Whole milliseconds, rounded up: sleeping that long is always enough.
CREATE FUNCTION {{schema}}.throttle_ms(d interval) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
  SELECT ceil(extract(epoch FROM d) * 1000)::bigint
$$;

-- Creates, or with mode 'overwrite' redefines, a throttle. Returns the definition and what
-- happened: 'created', 'exists' (left as it was) or 'overwritten'. A redefinition keeps each
-- key's state and its live permits; the new policy applies from the next decision.
CREATE FUNCTION {{schema}}.define_throttle(
  throttle_name text, new_every_ms bigint, new_rate_limit integer, new_per_ms bigint,
  new_concurrency integer, new_lease_ms bigint, new_refund_on_failure boolean, mode text)
RETURNS TABLE (outcome text, definition {{schema}}.throttles)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  result {{schema}}.throttles;
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
  -- Out of range values fail the table's CHECKs (invalid_argument).
  LOOP
    INSERT INTO {{schema}}.throttles AS d
      (name, every_ms, rate_limit, per_ms, concurrency, lease_ms, refund_on_failure)
    VALUES (throttle_name, new_every_ms, new_rate_limit, new_per_ms, new_concurrency,
            coalesce(new_lease_ms, 300000), coalesce(new_refund_on_failure, false))
    ON CONFLICT (name) DO NOTHING
    RETURNING d.* INTO result;
    IF FOUND THEN
      RETURN QUERY SELECT 'created'::text, result;
      RETURN;
    END IF;
    IF mode = 'overwrite' THEN
      UPDATE {{schema}}.throttles AS d
         SET every_ms = new_every_ms, rate_limit = new_rate_limit, per_ms = new_per_ms,
             concurrency = new_concurrency, lease_ms = coalesce(new_lease_ms, 300000),
             refund_on_failure = coalesce(new_refund_on_failure, false), updated_at = now()
       WHERE d.name = throttle_name
      RETURNING d.* INTO result;
      IF FOUND THEN
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

-- Removes a throttle with every key's state and every permit. A decision that read the
-- definition before the removal committed may still leave a row behind; it belongs to the
-- removed incarnation and is never counted (and is cleared by the next decision on its key).
CREATE FUNCTION {{schema}}.remove_throttle(throttle_name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  removed boolean;
BEGIN
  DELETE FROM {{schema}}.throttles AS d WHERE d.name = throttle_name;
  removed := FOUND;
  DELETE FROM {{schema}}.throttle_state AS s WHERE s.name = throttle_name;
  DELETE FROM {{schema}}.permits AS p WHERE p.name = throttle_name;
  RETURN removed;
END $$;

-- Decisions for many (throttle, key, holder) requests in one call; one row per request:
-- granted with a permit, or refused with how long to wait and why. Requests on the same key
-- are decided in request order; a whole call costs a fixed number of statements however many
-- requests it carries (one lock, one fold, one insert, one update per batch).
--
-- 1. The state rows no one holds are locked at once (SKIP LOCKED: no waiting, so no order
--    to keep).
-- 2. The keys held by someone else (or new) are read from a snapshot, without locks, and
--    those it already refuses (a start or a token taken, the concurrency used up) are answered
--    at once: a refusal read from a snapshot stays right, since grants only tighten a key and
--    what loosens it (an end, a refund) was either seen or commits after this decision. A key
--    with a pending refund goes on to the lock, where the refund is applied. So callers polling
--    a busy key never queue behind its lock.
-- 3. The remaining rows are locked in (throttle, key) order, so that two calls never deadlock.
-- Then the clock is read, after every lock (a decision the previous holder committed is never
-- later than ours), what ended is folded in, the requests are decided in memory, and permits
-- and states are written. Inside a caller's transaction the row locks are held until that
-- transaction ends. A call with many keys holds the locks it has while it waits for the next:
-- callers should bound the wait (lock_timeout), as throttle_batch does.
CREATE FUNCTION {{schema}}.try_acquire_many(names text[], keys text[], holders text[])
RETURNS TABLE (request integer, granted boolean, permit_id uuid, holder text, acquired_at timestamptz,
               expires_at timestamptz, retry_after_ms bigint, reason text)
LANGUAGE plpgsql VOLATILE
-- Every statement here is an index-driven nested loop over a few keys. Planned once per
-- session (custom plans would be made again on every call, since the statements take arrays),
-- and never as a scan of a whole table, whatever the statistics say.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
  n integer := cardinality(names);
  groups integer;
  -- Per group (a distinct throttle and key), in lock order.
  g_name text[];
  g_key text[];
  d_inc bigint[];
  d_every bigint[];
  d_rate integer[];
  d_per bigint[];
  d_conc integer[];
  d_lease bigint[];
  d_cost interval[];
  s_inc bigint[];
  s_last_start timestamptz[];
  s_every timestamptz[];
  s_tat timestamptz[];
  s_last_end timestamptz[];
  s_outcome text[];
  s_error text[];
  s_permit uuid[];
  s_starts bigint[];
  s_decided timestamptz[];
  g_locked boolean[];
  pending integer[] := '{}';
  waiting integer[] := '{}';
  g_live bigint[];
  g_earliest timestamptz[];
  g_c timestamptz[];
  g_wait interval[];
  g_reason text[];
  g_changed boolean[];
  locking integer[] := '{}';
  changed integer[] := '{}';
  resets integer[] := '{}';
  refund_g integer[] := '{}';
  refund_start timestamptz[] := '{}';
  refund_before timestamptz[] := '{}';
  -- Per request, in request order.
  r_group integer[];
  r_holder text[];
  o_granted boolean[];
  o_id uuid[];
  o_acquired timestamptz[];
  o_expires timestamptz[];
  o_retry bigint[];
  o_reason text[];
  -- The permits granted.
  p_id uuid[] := '{}';
  p_group integer[] := '{}';
  p_holder text[] := '{}';
  p_acquired timestamptz[] := '{}';
  p_every_before timestamptz[] := '{}';
  g integer;
  i integer;
  r record;
  v record;
  c timestamptz;
  new_id uuid;
  until timestamptz;
  default_holder text;
  too_long boolean;
  s_swept timestamptz[];
  any_new boolean := false;
  any_limit boolean := false;
BEGIN
  IF n IS NULL OR n = 0 THEN
    RETURN;
  END IF;
  IF cardinality(keys) IS DISTINCT FROM n OR cardinality(holders) IS DISTINCT FROM n
     OR array_position(names, NULL) IS NOT NULL OR array_position(keys, NULL) IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = 'Each request needs a throttle name, a key (a text of at most 200 characters) and a holder of at most 200 characters (null: the session)';
  END IF;
  IF array_position(holders, NULL) IS NOT NULL THEN
    default_holder := coalesce(nullif(current_setting('application_name'), ''), 'sql') || ':' || pg_backend_pid();
  END IF;
  -- The distinct (throttle, key) pairs in lock order, and each request's group.
  IF n = 1 THEN
    g_name := names;
    g_key := keys;
    r_group := '{1}';
    r_holder := ARRAY[coalesce(holders[1], default_holder)];
    too_long := length(keys[1]) > 200 OR length(r_holder[1]) > 200;
  ELSE
    SELECT array_agg(x.g ORDER BY x.i), array_agg(coalesce(x.h, default_holder) ORDER BY x.i),
           array_agg(x.n ORDER BY x.g) FILTER (WHERE x.first), array_agg(x.k ORDER BY x.g) FILTER (WHERE x.first),
           bool_or(length(x.k) > 200 OR length(x.h) > 200)
      INTO r_group, r_holder, g_name, g_key, too_long
      FROM (SELECT u.i, u.n, u.k, u.h, dense_rank() OVER (ORDER BY u.n, u.k)::integer AS g,
                   row_number() OVER (PARTITION BY u.n, u.k ORDER BY u.i) = 1 AS first
              FROM unnest(names, keys, holders) WITH ORDINALITY AS u(n, k, h, i)) AS x;
  END IF;
  IF too_long THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = 'Each request needs a throttle name, a key (a text of at most 200 characters) and a holder of at most 200 characters (null: the session)';
  END IF;
  groups := cardinality(g_name);

  d_inc := array_fill(NULL::bigint, ARRAY[groups]);
  d_every := array_fill(NULL::bigint, ARRAY[groups]);
  d_rate := array_fill(NULL::integer, ARRAY[groups]);
  d_per := array_fill(NULL::bigint, ARRAY[groups]);
  d_conc := array_fill(NULL::integer, ARRAY[groups]);
  d_lease := array_fill(NULL::bigint, ARRAY[groups]);
  d_cost := array_fill(NULL::interval, ARRAY[groups]);
  s_inc := array_fill(NULL::bigint, ARRAY[groups]);
  s_last_start := array_fill(NULL::timestamptz, ARRAY[groups]);
  s_every := array_fill(NULL::timestamptz, ARRAY[groups]);
  s_tat := array_fill(NULL::timestamptz, ARRAY[groups]);
  s_last_end := array_fill(NULL::timestamptz, ARRAY[groups]);
  s_outcome := array_fill(NULL::text, ARRAY[groups]);
  s_error := array_fill(NULL::text, ARRAY[groups]);
  s_permit := array_fill(NULL::uuid, ARRAY[groups]);
  s_starts := array_fill(NULL::bigint, ARRAY[groups]);
  s_decided := array_fill(NULL::timestamptz, ARRAY[groups]);
  s_swept := array_fill(NULL::timestamptz, ARRAY[groups]);
  g_live := array_fill(0::bigint, ARRAY[groups]);
  g_earliest := array_fill(NULL::timestamptz, ARRAY[groups]);
  g_wait := array_fill(NULL::interval, ARRAY[groups]);
  g_reason := array_fill(NULL::text, ARRAY[groups]);
  g_locked := array_fill(false, ARRAY[groups]);

  -- 1. The keys whose row no one holds are locked at once, with their definition. (Groups are
  --    in (throttle, key) order, and each row is locked as its group comes.)
  FOR r IN
    SELECT x.i::integer AS g, st.incarnation AS state_incarnation, st.last_start, st.every_from, st.tat,
           st.last_end, st.last_outcome, st.last_error, st.last_permit, st.starts, st.decided_at, st.swept_until,
           d.incarnation, d.every_ms, d.rate_limit, d.per_ms, d.concurrency, d.lease_ms
      FROM unnest(g_name, g_key) WITH ORDINALITY AS x(n, k, i)
      CROSS JOIN LATERAL (
        SELECT * FROM {{schema}}.throttle_state AS t
         WHERE t.name = x.n AND t.key = x.k
           FOR UPDATE SKIP LOCKED) AS st
      JOIN {{schema}}.throttles AS d ON d.name = x.n
  LOOP
    d_inc[r.g] := r.incarnation; d_every[r.g] := r.every_ms; d_rate[r.g] := r.rate_limit; d_per[r.g] := r.per_ms;
    d_conc[r.g] := r.concurrency; d_lease[r.g] := r.lease_ms;
    s_inc[r.g] := r.state_incarnation; s_last_start[r.g] := r.last_start; s_every[r.g] := r.every_from;
    s_tat[r.g] := r.tat; s_last_end[r.g] := r.last_end; s_outcome[r.g] := r.last_outcome;
    s_error[r.g] := r.last_error; s_permit[r.g] := r.last_permit; s_starts[r.g] := r.starts;
    s_decided[r.g] := r.decided_at; s_swept[r.g] := r.swept_until;
    g_locked[r.g] := true;
  END LOOP;

  -- 2. The keys held by someone else (or new), from a snapshot: those it already refuses are
  --    answered without waiting for the lock.
  FOR g IN 1..groups LOOP
    IF NOT g_locked[g] THEN
      pending := pending || g;
    END IF;
  END LOOP;
  IF cardinality(pending) > 0 THEN
    c := clock_timestamp();
    FOR r IN
      SELECT x.g, d.incarnation, d.every_ms, d.rate_limit, d.per_ms, d.concurrency, d.lease_ms,
             st.incarnation AS state_incarnation, st.every_from, st.tat, st.decided_at,
             EXISTS (SELECT 1 FROM {{schema}}.permits AS p
                      WHERE p.name = g_name[x.g] AND p.key = g_key[x.g] AND p.refund) AS refund_pending,
             y.live, y.earliest
        FROM unnest(pending) AS x(g)
        LEFT JOIN {{schema}}.throttles AS d ON d.name = g_name[x.g]
        LEFT JOIN {{schema}}.throttle_state AS st ON st.name = g_name[x.g] AND st.key = g_key[x.g]
        CROSS JOIN LATERAL (
          SELECT count(*) AS live, min(p.expires_at) AS earliest FROM {{schema}}.permits AS p
           WHERE d.concurrency IS NOT NULL AND p.name = g_name[x.g] AND p.key = g_key[x.g] AND p.ended_at IS NULL
             AND p.expires_at > greatest(c, st.decided_at) AND p.incarnation = d.incarnation) AS y
    LOOP
      IF r.incarnation IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'OX005', MESSAGE = format('The throttle %L does not exist', g_name[r.g]);
      END IF;
      d_inc[r.g] := r.incarnation; d_every[r.g] := r.every_ms; d_rate[r.g] := r.rate_limit; d_per[r.g] := r.per_ms;
      d_conc[r.g] := r.concurrency; d_lease[r.g] := r.lease_ms;
      IF r.state_incarnation = r.incarnation AND NOT r.refund_pending THEN
        v := {{schema}}.throttle_verdict(r.every_ms, {{schema}}.throttle_cost(r.rate_limit, r.per_ms), r.rate_limit,
                                         r.concurrency, r.every_from, r.tat, greatest(c, r.decided_at), r.live, r.earliest);
        IF v.reason IS NOT NULL THEN
          g_wait[r.g] := v.wait;
          g_reason[r.g] := v.reason;
          CONTINUE;
        END IF;
      END IF;
      waiting := waiting || r.g;
      any_new := any_new OR r.state_incarnation IS NULL;
    END LOOP;

    -- 3. Wait for the others' rows, in (throttle, key) order, creating the new keys' rows.
    IF cardinality(waiting) > 0 THEN
      IF any_new THEN
        INSERT INTO {{schema}}.throttle_state AS st (name, key, incarnation)
        SELECT g_name[u.g], g_key[u.g], d_inc[u.g] FROM unnest(waiting) AS u(g) ORDER BY 1, 2
        ON CONFLICT DO NOTHING;
      END IF;
      FOR r IN
        SELECT u.g, st.incarnation, st.last_start, st.every_from, st.tat, st.last_end, st.last_outcome,
               st.last_error, st.last_permit, st.starts, st.decided_at, st.swept_until
          FROM unnest(waiting) AS u(g)
          CROSS JOIN LATERAL (
            SELECT * FROM {{schema}}.throttle_state AS t
             WHERE t.name = g_name[u.g] AND t.key = g_key[u.g]
               FOR UPDATE) AS st
      LOOP
        s_inc[r.g] := r.incarnation; s_last_start[r.g] := r.last_start; s_every[r.g] := r.every_from;
        s_tat[r.g] := r.tat; s_last_end[r.g] := r.last_end; s_outcome[r.g] := r.last_outcome;
        s_error[r.g] := r.last_error; s_permit[r.g] := r.last_permit; s_starts[r.g] := r.starts;
        s_decided[r.g] := r.decided_at; s_swept[r.g] := r.swept_until;
      END LOOP;
      FOREACH g IN ARRAY waiting LOOP
        g_locked[g] := true;
      END LOOP;
    END IF;
  END IF;
  FOR g IN 1..groups LOOP
    IF g_locked[g] THEN
      locking := locking || g;
      d_cost[g] := {{schema}}.throttle_cost(d_rate[g], d_per[g]);
      any_limit := any_limit OR d_conc[g] IS NOT NULL;
    END IF;
  END LOOP;

  IF cardinality(locking) > 0 THEN
    c := clock_timestamp();
    g_c := array_fill(NULL::timestamptz, ARRAY[groups]);
    g_changed := array_fill(false, ARRAY[groups]);
    FOREACH g IN ARRAY locking LOOP
      IF s_inc[g] IS NULL THEN
        -- Removed since our snapshot.
        RAISE EXCEPTION USING ERRCODE = 'OX005', MESSAGE = format('The throttle %L does not exist', g_name[g]);
      END IF;
      IF s_inc[g] > d_inc[g] THEN
        -- Removed and defined again since our snapshot: decide by the new definition.
        SELECT d.incarnation, d.every_ms, d.rate_limit, d.per_ms, d.concurrency, d.lease_ms INTO r
          FROM {{schema}}.throttles AS d WHERE d.name = g_name[g];
        IF NOT FOUND THEN
          RAISE EXCEPTION USING ERRCODE = 'OX005', MESSAGE = format('The throttle %L does not exist', g_name[g]);
        END IF;
        d_inc[g] := r.incarnation; d_every[g] := r.every_ms; d_rate[g] := r.rate_limit; d_per[g] := r.per_ms;
        d_conc[g] := r.concurrency; d_lease[g] := r.lease_ms; d_cost[g] := {{schema}}.throttle_cost(r.rate_limit, r.per_ms);
      END IF;
      IF s_inc[g] < d_inc[g] THEN
        -- Left behind by a removed incarnation of this throttle: start afresh.
        resets := resets || g;
        s_inc[g] := d_inc[g]; s_last_start[g] := NULL; s_every[g] := NULL; s_tat[g] := NULL; s_last_end[g] := NULL;
        s_outcome[g] := NULL; s_error[g] := NULL; s_permit[g] := NULL; s_starts[g] := 0; s_swept[g] := NULL;
        g_changed[g] := true;
      END IF;
      g_c[g] := greatest(c, s_decided[g]);
      g_live[g] := 0;
      g_earliest[g] := NULL;
    END LOOP;
    IF cardinality(resets) > 0 THEN
      DELETE FROM {{schema}}.permits AS p USING unnest(resets) AS u(g)
       WHERE p.name = g_name[u.g] AND p.key = g_key[u.g] AND p.incarnation < d_inc[u.g];
    END IF;

    -- Fold in what ended: completed and failed permits (deleted), expired ones a day after
    -- their end; refunds give back what they consumed.
    FOR r IN
      DELETE FROM {{schema}}.permits AS p USING unnest(locking) AS u(g)
       WHERE p.name = g_name[u.g] AND p.key = g_key[u.g] AND p.ended_at IS NOT NULL
         AND (p.outcome <> 'expired' OR p.ended_at < g_c[u.g] - interval '1 day')
      RETURNING u.g, p.id, p.incarnation, p.acquired_at, p.ended_at, p.outcome, p.error, p.refund, p.every_before, p.rate_cost
    LOOP
      CONTINUE WHEN r.incarnation <> d_inc[r.g];
      g_changed[r.g] := true;
      IF s_last_end[r.g] IS NULL OR r.ended_at > s_last_end[r.g]
         OR (r.ended_at = s_last_end[r.g] AND r.id <> s_permit[r.g]) THEN
        s_last_end[r.g] := r.ended_at; s_outcome[r.g] := r.outcome; s_error[r.g] := r.error; s_permit[r.g] := r.id;
      END IF;
      IF r.refund THEN
        IF r.rate_cost IS NOT NULL AND s_tat[r.g] IS NOT NULL THEN
          s_tat[r.g] := s_tat[r.g] - r.rate_cost;
        END IF;
        refund_g := refund_g || r.g;
        refund_start := refund_start || r.acquired_at;
        refund_before := refund_before || r.every_before;
      END IF;
    END LOOP;
    -- Refunded starts give the `every` interval back newest first, each to the start before it.
    IF cardinality(refund_g) > 0 THEN
      FOR r IN SELECT u.g, u.a, u.b FROM unnest(refund_g, refund_start, refund_before) AS u(g, a, b)
                ORDER BY u.g, u.a DESC LOOP
        IF s_every[r.g] = r.a THEN
          s_every[r.g] := r.b;
        END IF;
      END LOOP;
    END IF;
    -- Leases that ran out since the last sweep are marked (not merely skipped): marking locks
    -- the row, so an extend_permit() racing with this decision either committed first (and the
    -- permit lives on) or finds the permit expired.
    FOR r IN
      UPDATE {{schema}}.permits AS p SET ended_at = p.expires_at, outcome = 'expired'
        FROM unnest(locking) AS u(g)
       WHERE p.name = g_name[u.g] AND p.key = g_key[u.g]
         AND p.expires_at > coalesce(s_swept[u.g], '-infinity') AND p.expires_at <= g_c[u.g] AND p.ended_at IS NULL
      RETURNING u.g, p.id, p.incarnation, p.ended_at
    LOOP
      CONTINUE WHEN r.incarnation <> d_inc[r.g];
      g_changed[r.g] := true;
      IF s_last_end[r.g] IS NULL OR r.ended_at > s_last_end[r.g]
         OR (r.ended_at = s_last_end[r.g] AND r.id <> s_permit[r.g]) THEN
        s_last_end[r.g] := r.ended_at; s_outcome[r.g] := 'expired'; s_error[r.g] := NULL; s_permit[r.g] := r.id;
      END IF;
    END LOOP;
    -- Live permits of the keys with a concurrency limit.
    IF any_limit THEN
      FOR r IN
        SELECT u.g, count(*) AS live, min(p.expires_at) AS earliest
          FROM unnest(locking) AS u(g)
          JOIN {{schema}}.permits AS p
            ON p.name = g_name[u.g] AND p.key = g_key[u.g] AND p.ended_at IS NULL AND p.expires_at > g_c[u.g]
           AND p.incarnation = d_inc[u.g]
         WHERE d_conc[u.g] IS NOT NULL
         GROUP BY u.g
      LOOP
        g_live[r.g] := r.live;
        g_earliest[r.g] := r.earliest;
      END LOOP;
    END IF;
  END IF;

  -- Decide each request, in request order within its key.
  o_granted := array_fill(false, ARRAY[n]);
  o_id := array_fill(NULL::uuid, ARRAY[n]);
  o_acquired := array_fill(NULL::timestamptz, ARRAY[n]);
  o_expires := array_fill(NULL::timestamptz, ARRAY[n]);
  o_retry := array_fill(0::bigint, ARRAY[n]);
  o_reason := array_fill(NULL::text, ARRAY[n]);
  FOR i IN 1..n LOOP
    g := r_group[i];
    IF g_reason[g] IS NULL THEN
      c := g_c[g];
      v := {{schema}}.throttle_verdict(d_every[g], d_cost[g], d_rate[g], d_conc[g], s_every[g], s_tat[g], c,
                                       g_live[g], g_earliest[g]);
      IF v.reason IS NULL THEN
        new_id := gen_random_uuid();
        until := c + d_lease[g] * interval '1 millisecond';
        p_id := p_id || new_id; p_group := p_group || g; p_holder := p_holder || r_holder[i];
        p_acquired := p_acquired || c; p_every_before := p_every_before || s_every[g];
        s_last_start[g] := c; s_every[g] := c; s_tat[g] := coalesce(v.new_tat, s_tat[g]);
        s_starts[g] := s_starts[g] + 1;
        g_live[g] := g_live[g] + 1;
        g_earliest[g] := least(g_earliest[g], until);
        g_changed[g] := true;
        o_granted[i] := true; o_id[i] := new_id; o_acquired[i] := c; o_expires[i] := until;
        CONTINUE;
      END IF;
      o_retry[i] := {{schema}}.throttle_ms(v.wait);
      o_reason[i] := v.reason;
    ELSE
      o_retry[i] := {{schema}}.throttle_ms(g_wait[g]);
      o_reason[i] := g_reason[g];
    END IF;
  END LOOP;

  IF cardinality(p_id) > 0 THEN
    INSERT INTO {{schema}}.permits AS p
      (id, name, key, incarnation, holder, acquired_at, expires_at, every_before, rate_cost)
    SELECT u.id, g_name[u.g], g_key[u.g], d_inc[u.g], u.h, u.a, u.a + d_lease[u.g] * interval '1 millisecond',
           u.b, d_cost[u.g]
      FROM unnest(p_id, p_group, p_holder, p_acquired, p_every_before) AS u(id, g, h, a, b);
  END IF;
  IF cardinality(locking) > 0 THEN
    FOREACH g IN ARRAY locking LOOP
      IF g_changed[g] THEN
        changed := changed || g;
      END IF;
    END LOOP;
    IF cardinality(changed) > 0 THEN
      UPDATE {{schema}}.throttle_state AS st
         SET incarnation = s_inc[u.g], last_start = s_last_start[u.g], every_from = s_every[u.g], tat = s_tat[u.g],
             last_end = s_last_end[u.g], last_outcome = s_outcome[u.g], last_error = s_error[u.g],
             last_permit = s_permit[u.g], starts = s_starts[u.g], decided_at = g_c[u.g], swept_until = g_c[u.g]
        FROM unnest(changed) AS u(g)
       WHERE st.name = g_name[u.g] AND st.key = g_key[u.g];
    END IF;
  END IF;
  FOR i IN 1..n LOOP
    request := i;
    granted := o_granted[i];
    permit_id := o_id[i];
    holder := CASE WHEN o_granted[i] THEN r_holder[i] END;
    acquired_at := o_acquired[i];
    expires_at := o_expires[i];
    retry_after_ms := o_retry[i];
    reason := o_reason[i];
    RETURN NEXT;
  END LOOP;
END $$;

-- One decision for (throttle, key): granted with a permit, or refused with how long to wait.
-- holder NULL: application_name:backend pid.
CREATE FUNCTION {{schema}}.try_acquire(throttle_name text, throttle_key text DEFAULT '', permit_holder text DEFAULT NULL)
RETURNS TABLE (granted boolean, permit_id uuid, holder text, acquired_at timestamptz, expires_at timestamptz,
               retry_after_ms bigint, reason text)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  RETURN QUERY
    SELECT r.granted, r.permit_id, r.holder, r.acquired_at, r.expires_at, r.retry_after_ms, r.reason
    FROM {{schema}}.try_acquire_many(ARRAY[throttle_name], ARRAY[throttle_key], ARRAY[permit_holder]) AS r;
END $$;

-- Completes permits and decides requests in one call: one round trip and one commit for a
-- client's queued calls of both kinds. The ends come first, so the decisions see them. Rows
-- with a request number answer a decision (as try_acquire_many); rows without one are the
-- permits completed (as complete_permits: the others are unknown, ended or expired). It waits
-- at most 500 ms for a row lock (a caller's transaction holding one) and then fails with
-- lock_not_available: the client serves its calls one by one instead, so that one busy key
-- does not hold up the others.
CREATE FUNCTION {{schema}}.throttle_batch(complete_ids uuid[], names text[], keys text[], holders text[])
RETURNS TABLE (request integer, permit_id uuid, granted boolean, holder text, acquired_at timestamptz,
               expires_at timestamptz, retry_after_ms bigint, reason text, name text, key text, ended_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET lock_timeout = '500ms'
AS $$
BEGIN
  IF cardinality(complete_ids) > 0 THEN
    RETURN QUERY
      SELECT NULL::integer, e.id, NULL::boolean, NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::bigint,
             NULL::text, e.name, e.key, e.ended_at
        FROM {{schema}}.complete_permits(complete_ids) AS e;
  END IF;
  IF cardinality(names) > 0 THEN
    RETURN QUERY
      SELECT a.request, a.permit_id, a.granted, a.holder, a.acquired_at, a.expires_at, a.retry_after_ms, a.reason,
             NULL::text, NULL::text, NULL::timestamptz
        FROM {{schema}}.try_acquire_many(names, keys, holders) AS a;
  END IF;
END $$;

-- Raises why a permit cannot be ended or extended at clock c: it expired (OX008), or it is
-- unknown or already ended (OX007).
CREATE FUNCTION {{schema}}.permit_gone(gone_id uuid, c timestamptz) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
  p {{schema}}.permits;
BEGIN
  SELECT * INTO p FROM {{schema}}.permits AS x
   WHERE x.id = gone_id
     AND EXISTS (SELECT 1 FROM {{schema}}.throttles AS d WHERE d.name = x.name AND d.incarnation = x.incarnation);
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX007',
      MESSAGE = format('The permit %s does not exist, or it has ended and was cleared', gone_id);
  END IF;
  IF p.outcome = 'expired' OR (p.outcome IS NULL AND p.expires_at <= c) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX008',
      MESSAGE = format('The permit %s expired at %s: its lease ran out before it was completed, failed or extended',
                       gone_id, to_char(p.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'));
  END IF;
  RAISE EXCEPTION USING ERRCODE = 'OX007',
    MESSAGE = format('The permit %s has already ended: it %s at %s', gone_id, p.outcome,
                     to_char(p.ended_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'));
END $$;

-- Ends live permits as completed; returns the ones it ended (the others are unknown, ended or
-- expired: complete_permit() on each says which). Rows are locked in id order.
CREATE FUNCTION {{schema}}.complete_permits(ids uuid[])
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
    UPDATE {{schema}}.permits AS p SET ended_at = greatest(c, p.acquired_at), outcome = 'completed'
    WHERE p.id = ANY (ids) AND p.ended_at IS NULL AND p.expires_at > c
    RETURNING p.id, p.name, p.key, p.outcome, p.ended_at, false;
END $$;

-- Ends a live permit as completed. Touches only the permit's row.
CREATE FUNCTION {{schema}}.complete_permit(permit_id uuid)
RETURNS TABLE (id uuid, name text, key text, outcome text, ended_at timestamptz, refunded boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  c timestamptz := clock_timestamp();
BEGIN
  RETURN QUERY
    UPDATE {{schema}}.permits AS p SET ended_at = greatest(c, p.acquired_at), outcome = 'completed'
    WHERE p.id = permit_id AND p.ended_at IS NULL AND p.expires_at > c
    RETURNING p.id, p.name, p.key, p.outcome, p.ended_at, false;
  IF NOT FOUND THEN
    PERFORM {{schema}}.permit_gone(permit_id, c);
  END IF;
END $$;

-- Ends a live permit as failed, with an error text. give_back: return what the permit consumed
-- (its `every` start, its token) so that a retry may start at once; NULL: the throttle's
-- refund_on_failure. The next decision on the key applies the refund.
CREATE FUNCTION {{schema}}.fail_permit(permit_id uuid, error_text text DEFAULT NULL, give_back boolean DEFAULT NULL)
RETURNS TABLE (id uuid, name text, key text, outcome text, ended_at timestamptz, refunded boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  c timestamptz := clock_timestamp();
BEGIN
  RETURN QUERY
    UPDATE {{schema}}.permits AS p
       SET ended_at = greatest(c, p.acquired_at), outcome = 'failed', error = left(error_text, 2000),
           refund = coalesce(give_back,
                             (SELECT d.refund_on_failure FROM {{schema}}.throttles AS d WHERE d.name = p.name), false)
    WHERE p.id = permit_id AND p.ended_at IS NULL AND p.expires_at > c
    RETURNING p.id, p.name, p.key, p.outcome, p.ended_at, p.refund;
  IF NOT FOUND THEN
    PERFORM {{schema}}.permit_gone(permit_id, c);
  END IF;
END $$;

-- Renews a live permit's lease: expires_at = clock + the throttle's lease (never earlier than
-- it was). Returns the new expires_at.
CREATE FUNCTION {{schema}}.extend_permit(permit_id uuid) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  c timestamptz := clock_timestamp();
  until timestamptz;
BEGIN
  UPDATE {{schema}}.permits AS p
     SET expires_at = greatest(p.expires_at, c + d.lease_ms * interval '1 millisecond')
    FROM {{schema}}.throttles AS d
   WHERE d.name = p.name AND d.incarnation = p.incarnation
     AND p.id = permit_id AND p.ended_at IS NULL AND p.expires_at > c
  RETURNING p.expires_at INTO until;
  IF NOT FOUND THEN
    PERFORM {{schema}}.permit_gone(permit_id, c);
  END IF;
  RETURN until;
END $$;

-- A key's last start, the permit that ended last and how, and how many permits run, read
-- without a lock: ends not yet folded in by a decision (and leases that ran out) count.
CREATE FUNCTION {{schema}}.throttle_status(throttle_name text, throttle_key text DEFAULT '')
RETURNS TABLE (last_start timestamptz, starts bigint, last_end timestamptz, last_outcome text, last_error text,
               last_permit uuid, running integer, observed_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
  c timestamptz := clock_timestamp();
  generation bigint;
  s {{schema}}.throttle_state;
  e record;
BEGIN
  SELECT d.incarnation INTO generation FROM {{schema}}.throttles AS d WHERE d.name = throttle_name;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX005', MESSAGE = format('The throttle %L does not exist', throttle_name);
  END IF;
  SELECT * INTO s FROM {{schema}}.throttle_state AS st
   WHERE st.name = throttle_name AND st.key = throttle_key AND st.incarnation = generation;
  SELECT p.id, coalesce(p.ended_at, p.expires_at) AS ended_at, coalesce(p.outcome, 'expired') AS outcome, p.error
    INTO e
    FROM {{schema}}.permits AS p
   WHERE p.name = throttle_name AND p.key = throttle_key AND p.incarnation = generation
     AND (p.ended_at IS NOT NULL OR p.expires_at <= c)
   ORDER BY 2 DESC, p.id
   LIMIT 1;
  IF e.id IS NOT NULL AND (s.last_end IS NULL OR e.ended_at > s.last_end) THEN
    s.last_end := e.ended_at;
    s.last_outcome := e.outcome;
    s.last_error := e.error;
    s.last_permit := e.id;
  END IF;
  RETURN QUERY
    SELECT s.last_start, coalesce(s.starts, 0), s.last_end, s.last_outcome, s.last_error, s.last_permit,
           (SELECT count(*)::integer FROM {{schema}}.permits AS p
             WHERE p.name = throttle_name AND p.key = throttle_key AND p.incarnation = generation
               AND p.ended_at IS NULL AND p.expires_at > c),
           c;
END $$;
