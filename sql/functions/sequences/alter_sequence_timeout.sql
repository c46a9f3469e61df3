-- SurrealQL's ALTER SEQUENCE … TIMEOUT d | DROP TIMEOUT: sets a sequence's TIMEOUT (null: none).
-- Returns false when there is no such sequence. Every node is told, so that its running supply
-- uses the new TIMEOUT; the epoch stays, and with it the ranges the nodes hold.
CREATE OR REPLACE FUNCTION {{schema}}.alter_sequence_timeout(seq_name text, new_timeout_ms bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  UPDATE {{schema}}.sequences AS d SET timeout_ms = new_timeout_ms, updated_at = now() WHERE d.name = seq_name;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  PERFORM pg_notify('ordo_sequences.{{schema_name}}', seq_name);
  RETURN true;
END $$;
