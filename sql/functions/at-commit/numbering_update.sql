-- The UPDATE that numbers one row: given as SQL texts, the table, the sequence, the commit's
-- instant and the row's ctid (parameters for the built statement, constants and NEW.ctid in a
-- generated function). take_value() runs only for a row found still unnumbered at its ctid: a
-- row deleted or updated since (its later event numbers it) consumes nothing.
CREATE OR REPLACE FUNCTION {{schema}}.numbering_update(rel text, seq text, at text, row_ctid text,
                                            column_name text, scope_column text, text_column text)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT format(
    'UPDATE %s AS r SET (%s) = (SELECT %s FROM (SELECT {{schema}}.take_value(%s, %s, %s) AS v) AS t) WHERE r.ctid = %s AND r.%I IS NULL',
    rel,
    CASE WHEN text_column = '' THEN quote_ident(column_name) ELSE quote_ident(column_name) || ', ' || quote_ident(text_column) END,
    CASE WHEN text_column = '' THEN 't.v[1]::bigint' ELSE 't.v[1]::bigint, t.v[2]' END,
    seq,
    CASE WHEN scope_column = '' THEN '''''' ELSE format('coalesce(r.%I::text, '''')', scope_column) END,
    at, row_ctid, column_name)
$$;
