-- Step 2 of a decision (acquire_all), on the keys throttle_lock returned. For each locked key, at a
-- clock read after every lock and never before the key's last decision (decided_at):
-- * a state left by a removed incarnation starts afresh, its old permits deleted; a throttle
--   removed and defined again since its definition was read is decided by the new definition; one
--   removed altogether raises OX005 throttle_not_found;
-- * what ended since the last decision is folded in: completed and failed permits are deleted
--   (expired ones a day after their end), their units leave the live units, the last end is
--   recorded, refunds give back what they consumed (newest first), holds pause the key;
-- * leases that ran out are marked expired, which locks them, so an extend racing with this either
--   committed first or finds them expired;
-- * a key with no room left gets the first lease to run out, for the wait a refusal gives.
--
-- Permits end without the key's lock (complete and fail touch only their own rows), so an end may
-- commit after the clock was read and still be folded here. Counted as ended, that permit would end
-- after the decision's instant, and a grant at that instant would make more run than the limit on
-- the database clock: so the key's clock moves up to every end it folds (a permit whose end it does
-- not see counts as live).
--
-- Runs under acquire_all's planner settings.
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
