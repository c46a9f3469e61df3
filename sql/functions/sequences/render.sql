-- The render() below, for callers that know no fiscal year (a year starting in January).
CREATE OR REPLACE FUNCTION {{schema}}.render(fmt text, v bigint, scope text, local_at timestamp) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT {{schema}}.render(fmt, v, scope, local_at, 1)
$$;

-- Renders a format such as 'INV-{YYYY}-{n:6}' for the value v (a null format: v as text): its
-- template, everything but the number (render_template(), which says what each token shows),
-- with v filled in (render_fill()). A taker that holds a counter while it renders calls the two
-- apart, the template before it takes the counter; this is the same two steps, so that every
-- text of a format is rendered one way. The template is held in a variable, which lets
-- render_fill() be inlined here as in the takers.
CREATE OR REPLACE FUNCTION {{schema}}.render(fmt text, v bigint, scope text, local_at timestamp, year_start integer)
RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  template text[] := {{schema}}.render_template(fmt, scope, local_at, year_start);
BEGIN
  RETURN CASE WHEN fmt IS NULL THEN v::text ELSE {{schema}}.render_fill(template, v) END;
END $$;
