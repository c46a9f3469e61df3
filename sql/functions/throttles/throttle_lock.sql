-- Step 1 of a decision (acquire_all): the keys (distinct, in (throttle, key) order) with the
-- definition of each, each locked or refused. throttle_glance locks what is free at once and
-- refuses from a snapshot what is refused anyway; the keys left are created if new and locked in
-- order, so two decisions never deadlock on them.
--
-- Waiting for a key while holding a later one could deadlock with a decision that holds the first
-- and waits for the second. So when the keys taken at once are not all before the first one to wait
-- for, they are given back (the subtransaction is rolled back: OX099, raised and caught here, never
-- leaves this function; the snapshot's refusals stay valid) and every key not refused is taken in
-- order. A decision of one key never waits holding another, and skips the subtransaction.
--
-- The decision's clock is read after this (throttle_fold): a decision the previous holder committed
-- is never later. Runs under acquire_all's planner settings.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_lock(names text[], keys text[], units integer[])
RETURNS {{schema}}.throttle_key[]
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  ks {{schema}}.throttle_key[];
  k {{schema}}.throttle_key;
  r record;
  i integer;
  first_wait integer;
  last_locked integer;
  waiting integer[];
BEGIN
  IF cardinality(names) = 1 THEN
    ks := {{schema}}.throttle_glance(names, keys, units);
  ELSE
    BEGIN
      ks := {{schema}}.throttle_glance(names, keys, units);
      FOR j IN 1..cardinality(ks) LOOP
        IF first_wait IS NULL AND NOT (ks[j]).locked AND (ks[j]).reason IS NULL THEN
          first_wait := j;
        END IF;
        IF (ks[j]).locked THEN
          last_locked := j;
        END IF;
      END LOOP;
      IF first_wait < last_locked THEN
        RAISE EXCEPTION USING ERRCODE = 'OX099', MESSAGE = 'out of order';
      END IF;
    EXCEPTION WHEN SQLSTATE 'OX099' THEN
      FOR i IN 1..cardinality(ks) LOOP
        k := ks[i];
        k.locked := false;
        ks[i] := k;
      END LOOP;
    END;
  END IF;
  waiting := '{}';
  FOR i IN 1..coalesce(cardinality(ks), 0) LOOP
    IF NOT (ks[i]).locked AND (ks[i]).reason IS NULL THEN
      waiting := waiting || i;
    END IF;
  END LOOP;
  IF cardinality(waiting) > 0 THEN
    -- One statement, in key order: new keys created, existing ones locked (ON CONFLICT DO
    -- UPDATE locks the row even when its WHERE updates nothing).
    INSERT INTO {{schema}}.throttle_state AS st (name, key, incarnation)
    SELECT names[u.g], keys[u.g], (ks[u.g]).incarnation FROM unnest(waiting) AS u(g) ORDER BY u.g
    ON CONFLICT (name, key) DO UPDATE SET incarnation = st.incarnation WHERE false;
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
