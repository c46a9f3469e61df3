-- What a decision can know at once (for throttle_lock). The keys' state rows no one holds are
-- locked now (SKIP LOCKED: no waiting, so no order to keep). Of the others (held by another
-- transaction, or new), those a snapshot already refuses for `units` (the smallest cost asked of
-- each key) are answered with a reason and a wait: grants only tighten a key, and what loosens it
-- (an end) was either seen or commits after this decision. A key with a refund or a hold to fold,
-- or with a state of another incarnation, goes on to the lock. The keys left unlocked without a
-- reason are to be waited for.
--
-- A key read from a snapshot has its live permits counted only where its counter (an upper bound:
-- it counts ended permits until they are folded) leaves no room. A cost above a key's limits is
-- refused here with a wait of a second, as a waiter's is; the decision under the lock raises the
-- error. OX005 throttle_not_found. Runs under acquire_all's planner settings.
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
