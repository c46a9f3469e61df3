-- The last position handed out (by any transaction, committed or not), 0 before the first.
CREATE OR REPLACE FUNCTION {{schema}}.last_position() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
  SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('{{schema}}.messages', 'position')::regclass), 0)
$$;
