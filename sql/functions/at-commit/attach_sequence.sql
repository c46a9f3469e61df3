-- From now on every row written to table_name whose column_name is null gets the next value of
-- seq_name as its transaction commits (scope from scope_column, text in text_column): the
-- attachment's own trigger function and deferred trigger (create_number_trigger()), and the
-- trigger noting its counters (create_note_trigger()). Returns false when exactly this
-- attachment exists already. Waits for transactions writing the table (CREATE TRIGGER's lock);
-- rows they inserted keep their null. Trigger functions of dropped tables' attachments are
-- dropped on the way (drop_unused_numbering_functions()).
--
-- Locks: the sequence's row FOR KEY SHARE, then an advisory lock per table taken by every attach
-- and detach of it. Raises sequence_not_found (OX001), and invalid_argument (OX003) for a batched
-- sequence, a column that cannot be numbered or scoped, or one numbered already (by another
-- attachment, or through the partitioned table it belongs to).
CREATE OR REPLACE FUNCTION {{schema}}.attach_sequence(seq_name text, table_name text, column_name text,
                                                      scope_column text DEFAULT NULL, text_column text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  s {{schema}}.sequences;
  rel regclass := {{schema}}.attachable_table(table_name);
  existing {{schema}}.attachments;
BEGIN
  -- Held until this transaction ends: a removal or a change of kind (FOR UPDATE) waits for it,
  -- then sees the attachment.
  SELECT * INTO s FROM {{schema}}.sequences AS d WHERE d.name = seq_name FOR KEY SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX001', MESSAGE = format('The sequence %L does not exist', seq_name);
  END IF;
  IF s.kind <> 'gapless' THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The sequence %L is batched: only a gapless sequence can number rows at commit', seq_name);
  END IF;
  PERFORM {{schema}}.attachable_column(rel, column_name, 'numbered column', 'N');
  IF scope_column IS NOT NULL THEN
    PERFORM {{schema}}.attachable_scope(rel, scope_column);
  END IF;
  IF text_column IS NOT NULL THEN
    PERFORM {{schema}}.attachable_column(rel, text_column, 'text column', 'S');
    IF text_column = column_name THEN
      RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = 'the text column must be another column than the numbered one';
    END IF;
  END IF;
  -- One lock for every attach and detach of this table, so two cannot race past the check below.
  PERFORM pg_advisory_xact_lock(hashtextextended('ordo.attach:' || rel::oid, 0));
  SELECT * INTO existing FROM {{schema}}.attachments AS a
   WHERE a.table_name = rel AND a.column_name = attach_sequence.column_name;
  IF FOUND THEN
    IF existing.sequence = seq_name AND existing.scope_column IS NOT DISTINCT FROM attach_sequence.scope_column
       AND existing.text_column IS NOT DISTINCT FROM attach_sequence.text_column THEN
      RETURN false;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The column %I of %s is numbered by the sequence %L already (scope column %s, text column %s): detach it first',
      column_name, rel, existing.sequence, coalesce(existing.scope_column, 'none'), coalesce(existing.text_column, 'none'));
  END IF;
  IF EXISTS (SELECT 1 FROM pg_inherits AS i JOIN {{schema}}.attachments AS a ON a.table_name = i.inhparent
              WHERE i.inhrelid = rel AND a.column_name = attach_sequence.column_name) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The column %I of %s is numbered already through the partitioned table it belongs to', column_name, rel);
  END IF;
  PERFORM {{schema}}.drop_unused_numbering_functions();
  PERFORM {{schema}}.create_number_trigger(rel, seq_name, column_name, scope_column, text_column);
  PERFORM {{schema}}.create_note_trigger(rel, seq_name, column_name, scope_column);
  RETURN true;
END $$;
