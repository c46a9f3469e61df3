-- A column of rel that the trigger may write, or invalid_argument saying why not.
CREATE OR REPLACE FUNCTION {{schema}}.attachable_column(rel regclass, col text, role text, category "char") RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
  att pg_attribute;
  cat "char";
BEGIN
  SELECT * INTO att FROM pg_attribute AS a WHERE a.attrelid = rel AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = format('The table %s has no column %s (the %s)', rel, coalesce(quote_literal(col), 'null'), role);
  END IF;
  IF category IS NULL THEN
    RETURN;
  END IF;
  SELECT typcategory INTO cat FROM pg_type WHERE oid = att.atttypid;
  IF cat <> category OR (category = 'N' AND att.atttypid NOT IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype, 'numeric'::regtype)) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('The column %I of %s (the %s) is %s: it must be %s',
      col, rel, role, format_type(att.atttypid, att.atttypmod),
      CASE WHEN category = 'N' THEN 'bigint, integer, smallint or numeric' ELSE 'text or varchar' END);
  END IF;
  IF att.atthasdef OR att.attidentity <> '' OR att.attgenerated <> '' THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The column %I of %s (the %s) has a default, identity or generation: rows would never reach the trigger with it null; drop it (ALTER TABLE %s ALTER COLUMN %I DROP DEFAULT / DROP IDENTITY / DROP EXPRESSION)',
      col, rel, role, rel, col);
  END IF;
  IF att.attnotnull THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The column %I of %s (the %s) is NOT NULL, but it is written as the transaction commits, after the insert: ALTER TABLE %s ALTER COLUMN %I DROP NOT NULL (after commit it is never null)',
      col, rel, role, rel, col);
  END IF;
END $$;
