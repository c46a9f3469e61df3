-- The row triggers noting an attachment's counters (note_pending_row()), BEFORE, so that a WHEN
-- clause sees what the previous rows noted, and named to fire after the table's own BEFORE
-- triggers (alphabetical order), which may set the scope. PostgreSQL builds a trigger's WHEN
-- clause again for every statement that fires it, so each clause is as short as it can be. The
-- INSERT's skips a row of the counter noted last, the sequence's part of which is one literal.
-- The UPDATE's (a row whose column is still or again null) asks only that, and the function
-- compares: the UPDATE that writes a number at commit fires neither, but PostgreSQL builds the
-- WHEN clause of each UPDATE trigger for it, for every row.
CREATE OR REPLACE FUNCTION {{schema}}.create_note_trigger(rel regclass, seq_name text, column_name text, scope_column text)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  EXECUTE format(
    'CREATE TRIGGER %I BEFORE INSERT ON %s FOR EACH ROW WHEN (NEW.%I IS NULL AND current_setting(''ordo.pending_last'', true) IS DISTINCT FROM %s) EXECUTE FUNCTION {{schema}}.note_pending_row(%L, %L, %L)',
    {{schema}}.attachment_trigger('zz_ordo_note_', column_name), rel, column_name,
    CASE WHEN scope_column IS NULL THEN quote_literal(seq_name || chr(31))
         ELSE format('%L || coalesce(NEW.%I::text, '''')', seq_name || chr(31), scope_column) END,
    seq_name, column_name, coalesce(scope_column, ''));
  EXECUTE format(
    'CREATE TRIGGER %I BEFORE UPDATE ON %s FOR EACH ROW WHEN (NEW.%I IS NULL) EXECUTE FUNCTION {{schema}}.note_pending_row(%L, %L, %L)',
    {{schema}}.attachment_trigger('zz_ordo_note_update_', column_name), rel, column_name,
    seq_name, column_name, coalesce(scope_column, ''));
END $$;
