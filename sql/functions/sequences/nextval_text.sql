-- The text of the next value of a gapless sequence (take() of one value): the format rendered,
-- or the number as text. A batched sequence fails in take() (OX004).
CREATE OR REPLACE FUNCTION {{schema}}.nextval_text(seq_name text, seq_scope text DEFAULT '', at timestamptz DEFAULT now())
RETURNS text
LANGUAGE sql VOLATILE AS $$
  SELECT t.text FROM {{schema}}.take(seq_name, seq_scope, at, 1) AS t
$$;
