-- ordo 0035: throttle statements whose plans do not depend on how many permits the planner
-- thought there were when a connection first ran them.
--
-- A connection plans the statements of a decision once and keeps the plans (generic ones) for
-- its life. Permits come and go by the thousand, so whenever vacuum visits ordo.permits it
-- finds few live rows among many pages, and a connection that plans then takes the table for
-- nearly empty: the fold's DELETE of a key's ended permits and its sweep of run-out leases
-- read every permit of every throttle through permits_by_key and matched them to the keys
-- afterwards, and complete_permits() found its ids by a scan of permits_by_key on expires_at.
-- Measured on PostgreSQL 18 (32 callers, acquire + complete on 1,000 keys, vacuum every
-- second): 3,500 to 3,800 decisions a second on connections that had served one hot key right
-- after the table was emptied, 6,400 to 8,600 on the same connections after DISCARD PLANS, or
-- on new ones; with this migration, 8,200 to 8,500 on the first. Production meets this after
-- any quiet spell or burst: connections that plan at the wrong moment stay slow until they
-- close. `npm run bench -- throttles` runs 1,000 keys and the composite acquire on the
-- connections the hot key used: on the embedded PostgreSQL 18, 1,000 keys 0.58x -> 0.73-0.74x
-- RateLimiterPostgres and the composite 0.88x -> 1.10-1.19x two single acquires; on 15,
-- 0.49x -> 0.77x and 1.15x -> 1.08x (one run each side of the change on 15).
--
-- Now the fold reads the locked keys' permits in one scan of permits_by_key by their names
-- and keys (= ANY of each), with no join to turn round, and keeps those of the keys
-- themselves, not of the other combinations of names and keys; a refusal's earliest end is
-- looked up per key, in a LATERAL subquery the planner may not flatten. The expiry test of
-- complete, fail and extend is kept out of index conditions, so that only an index on id
-- serves them. That index replaces the primary key (id, name, key): PostgreSQL 18 skip-scans
-- an index over its leading column, and under a near-empty estimate it read a key's permits
-- through the primary key's name and key as readily as through permits_by_key, visiting every
-- id. A permit's id is drawn by gen_random_uuid() and shared only by the rows of one composite
-- permit (one per limit), so nothing relied on the constraint; REPLICA IDENTITY FULL keeps the
-- table's updates and deletes publishable where a publication covers every table (it writes
-- the old row only when wal_level is logical). Answers and locks are unchanged.
--
-- On plans made while the estimate was right, a batch of 16 acquires and completes on a fresh
-- table counts 1 to 2% more instructions (`npx tsx bench/instructions.ts throttle:16`: 10.93 ->
-- 11.19 million on PostgreSQL 18, 10.46 -> 10.59 on 15); per-key LATERAL lookups of every
-- statement, tried first, cost 6%.
--
-- Custom SQLSTATEs: none new.

ALTER TABLE {{schema}}.permits DROP CONSTRAINT permits_pkey;
CREATE INDEX permits_by_id ON {{schema}}.permits (id);
ALTER TABLE {{schema}}.permits REPLICA IDENTITY FULL;

-- A throttle key as one text: its name and key joined by chr(31), which no name holds. Inlined
-- into the plans that use it.
CREATE FUNCTION {{schema}}.throttle_pair(throttle_name text, throttle_key text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT throttle_name || chr(31) || throttle_key
$$;

-- 0033's, each key's permits read by the keys' names and keys.
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
  -- The locked keys, in the order of locked: names and keys for the index, and pairs
  -- (throttle_pair) to tell a key's permits from those of the other combinations.
  l_names text[];
  l_keys text[];
  l_pairs text[];
  l_c timestamptz[];
  l_swept timestamptz[];
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
  END LOOP;

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


-- 0010's, the permit found by its id only.
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
       WHERE p.id = ANY (ids) AND p.ended_at IS NULL AND (p.expires_at > c) IS TRUE
      RETURNING p.id, p.name, p.key, p.ended_at)
    SELECT DISTINCT ON (e.id) e.id, e.name, e.key, 'completed'::text, e.ended_at, false FROM ended AS e
     ORDER BY e.id, e.name, e.key;
  PERFORM {{schema}}.throttle_freed_by(ids);
END $$;

CREATE OR REPLACE FUNCTION {{schema}}.fail_permit(permit_id uuid, error_text text DEFAULT NULL, give_back boolean DEFAULT NULL,
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
       WHERE p.id = permit_id AND p.ended_at IS NULL AND (p.expires_at > c) IS TRUE
      RETURNING p.id, p.name, p.key, p.ended_at, p.refund)
    SELECT DISTINCT ON (e.id) e.id, e.name, e.key, 'failed'::text, e.ended_at, e.refund FROM ended AS e
     ORDER BY e.id, e.name, e.key;
  IF FOUND THEN
    PERFORM {{schema}}.throttle_freed_by(ARRAY[permit_id]);
  ELSE
    PERFORM {{schema}}.permit_gone(permit_id, c);
  END IF;
END $$;

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
       AND p.id = permit_id AND p.ended_at IS NULL AND (p.expires_at > c) IS TRUE
    RETURNING p.expires_at)
  SELECT min(r.expires_at) INTO until FROM renewed AS r;
  IF until IS NULL THEN
    PERFORM {{schema}}.permit_gone(permit_id, c);
  END IF;
  RETURN until;
END $$;
