-- Removes a sequence with its counters, idempotency records and range ownership rows (they go
-- with the definition's row) and its storage, and tells every node. Returns false when there is
-- no such sequence. A sequence that numbers a table at commit is not removed under it (its
-- writers' commits would fail): invalid_argument (OX003). The row is locked FOR UPDATE before
-- that check: an attach in flight holds it FOR KEY SHARE, so the removal waits for it to commit
-- and then sees its attachment.
CREATE OR REPLACE FUNCTION {{schema}}.remove_sequence(seq_name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  old {{schema}}.sequences;
  used text;
BEGIN
  PERFORM 1 FROM {{schema}}.sequences AS d WHERE d.name = seq_name FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  SELECT string_agg(format('%s(%I)', a.table_name, a.column_name), ', ') INTO used
    FROM {{schema}}.attachments AS a WHERE a.sequence = seq_name;
  IF used IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The sequence %L numbers %s at commit: detach it first (ordo.sequences.detach)', seq_name, used);
  END IF;
  DELETE FROM {{schema}}.sequences AS d WHERE d.name = seq_name RETURNING d.* INTO old;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  IF old.storage IS NOT NULL THEN
    EXECUTE format('DROP SEQUENCE IF EXISTS %s', old.storage);
  END IF;
  PERFORM pg_notify('ordo_sequences.{{schema_name}}', seq_name);
  RETURN true;
END $$;
