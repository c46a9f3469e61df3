-- Formats are read in one pass, token by token, from the format itself: a token's output is
-- never read again. The first render() replaced tokens one kind after another, so a format
-- such as '{n:{YYYY}{MM}{DD}}' became '{n:20261123}' and then a 20-million-digit number.

-- The pieces of a format: tokens ({...} without inner braces), runs of literal text, and
-- stray braces, in order.
CREATE FUNCTION {{schema}}.format_pieces(fmt text) RETURNS TABLE (piece text, ord bigint)
LANGUAGE sql IMMUTABLE STRICT AS $$
  SELECT m[1], n FROM regexp_matches(fmt, '(\{[^{}]*\}|[^{}]+|[{}])', 'g') WITH ORDINALITY AS t(m, n)
$$;

-- How long a token can render: dates as to_char gives them for any timestamp PostgreSQL
-- holds (years up to 294276), numbers as a bigint with its sign, a scope at its 200 characters.
CREATE FUNCTION {{schema}}.token_width(piece text) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT AS $$
  SELECT CASE
    WHEN piece IN ('{YYYY}', '{IYYY}') THEN 6
    WHEN piece IN ('{YY}', '{MM}', '{DD}', '{WW}') THEN 2
    WHEN piece = '{n}' THEN 20
    WHEN piece ~ '^\{n:([1-9]|1[0-9]|20)\}$' THEN 20
    WHEN piece = '{scope}' THEN 200
  END
$$;

-- The longest text a format can render; null when the format is not valid.
CREATE FUNCTION {{schema}}.format_max_length(fmt text) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT AS $$
  SELECT CASE WHEN bool_and(piece !~ '[{}]' OR {{schema}}.token_width(piece) IS NOT NULL)
              THEN sum(CASE WHEN piece ~ '[{}]' THEN {{schema}}.token_width(piece) ELSE length(piece) END)::integer
         END
  FROM {{schema}}.format_pieces(fmt)
$$;

-- A definition's format, checked where every client's definitions land: braces only enclose
-- known tokens, a number token is present, and the rendered text is bounded.
CREATE FUNCTION {{schema}}.check_format(fmt text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  bad text;
  longest integer;
BEGIN
  IF fmt IS NULL THEN
    RETURN true;
  END IF;
  IF length(fmt) NOT BETWEEN 1 AND 200 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = 'format must be a text of 1 to 200 characters';
  END IF;
  SELECT piece INTO bad FROM {{schema}}.format_pieces(fmt)
   WHERE piece ~ '[{}]' AND {{schema}}.token_width(piece) IS NULL ORDER BY ord LIMIT 1;
  IF bad IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'format has %s; braces only enclose the tokens {YYYY} {YY} {MM} {DD} {WW} {IYYY} {scope} {n} {n:W} (W: a width from 1 to 20)',
      CASE WHEN length(bad) = 1 THEN format('a stray %L', bad) ELSE 'an unknown token ' || bad END);
  END IF;
  IF NOT EXISTS (SELECT 1 FROM {{schema}}.format_pieces(fmt) WHERE piece ~ '^\{n(:[0-9]+)?\}$') THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = 'format must contain {n} or {n:W}';
  END IF;
  longest := {{schema}}.format_max_length(fmt);
  IF longest > 1000 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'format may render up to %s characters; at most 1000 are allowed (each {scope} may take 200)', longest);
  END IF;
  RETURN true;
END $$;

-- NOT VALID: definitions stored before this check keep working (render() below is safe for
-- any text); every new or changed definition is checked.
ALTER TABLE {{schema}}.sequences
  ADD CONSTRAINT sequences_format_bounded CHECK ({{schema}}.check_format(format)) NOT VALID;

CREATE OR REPLACE FUNCTION {{schema}}.render(fmt text, v bigint, scope text, local_at timestamp) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN fmt IS NULL THEN v::text ELSE coalesce((
    SELECT string_agg(CASE
        WHEN piece = '{YYYY}' THEN to_char(local_at, 'YYYY')
        WHEN piece = '{YY}' THEN to_char(local_at, 'YY')
        WHEN piece = '{MM}' THEN to_char(local_at, 'MM')
        WHEN piece = '{DD}' THEN to_char(local_at, 'DD')
        WHEN piece = '{WW}' THEN to_char(local_at, 'IW')
        WHEN piece = '{IYYY}' THEN to_char(local_at, 'IYYY')
        WHEN piece = '{scope}' THEN scope
        WHEN piece = '{n}' THEN v::text
        -- Zero-padded to W digits, never truncated; the sign goes in front.
        WHEN piece ~ '^\{n:([1-9]|1[0-9]|20)\}$' THEN
          CASE WHEN v < 0 THEN '-' ELSE '' END ||
          lpad(ltrim(v::text, '-'), greatest(length(ltrim(v::text, '-')), rtrim(substring(piece FROM 4), '}')::integer), '0')
        ELSE piece
      END, '' ORDER BY ord)
    FROM {{schema}}.format_pieces(fmt)), '') END
$$;
