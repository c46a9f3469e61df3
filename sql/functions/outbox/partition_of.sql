-- Which partition of `parts` a key belongs to. Messages without a key share one place, as if
-- their key were the empty text, so they keep their order too.
CREATE OR REPLACE FUNCTION {{schema}}.partition_of(msg_key text, parts integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE WHEN parts <= 1 THEN 0
              ELSE (((hashtextextended(coalesce(msg_key, ''), 0) % parts) + parts) % parts)::integer END
$$;
