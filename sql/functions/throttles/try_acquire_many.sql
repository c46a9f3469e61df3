-- Decisions for many requests of one item of cost 1 each: request i asks throttle names[i] for key
-- keys[i], for holders[i] (null: application_name:pid). One row per request, decided in order
-- (acquire_all).
CREATE OR REPLACE FUNCTION {{schema}}.try_acquire_many(names text[], keys text[], holders text[])
RETURNS TABLE (request integer, granted boolean, permit_id uuid, holder text, acquired_at timestamptz,
               expires_at timestamptz, retry_after_ms bigint, reason text)
LANGUAGE sql VOLATILE AS $$
  SELECT a.request, a.granted, a.permit_id, a.holder, a.acquired_at, a.expires_at, a.retry_after_ms, a.reason
    FROM {{schema}}.acquire_all(ARRAY(SELECT generate_series(1, cardinality(names))), names, keys,
                                array_fill(1, ARRAY[cardinality(names)]), holders) AS a
$$;
