-- The checks of a request's items that do not depend on the moment: every throttle exists, no
-- (throttle, key) twice, texts within bounds, and no cost beyond the key's limits.
-- OX003 invalid_argument, OX005 throttle_not_found.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_check_items(names text[], keys text[], costs integer[], holder text)
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
