-- Everything of a rendered format but its number (see render()): what is known before a value
-- is taken, so that a taker renders it before it queues on the counter and, once the counter
-- gives the value, only fills the number in (render_fill()) while the counter is held. The
-- result alternates literal text and number tokens: {text, width, text, …, width, text}, an odd
-- number of elements, where each width is that of an {n:W} ('1' for {n}, which renders the same)
-- and each text holds the tokens and literals between two number tokens, already rendered. A
-- null format has no template (render() gives the value as text).
--
-- The format is read in one pass, piece by piece (format_pieces()), and a token's output is
-- never read again: a scope containing braces, or a number token's text, is never expanded. A
-- token whose value is null (a null scope, date or fiscal year) renders as nothing. Date tokens
-- show local_at, the local date of the call in the sequence's time zone; {IYYY} is the ISO
-- week-numbering year that goes with {WW}; {FY} is the year in which the fiscal year containing
-- local_at starts (year_start: its first month), {FYE} the year in which it ends (with
-- year_start 1 both are the calendar year).
--
-- plpgsql, whose statements keep their plans for the session: a SQL function that cannot be
-- inlined is parsed and planned again in every statement that calls it.
CREATE OR REPLACE FUNCTION {{schema}}.render_template(fmt text, scope text, local_at timestamp, year_start integer)
RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  parts text[] := ARRAY[''];
  last integer := 1;
  piece text;
BEGIN
  IF fmt IS NULL THEN
    RETURN NULL;
  END IF;
  FOR piece IN SELECT p.piece FROM {{schema}}.format_pieces(fmt) AS p ORDER BY p.ord LOOP
    IF piece = '{n}' THEN
      parts := parts || ARRAY['1', ''];
      last := last + 2;
    ELSIF piece ~ '^\{n:([1-9]|1[0-9]|20)\}$' THEN
      parts := parts || ARRAY[rtrim(substring(piece FROM 4), '}'), ''];
      last := last + 2;
    ELSE
      -- Date tokens in one to_char() (each token names its pattern, {WW} as IW): the expression
      -- is prepared again in every transaction, at a cost that grows with its calls.
      parts[last] := parts[last] || coalesce(CASE
          WHEN piece IN ('{YYYY}', '{YY}', '{MM}', '{DD}', '{WW}', '{IYYY}') THEN
            to_char(local_at, replace(btrim(piece, '{}'), 'WW', 'IW'))
          WHEN piece IN ('{FY}', '{FYE}') THEN
            to_char(local_at - make_interval(months => year_start - 1)
                    + make_interval(years => (piece = '{FYE}' AND year_start > 1)::integer), 'YYYY')
          WHEN piece = '{scope}' THEN scope
          ELSE piece
        END, '');
    END IF;
  END LOOP;
  RETURN parts;
END $$;
