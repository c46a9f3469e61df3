-- The pieces of a format: tokens ({...} without inner braces), runs of literal text, and
-- stray braces, in order.
CREATE OR REPLACE FUNCTION {{schema}}.format_pieces(fmt text) RETURNS TABLE (piece text, ord bigint)
LANGUAGE sql IMMUTABLE STRICT AS $$
  SELECT m[1], n FROM regexp_matches(fmt, '(\{[^{}]*\}|[^{}]+|[{}])', 'g') WITH ORDINALITY AS t(m, n)
$$;
