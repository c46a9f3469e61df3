-- A throttle key as one text: its name and key joined by chr(31), which no name holds. Inlined
-- into the plans that use it.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_pair(throttle_name text, throttle_key text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT throttle_name || chr(31) || throttle_key
$$;
