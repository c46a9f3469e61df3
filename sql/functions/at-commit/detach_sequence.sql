-- detach_sequence() below, waiting at most 5 seconds for the table.
CREATE OR REPLACE FUNCTION {{schema}}.detach_sequence(seq_name text, table_name text, column_name text) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
  SELECT {{schema}}.detach_sequence(seq_name, table_name, column_name, 5000)
$$;

-- Stops numbering column_name of table_name: drops the attachment's triggers and its trigger
-- function. Returns false when the column is not numbered; invalid_argument (OX003) when it is
-- numbered by another sequence, or lock_timeout_ms is not from 1 ms to 1 hour. DROP TRIGGER
-- needs the table alone (ACCESS EXCLUSIVE), so it waits for every transaction reading or writing
-- it, and every statement on the table arriving meanwhile queues behind it: the wait, the
-- table's attach advisory lock included, is bounded by lock_timeout_ms, past which nothing is
-- changed and the error (55P03, ordo's `timeout`) says why. Transactions that wrote the table
-- commit with the trigger in place, so every row they inserted is numbered. The caller's
-- lock_timeout is restored afterwards.
CREATE OR REPLACE FUNCTION {{schema}}.detach_sequence(seq_name text, table_name text, column_name text, lock_timeout_ms integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  rel regclass := {{schema}}.attachable_table(table_name);
  existing {{schema}}.attachments;
  numbering regprocedure;
  caller_lock_timeout text := current_setting('lock_timeout');
BEGIN
  IF lock_timeout_ms IS NULL OR lock_timeout_ms NOT BETWEEN 1 AND 3600000 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = format('the lock timeout must be from 1 ms to 1 hour (got %s)', coalesce(lock_timeout_ms::text, 'null'));
  END IF;
  PERFORM set_config('lock_timeout', lock_timeout_ms || 'ms', true);
  BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('ordo.attach:' || rel::oid, 0));
    SELECT * INTO existing FROM {{schema}}.attachments AS a
     WHERE a.table_name = rel AND a.column_name = detach_sequence.column_name;
    IF NOT FOUND THEN
      PERFORM set_config('lock_timeout', caller_lock_timeout, true);
      RETURN false;
    END IF;
    IF existing.sequence <> seq_name THEN
      RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
        'The column %I of %s is numbered by the sequence %L, not %L', column_name, rel, existing.sequence, seq_name);
    END IF;
    EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', rel);
  EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION USING ERRCODE = 'lock_not_available', MESSAGE = format(
      'detach did not get %s within %s ms: a transaction is reading or writing it, and removing its triggers needs the table alone (DROP TRIGGER). Nothing was changed; retry when that transaction has ended (pg_stat_activity names it), or give detach a longer lockTimeout',
      rel, lock_timeout_ms);
  END;
  SELECT t.tgfoid::regprocedure INTO numbering FROM pg_trigger AS t
   WHERE t.tgrelid = rel AND t.tgname = existing.trigger_name;
  EXECUTE format('DROP TRIGGER %I ON %s', existing.trigger_name, rel);
  EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', {{schema}}.attachment_trigger('zz_ordo_note_', column_name), rel);
  EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', {{schema}}.attachment_trigger('zz_ordo_note_update_', column_name), rel);
  -- The statement triggers an earlier schema's attachments may have (note_pending_counters()).
  EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', {{schema}}.attachment_trigger('ordo_note_i_', column_name), rel);
  EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', {{schema}}.attachment_trigger('ordo_note_u_', column_name), rel);
  EXECUTE format('DROP FUNCTION IF EXISTS %s', numbering);
  PERFORM set_config('lock_timeout', caller_lock_timeout, true);
  RETURN true;
END $$;
