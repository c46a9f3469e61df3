-- What ends or loosens a throttle wakes those waiting on it: one NOTIFY per statement, only
-- when someone waits (NOTIFY serializes commits: the hot path without waiters never sends it).
CREATE OR REPLACE FUNCTION {{schema}}.throttle_freed(throttle_names text[]) RETURNS void
LANGUAGE sql VOLATILE AS $$
  SELECT pg_notify('ordo_throttles.{{schema_name}}', 'freed:' || x.n)
    FROM (SELECT DISTINCT u.n FROM unnest(throttle_names) AS u(n)) AS x
   WHERE EXISTS (SELECT 1 FROM {{schema}}.throttle_waiter_items AS i WHERE i.name = x.n)
$$;
