-- The emission interval of a bucket, in whole microseconds rounded up, so that rate_limit
-- tokens never take less than per_ms.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_cost(rate_limit integer, per_ms bigint) RETURNS interval
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN rate_limit IS NOT NULL THEN ceil(per_ms * 1000.0 / rate_limit)::float8 * interval '1 microsecond' END
$$;
