-- The next value a batched sequence's storage will hand out.
CREATE OR REPLACE FUNCTION {{schema}}.storage_position(storage text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  last_value bigint;
  called boolean;
  step bigint;
BEGIN
  EXECUTE format('SELECT last_value, is_called FROM %s', storage) INTO last_value, called;
  SELECT seqincrement INTO step FROM pg_sequence WHERE seqrelid = storage::regclass;
  RETURN CASE WHEN called THEN last_value + step ELSE last_value END;
END $$;
