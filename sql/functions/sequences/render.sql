-- The render() below, for callers that know no fiscal year (a year starting in January).
CREATE OR REPLACE FUNCTION {{schema}}.render(fmt text, v bigint, scope text, local_at timestamp) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT {{schema}}.render(fmt, v, scope, local_at, 1)
$$;

-- Renders a format such as 'INV-{YYYY}-{n:6}' for the value v (a null format: v as text). Date
-- tokens show local_at, the local date of the call in the sequence's time zone; {IYYY} is the
-- ISO week-numbering year that goes with {WW}; {FY} is the year in which the fiscal year
-- containing local_at starts (year_start: its first month), {FYE} the year in which it ends (with
-- year_start 1 both are the calendar year). The format is read in one pass, piece by piece
-- (format_pieces()), and a token's output is never read again: a scope containing braces is
-- never expanded, and no token can build another.
CREATE OR REPLACE FUNCTION {{schema}}.render(fmt text, v bigint, scope text, local_at timestamp, year_start integer)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN fmt IS NULL THEN v::text ELSE coalesce((
    SELECT string_agg(CASE
        WHEN piece = '{YYYY}' THEN to_char(local_at, 'YYYY')
        WHEN piece = '{YY}' THEN to_char(local_at, 'YY')
        WHEN piece = '{MM}' THEN to_char(local_at, 'MM')
        WHEN piece = '{DD}' THEN to_char(local_at, 'DD')
        WHEN piece = '{WW}' THEN to_char(local_at, 'IW')
        WHEN piece = '{IYYY}' THEN to_char(local_at, 'IYYY')
        WHEN piece = '{FY}' THEN to_char(local_at - make_interval(months => year_start - 1), 'YYYY')
        WHEN piece = '{FYE}' THEN
          to_char(local_at - make_interval(months => year_start - 1) + make_interval(years => (year_start > 1)::integer), 'YYYY')
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
