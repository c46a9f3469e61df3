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
-- And a throttle decision with fewer calls: one function says whether an item fits, the fold
-- does nothing where nothing can be folded, and no call computes "after nothing".
--
-- Counted by callgrind (npx tsx bench/instructions.ts, the embedded PostgreSQL 18, through
-- throttle_batch as the library sends it), million instructions: with only the permit rows
-- left out -> with these calls taken out too -> with the short answer below:
--   plain:16        16 acquires on keys drawn from 1,000, a throttle without permits   7.12 -> 6.31 -> 5.19
--   plain-hot:16    16 acquires on one key, without permits                            4.19 -> 3.89 -> 2.51
--   plain:1         one acquire without permits                                        2.28 -> 1.97 -> 1.73
--   throttle:16     16 acquires on keys drawn from 1,000 with permits, and completes  10.20 -> 9.72 -> 9.38
--   throttle-hot:16 16 acquires on one key with permits, and completes                 6.62 -> 6.56 -> 6.21
--   throttle:1      one acquire with a permit, and its complete                        3.02 -> 2.95 -> 3.04
-- (One acquire with a permit pays for the write-back's statement of its own.) Each part of the
-- fewer calls, measured alone on plain:16:
--
-- * throttle_item decided an item's limits by calling throttle_verdict, passing the key's
--   state (a row of 35 fields) again; the verdict is now its body, and the snapshot refusal of
--   throttle_glance asks throttle_item too (not first in line: a cost above a limit is refused
--   for a second there, as a waiter is, rather than computed from the bucket; the decision under
--   the lock raises the error as before). throttle_verdict is gone: one function for the
--   question. -3.9%.
-- * throttle_fold read a key's ended permits and swept its run-out leases on every decision. A
--   key's live units count every permit not yet folded or swept, so when no locked key has any,
--   there is nothing to read: a throttle without permits never has any, nor does a key whose
--   permits have all been folded. -4.8%.
-- * acquire_all computed each key "after the grants before this item" for the first item of a
--   key too, after none: now the key itself. -1.5%.
-- * throttle_lock, throttle_glance and throttle_fold set the planner settings of acquire_all,
--   their only caller, again on every call (each SET is saved and restored): now they inherit
--   them. -1.5%.
-- * throttle_glance looped over the keys' rows to learn whether it had locked them all; the
--   statement that locks them says so (bool_and). -0.5% (-0.8% with permits).
--
-- And a short answer. acquire_all (0036) answered every batch with one statement over its
-- items: each item's key as it stood before it (a window over the grants before it on its key),
-- its refusal if any, the permit rows, each request's answer, and each key's state written back. When every request is
-- granted and no item's throttle keeps permits (a rate limiter, permits: false) there is
-- nothing item by item to compute: no refusal to pick, no permit row to fill. That statement was
-- a fifth of a batch's work, most of it in starting its plan (two windows, their sorts, four
-- CTE scans, two writes). Now:
--
-- * Each key's state is written back by a statement of its own, for every batch: each key after
--   all its grants (throttle_after of their count and units, as before) and with what the fold
--   changed. The answer's statement no longer computes it per item (key_first, key_n, key_units).
-- * Every request granted, none with an item of a throttle that keeps permits: each request is
--   answered with its first item's key's instant (a grant does not move it), a null expiry, no
--   wait. Its id is made of one random uuid per batch and the request's number (the last 12 hex
--   digits): an id names a start, and nothing is stored under it, so it needs to be unique,
--   not unguessable; gen_random_uuid() for each request cost 14,000 instructions.
--   Permit ids are gen_random_uuid() as before, made for the batches that answer item by item.
-- * Request numbers rising item by item (what the library's batcher and try_acquire send: each
--   acquire() is a request of one item) cannot name a throttle and key twice in a request, and
--   each item is its own request: neither the check for that nor the windows that number the
--   requests by their first items are run.
--
-- Answers are unchanged, but for the ids of starts without permits (above), and for a request
-- whose cost is above a key's limit while another transaction holds that key: refused with a
-- wait of 1 second (it was the bucket's wait), as a waiter asking that much is; once the key is
-- free, the error as before.
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

-- 0017's, with 0010's throttle_verdict as its body. Whether one item of `cost` may start on key
-- k as it stands (reason null), else how long to wait and why: refused from a snapshot
-- (throttle_glance), a cost above the key's limits (an error for the first in line; a waiter,
-- whose key's limit was lowered below its cost since it came, waits on rather than failing
-- everyone else's line), a pause, `every`, the bucket, the concurrency limit (the wait that
-- is longest names the reason; a concurrency refusal cannot know when a permit will end, so
-- its wait is the first lease to run out, at most 100 ms), or others waiting in line.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_item(k {{schema}}.throttle_key, cost integer, queued boolean,
                                         line_first boolean, OUT wait interval, OUT reason text)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  w interval;
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
      w := greatest(k.tat, k.c) + k.unit * cost - k.unit * k.rate_limit - k.c;
      IF w > wait THEN
        wait := w; reason := 'rate';
      END IF;
    END IF;
    IF k.concurrency IS NOT NULL AND k.live + cost > k.concurrency THEN
      w := least(k.earliest - k.c, interval '100 milliseconds');
      IF reason IS NULL OR w > wait THEN
        wait := greatest(w, wait); reason := 'concurrency';
      END IF;
    END IF;
    IF reason IS NULL AND queued THEN
      wait := interval '50 milliseconds'; reason := 'queued';
    END IF;
  END IF;
END $$;

