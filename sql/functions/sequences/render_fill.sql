-- A template (render_template()) with the value v filled in at each number token: zero-padded to
-- the token's width, never truncated, the sign in front. A null v renders as nothing, as any
-- token whose value is null; a null template gives null. This is all of rendering that waits
-- for the value, so it is all that a taker does while it holds the counter.
--
-- One expression of plain SQL, which PostgreSQL inlines into the statement calling it when its
-- arguments are plain values (a variable, a column): filling in then costs no call and no plan
-- of its own, only the expression, which PostgreSQL prepares again in every transaction, so it
-- is kept short. The first number token is filled in place; a template with more passes the
-- rest to this function again (a call, made only for such a template).
CREATE OR REPLACE FUNCTION {{schema}}.render_fill(template text[], v bigint)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN cardinality(template) > 1 THEN
      template[1]
      || coalesce(CASE WHEN v < 0 THEN '-' ELSE '' END
                  || lpad(ltrim(v::text, '-'), greatest(length(ltrim(v::text, '-')), template[2]::integer), '0'), '')
      || CASE WHEN cardinality(template) = 3 THEN template[3] ELSE {{schema}}.render_fill(template[3:], v) END
    ELSE template[1] END
$$;
