-- The table named by a caller, or invalid_argument saying what to write instead.
CREATE OR REPLACE FUNCTION {{schema}}.attachable_table(table_name text) RETURNS regclass
LANGUAGE plpgsql STABLE AS $$
DECLARE
  rel regclass;
  kind "char";
BEGIN
  BEGIN
    rel := to_regclass(table_name);
  EXCEPTION WHEN OTHERS THEN
    rel := NULL;
  END;
  IF rel IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The table %s does not exist: give its name as schema.table (quoted as in SQL when it needs quotes), or create it first',
      coalesce(quote_literal(table_name), 'null'));
  END IF;
  SELECT relkind INTO kind FROM pg_class WHERE oid = rel;
  IF kind NOT IN ('r', 'p') THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = format('%s is not a table (a view, a sequence or a foreign table cannot be numbered)', rel);
  END IF;
  RETURN rel;
END $$;