-- 0033's, asking throttle_item, with its caller's settings, and whether every key is locked
-- read off the statement that locks them (bool_and) rather than a loop over their rows.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_glance(names text[], keys text[], units integer[])
RETURNS {{schema}}.throttle_key[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  ks {{schema}}.throttle_key[];
  k {{schema}}.throttle_key;
  r record;
  v record;
  c timestamptz;
  all_locked boolean;
BEGIN
  SELECT array_agg({{schema}}.throttle_key_of(d, s.st, x.k, coalesce(s.locked, false)) ORDER BY x.i),
         bool_and(coalesce(s.locked, false))
    INTO ks, all_locked
    FROM unnest(names, keys) WITH ORDINALITY AS x(n, k, i)
    LEFT JOIN {{schema}}.throttles AS d ON d.name = x.n
    LEFT JOIN LATERAL (SELECT t, true FROM {{schema}}.throttle_state AS t
                        WHERE t.name = x.n AND t.key = x.k FOR UPDATE SKIP LOCKED) AS s(st, locked) ON true;
  -- Every key locked at once (the usual case): nothing to read from a snapshot.
  IF all_locked IS NOT false THEN
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
      v := {{schema}}.throttle_item(k, units[r.g], false, false);
      IF v.reason IS NOT NULL THEN
        k.wait := v.wait;
        k.reason := v.reason;
        ks[r.g] := k;
      END IF;
    END IF;
  END LOOP;
  RETURN ks;
END $$;

DROP FUNCTION {{schema}}.throttle_verdict({{schema}}.throttle_key, integer);

ALTER FUNCTION {{schema}}.throttle_lock(text[], text[], integer[]) RESET ALL;

-- 0035's, with nothing read when no key has live units, with its caller's settings.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_fold(ks {{schema}}.throttle_key[])
RETURNS {{schema}}.throttle_key[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  k {{schema}}.throttle_key;
  r record;
  g integer;
  c timestamptz := clock_timestamp();
  locked integer[];
  no_room integer[];          -- locked keys whose concurrency limit their live units reach
  -- The locked keys, in the order of locked: names and keys for the index, and pairs
  -- (throttle_pair) to tell a key's permits from those of the other combinations.
  l_names text[];
  l_keys text[];
  l_pairs text[];
  l_c timestamptz[];
  l_swept timestamptz[];
  any_live boolean := false;  -- some key counts live units: it may have permits to fold
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
    l_names := l_names || k.name;
    l_keys := l_keys || k.key;
    l_pairs := l_pairs || {{schema}}.throttle_pair(k.name, k.key);
    l_c := l_c || k.c;
    l_swept := l_swept || coalesce(k.swept_until, '-infinity');
    any_live := any_live OR k.live > 0;
  END LOOP;
  -- A key's live units count its permits until their ends are folded or their leases swept:
  -- with none on any key there is nothing to fold or sweep (expired permits a day old wait for
  -- the next decision that has some, or for maintain()).
  IF NOT any_live THEN
    RETURN ks;
  END IF;

  -- The keys' permits are read by their names and keys alone, in one scan with no join: a
  -- plan the planner cannot turn round, whatever it thinks the table holds.
  FOR r IN
    WITH gone AS (
      DELETE FROM {{schema}}.permits AS p
       WHERE p.name = ANY (l_names) AND p.key = ANY (l_keys) AND p.ended_at IS NOT NULL
         AND array_position(l_pairs, {{schema}}.throttle_pair(p.name, p.key)) IS NOT NULL
         AND (p.outcome <> 'expired'
              OR p.ended_at < l_c[array_position(l_pairs, {{schema}}.throttle_pair(p.name, p.key))] - interval '1 day')
      RETURNING array_position(l_pairs, {{schema}}.throttle_pair(p.name, p.key)) AS i, p.id, p.incarnation, p.acquired_at,
                p.ended_at, p.outcome, p.error, p.refund, p.every_before, p.rate_cost, p.hold_until, p.cost)
    SELECT locked[gone.i] AS g, gone.* FROM gone ORDER BY gone.i, gone.acquired_at DESC
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

  -- Likewise, as of each key's instant now (an end folded above may have moved it).
  FOR i IN 1..cardinality(locked) LOOP
    l_c[i] := (ks[locked[i]]).c;
  END LOOP;
  FOR r IN
    UPDATE {{schema}}.permits AS p SET ended_at = p.expires_at, outcome = 'expired'
     WHERE p.name = ANY (l_names) AND p.key = ANY (l_keys) AND p.ended_at IS NULL
       AND p.expires_at > l_swept[array_position(l_pairs, {{schema}}.throttle_pair(p.name, p.key))]
       AND p.expires_at <= l_c[array_position(l_pairs, {{schema}}.throttle_pair(p.name, p.key))]
    RETURNING locked[array_position(l_pairs, {{schema}}.throttle_pair(p.name, p.key))] AS g, p.id, p.incarnation, p.ended_at, p.cost
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
      SELECT u.g, x.earliest
        FROM unnest(no_room) AS u(g)
        CROSS JOIN LATERAL (
          SELECT min(p.expires_at) AS earliest FROM {{schema}}.permits AS p
           WHERE p.name = (ks[u.g]).name AND p.key = (ks[u.g]).key AND p.expires_at > (ks[u.g]).c
             AND p.ended_at IS NULL AND p.incarnation = (ks[u.g]).incarnation OFFSET 0) AS x
    LOOP
      k := ks[r.g];
      k.earliest := r.earliest;
      ks[r.g] := k;
    END LOOP;
  END IF;
  RETURN ks;
END $$;

-- 0036's: permit rows only for items of throttles with a lease; no throttle_after of nothing;
-- each key's state written back by a statement of its own; a batch all granted without permit
-- rows answered without the items' statement; requests of one item each not numbered again.
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
  -- the lower only (0), or not even there (-1).
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
  -- or aggregated: no join of the items to themselves, which are as many as 256 (a nested loop
  -- over them was quadratic).
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
