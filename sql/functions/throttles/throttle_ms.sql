-- Whole milliseconds, rounded up: sleeping that long is always enough.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_ms(d interval) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
  SELECT ceil(extract(epoch FROM d) * 1000)::bigint
$$;
