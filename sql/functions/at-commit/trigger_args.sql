-- The arguments of a trigger, as CREATE TRIGGER was given them (pg_trigger keeps them as
-- NUL-terminated bytes, which no text can hold).
CREATE OR REPLACE FUNCTION {{schema}}.trigger_args(args bytea) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT AS $$
  SELECT coalesce(array_agg(convert_from(substring(args FROM z.prev + 1 FOR z.i - z.prev - 1), 'UTF8') ORDER BY z.i), '{}')
  FROM (SELECT i, coalesce(lag(i) OVER (ORDER BY i), 0) AS prev
          FROM generate_series(1, length(args)) AS i WHERE get_byte(args, i - 1) = 0) AS z
$$;
