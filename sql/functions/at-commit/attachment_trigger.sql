-- The name of one of an attachment's triggers: the prefix and the column, within 63 bytes.
CREATE OR REPLACE FUNCTION {{schema}}.attachment_trigger(prefix text, column_name text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN octet_length(prefix || column_name) <= 63 THEN prefix || column_name ELSE prefix || md5(column_name) END
$$;
