-- A scope column of rel, or invalid_argument (OX003) saying why not. Its text must not depend on
-- the session: a date's follows DateStyle, a timestamp's TimeZone, a float's extra_float_digits,
-- and the same row would be numbered in another counter from another session. So its type (or a
-- domain's base type) is text, varchar, an integer or uuid.
CREATE OR REPLACE FUNCTION {{schema}}.attachable_scope(rel regclass, col text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
  typ oid;
  base oid;
BEGIN
  PERFORM {{schema}}.attachable_column(rel, col, 'scope column', NULL);
  SELECT a.atttypid INTO typ FROM pg_attribute AS a WHERE a.attrelid = rel AND a.attname = col AND a.attnum > 0;
  base := typ;
  WHILE (SELECT t.typtype FROM pg_type AS t WHERE t.oid = base) = 'd' LOOP
    SELECT t.typbasetype INTO base FROM pg_type AS t WHERE t.oid = base;
  END LOOP;
  IF base NOT IN ('text'::regtype, 'varchar'::regtype, 'int2'::regtype, 'int4'::regtype, 'int8'::regtype, 'uuid'::regtype) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The column %I of %s (the scope column) is %s: it must be text, varchar, smallint, integer, bigint or uuid, whose text is the same in every session (the text of a date, a timestamp or a float depends on DateStyle, TimeZone or extra_float_digits)',
      col, rel, format_type(typ, NULL));
  END IF;
END $$;
