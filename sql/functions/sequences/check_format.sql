-- A definition's format, checked where every client's definitions land (the CHECK constraint
-- sequences_format_bounded): null (no format), or a text of 1 to 200 characters whose braces
-- enclose only known tokens, with a number token ({n} or {n:W}), and whose rendered text is at
-- most 1000 characters long (format_max_length()). Raises invalid_argument (OX003) naming the
-- first fault; returns true.
CREATE OR REPLACE FUNCTION {{schema}}.check_format(fmt text) RETURNS boolean
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
      'format has %s; braces only enclose the tokens {YYYY} {YY} {MM} {DD} {WW} {IYYY} {FY} {FYE} {scope} {n} {n:W} (W: a width from 1 to 20)',
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
