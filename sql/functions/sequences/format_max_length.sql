-- The longest text a format can render; null when the format is not valid.
CREATE OR REPLACE FUNCTION {{schema}}.format_max_length(fmt text) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT AS $$
  SELECT CASE WHEN bool_and(piece !~ '[{}]' OR {{schema}}.token_width(piece) IS NOT NULL)
              THEN sum(CASE WHEN piece ~ '[{}]' THEN {{schema}}.token_width(piece) ELSE length(piece) END)::integer
         END
  FROM {{schema}}.format_pieces(fmt)
$$;
