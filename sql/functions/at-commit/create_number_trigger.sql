-- An attachment's trigger function and its deferred constraint trigger, which numbers each row
-- whose column is null as its transaction commits, so the counter's row lock is held for the
-- commit only. The trigger's arguments (sequence, column, scope column, text column; '' for
-- none) are the registry: the view `attachments` reads them (trigger_args()).
--
-- The function has the table's and columns' names written in, so plpgsql plans its UPDATE
-- (numbering_update()) once per session and keeps it. It runs that UPDATE when the trigger fires
-- on the table under those names at READ COMMITTED, and number_row() otherwise: for a table
-- renamed or moved since, for a partition (whose cloned trigger calls the parent's function),
-- and at REPEATABLE READ or SERIALIZABLE. Either way a commit numbering two counters or more
-- first locks their stripes (counters_to_lock()).
CREATE OR REPLACE FUNCTION {{schema}}.create_number_trigger(rel regclass, seq_name text, column_name text,
                                                 scope_column text, text_column text)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  schema_name name;
  table_name name;
  -- A name of its own: one derived from the table's oid would be another table's after a
  -- restore into a new cluster, and an attach there would replace the restored one's function.
  fn text := 'number_at_commit_' || replace(gen_random_uuid()::text, '-', '');
BEGIN
  SELECT n.nspname, c.relname INTO schema_name, table_name
    FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE c.oid = rel;
  EXECUTE format($create$
CREATE FUNCTION {{schema}}.%I() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $number$
BEGIN
  IF TG_TABLE_NAME = %L AND TG_TABLE_SCHEMA = %L AND current_setting('transaction_isolation') = 'read committed' THEN
    IF {{schema}}.counters_to_lock() THEN
      PERFORM {{schema}}.lock_pending_counters();
    END IF;
    %s;
    RETURN NULL;
  END IF;
  PERFORM {{schema}}.number_row(TG_RELID, TG_ARGV[0], TG_ARGV[1], TG_ARGV[2], TG_ARGV[3], NEW.ctid, %s);
  RETURN NULL;
END $number$
$create$,
    fn, table_name, schema_name,
    {{schema}}.numbering_update(format('%I.%I', schema_name, table_name), quote_literal(seq_name),
                                '{{schema}}.commit_instant()', 'NEW.ctid',
                                column_name, coalesce(scope_column, ''), coalesce(text_column, '')),
    CASE WHEN scope_column IS NULL THEN '''''' ELSE format('coalesce(NEW.%I::text, '''')', scope_column) END);
  EXECUTE format(
    'CREATE CONSTRAINT TRIGGER %I AFTER INSERT OR UPDATE ON %s DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.%I IS NULL) EXECUTE FUNCTION {{schema}}.%I(%L, %L, %L, %L)',
    {{schema}}.attachment_trigger('ordo_number_', column_name), rel, column_name, fn, seq_name, column_name,
    coalesce(scope_column, ''), coalesce(text_column, ''));
END $$;
