-- How long a token can render, null for a piece that is not a token: dates as to_char gives them
-- for any timestamp PostgreSQL holds (years up to 294276), numbers as a bigint with its sign, a
-- scope at its 200 characters.
CREATE OR REPLACE FUNCTION {{schema}}.token_width(piece text) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT AS $$
  SELECT CASE
    WHEN piece IN ('{YYYY}', '{IYYY}', '{FY}', '{FYE}') THEN 6
    WHEN piece IN ('{YY}', '{MM}', '{DD}', '{WW}') THEN 2
    WHEN piece = '{n}' THEN 20
    WHEN piece ~ '^\{n:([1-9]|1[0-9]|20)\}$' THEN 20
    WHEN piece = '{scope}' THEN 200
  END
$$;
