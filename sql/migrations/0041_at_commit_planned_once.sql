-- ordo 0041: numbering at commit runs a statement planned once per session, not one built,
-- parsed and planned for every row, and notes a transaction's first counter with one setting.
--
-- 1. number_at_commit() built the UPDATE that writes a row's number with format() and ran it
--    with EXECUTE: parsed, analysed and planned again for every row numbered (about 200,000
--    instructions a row, callgrind, PostgreSQL 15). Each attachment now has a trigger function
--    of its own, written by attach_sequence() with the table's and columns' names in it, whose
--    UPDATE plpgsql plans once per session and keeps. Its names are checked against the table
--    the trigger fires on (TG_TABLE_SCHEMA, TG_TABLE_NAME, two comparisons of names): a table
--    renamed or moved to another schema since, and the partitions of a partitioned table (whose
--    cloned triggers call the parent's function), take the way every row took before, the
--    statement built for TG_RELID (number_row()). So do REPEATABLE READ and SERIALIZABLE
--    commits, which need 0013's and 0028's subtransaction and note. One function writes the
--    statement for both ways (numbering_update()).
-- 2. Both ways take the number with take_value(), the in-transaction mode's take (an UPDATE of
--    the counter by its key, 0038; take() for a new counter, the maximum and every error), where
--    number_at_commit() called take() (an INSERT ... ON CONFLICT and a set-returning call). So a
--    numbered commit is now durable whatever synchronous_commit says, as a transaction taking a
--    number in the transaction always was (0018): a commit acknowledged and then lost in a crash
--    would give its numbers to the next rows, after the application had read them.
-- 3. The note of a transaction's counters (0034) costs one setting for the first counter, where
--    it wrote three and computed a stripe: stripes are noted from the second counter on (the
--    first one's with them, read from ordo.pending_last), and a commit locks them only then
--    (counters_to_lock(), asked before lock_pending_counters() is called, not in it). The note's
--    INSERT trigger compares with one literal, where `'seq' || chr(31)` was folded again for
--    every statement, and its UPDATE trigger is a trigger of its own (below). No transaction
--    noted the 0034 way outlives this migration: the loop at the end drops every attachment's
--    triggers, which waits for every transaction that wrote the table (ACCESS EXCLUSIVE).
--
-- callgrind (`npx tsx bench/instructions.ts attach`, one backend, an INSERT of one row, each its
-- own transaction): see the README for the counts before and after.
--
-- The functions are named number_at_commit_<a random uuid>; detach_sequence() drops the one its
-- trigger calls. A table dropped takes its triggers with it but not their function:
-- attach_sequence() drops such functions, no longer called by any trigger.
--
-- Custom SQLSTATEs: none new.

-- The UPDATE that numbers one row: given as SQL texts, the table, the sequence, the commit's
-- instant and the row's ctid (parameters for the built statement, constants and NEW.ctid in a
-- generated function). take_value() runs only for a row found still unnumbered at its ctid: a
-- row deleted or updated since (its later event numbers it) consumes nothing.
CREATE FUNCTION {{schema}}.numbering_update(rel text, seq text, at text, row_ctid text,
                                            column_name text, scope_column text, text_column text)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT format(
    'UPDATE %s AS r SET (%s) = (SELECT %s FROM (SELECT {{schema}}.take_value(%s, %s, %s) AS v) AS t) WHERE r.ctid = %s AND r.%I IS NULL',
    rel,
    CASE WHEN text_column = '' THEN quote_ident(column_name) ELSE quote_ident(column_name) || ', ' || quote_ident(text_column) END,
    CASE WHEN text_column = '' THEN 't.v[1]::bigint' ELSE 't.v[1]::bigint, t.v[2]' END,
    seq,
    CASE WHEN scope_column = '' THEN '''''' ELSE format('coalesce(r.%I::text, '''')', scope_column) END,
    at, row_ctid, column_name)
$$;

-- Whether this commit must lock its counters' stripes before it numbers a row: it numbers two
-- counters or more (note_pending_row()), and has not locked them yet. One expression, inlined
-- into the plpgsql that asks (calling lock_pending_counters() to ask cost 24,000 instructions).
CREATE FUNCTION {{schema}}.counters_to_lock() RETURNS boolean
LANGUAGE sql STABLE AS $$
  SELECT current_setting('ordo.pending_many', true) = 'yes'
     AND current_setting('ordo.counters_locked', true) IS DISTINCT FROM 'yes'
$$;

-- Numbers one row the way that works for any table, isolation and name: the statement built for
-- rel and run with EXECUTE (as number_at_commit() did, 0028). At REPEATABLE READ or SERIALIZABLE,
-- the first row of each counter is numbered in a subtransaction that names the counter when
-- PostgreSQL refuses the update; the last 64 counters numbered are noted so that their later
-- rows skip it.
CREATE FUNCTION {{schema}}.number_row(rel regclass, seq_name text, column_name text, scope_column text,
                                      text_column text, row_ctid tid, seq_scope text)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  numbering text := {{schema}}.numbering_update(rel::text, '$1', '$2', '$3', column_name, scope_column, text_column);
  counter text;
  taken text;
  numbered integer;
BEGIN
  IF {{schema}}.counters_to_lock() THEN
    PERFORM {{schema}}.lock_pending_counters();
  END IF;
  IF current_setting('transaction_isolation') = 'read committed' THEN
    EXECUTE numbering USING seq_name, {{schema}}.commit_instant(), row_ctid;
    RETURN;
  END IF;

  counter := seq_name || chr(31) || seq_scope;
  taken := coalesce(current_setting('ordo.counters_taken', true), '');
  IF strpos(chr(30) || taken || chr(30), chr(30) || counter || chr(30)) > 0 THEN
    EXECUTE numbering USING seq_name, {{schema}}.commit_instant(), row_ctid;
    RETURN;
  END IF;
  BEGIN
    EXECUTE numbering USING seq_name, {{schema}}.commit_instant(), row_ctid;
    GET DIAGNOSTICS numbered = ROW_COUNT;
  EXCEPTION WHEN serialization_failure THEN
    RAISE EXCEPTION USING ERRCODE = 'serialization_failure', SCHEMA = '{{schema_name}}', TABLE = 'counters',
      MESSAGE = format(
        'The sequence %L numbers %s at commit, and another transaction numbered the same counter (scope %L) after this %s transaction took its snapshot: PostgreSQL lets no transaction update a row its snapshot does not show. Retry the transaction, as for any serialization failure (SQLSTATE 40001), or write %s at READ COMMITTED, where numbering at commit never fails this way',
        seq_name, rel, seq_scope, upper(current_setting('transaction_isolation')), rel),
      DETAIL = SQLERRM,
      HINT = 'Numbering at commit is made for READ COMMITTED; a REPEATABLE READ or SERIALIZABLE transaction commits only when no other numbered its counter since its first statement.';
  END;
  IF numbered > 0 THEN
    taken := CASE WHEN taken = '' THEN counter ELSE taken || chr(30) || counter END;
    IF cardinality(string_to_array(taken, chr(30))) > 64 THEN
      taken := substr(taken, strpos(taken, chr(30)) + 1);
    END IF;
    PERFORM set_config('ordo.counters_taken', taken, true);
  END IF;
END $$;

-- An attachment's trigger function and its deferred trigger (arguments as 0009's: sequence,
-- column, scope column, text column; '' for none). The function runs the UPDATE written here
-- for the table under the names it has now, and number_row() for any other.
CREATE FUNCTION {{schema}}.create_number_trigger(rel regclass, seq_name text, column_name text,
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

-- Trigger functions of attachments whose table was dropped (or whose trigger was dropped by
-- hand): no trigger calls them. One another role made stays, for an attach of that role (only
-- its owner may drop it).
CREATE FUNCTION {{schema}}.drop_unused_numbering_functions() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  f regprocedure;
BEGIN
  FOR f IN SELECT p.oid::regprocedure FROM pg_proc AS p
            WHERE p.pronamespace = '{{schema}}'::regnamespace AND p.proname LIKE 'number\_at\_commit\_%'
              AND NOT EXISTS (SELECT 1 FROM pg_trigger AS t WHERE t.tgfoid = p.oid)
              AND pg_has_role(p.proowner, 'USAGE') LOOP
    EXECUTE format('DROP FUNCTION IF EXISTS %s', f);
  END LOOP;
END $$;

-- 3. As in 0034, noting a second counter's stripes only: the first counter costs one setting.
CREATE OR REPLACE FUNCTION {{schema}}.note_pending_row() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  last text := coalesce(current_setting('ordo.pending_last', true), '');
  scope text := '';
  counter text;
  pending text;
  stripe text;
BEGIN
  IF TG_ARGV[2] <> '' THEN
    EXECUTE format('SELECT coalesce(($1).%I::text, '''')', TG_ARGV[2]) INTO scope USING NEW;
  END IF;
  counter := TG_ARGV[0] || chr(31) || scope;
  IF counter = last THEN
    RETURN NEW;
  END IF;
  IF last <> '' THEN
    -- Another counter than the last noted: this commit numbers two or more, and locks the
    -- stripes of all of them, the first one's too.
    pending := coalesce(current_setting('ordo.pending_stripes', true), '');
    IF pending = '' THEN
      pending := ',' || {{schema}}.counter_stripe(split_part(last, chr(31), 1), split_part(last, chr(31), 2)) || ',';
    END IF;
    stripe := {{schema}}.counter_stripe(TG_ARGV[0], scope)::text;
    IF strpos(pending, ',' || stripe || ',') = 0 THEN
      pending := pending || stripe || ',';
    END IF;
    PERFORM set_config('ordo.pending_stripes', pending, true);
    PERFORM set_config('ordo.pending_many', 'yes', true);
  END IF;
  PERFORM set_config('ordo.pending_last', counter, true);
  RETURN NEW;
END $$;

-- As in 0034, in two triggers. An INSERT's skips a row of the counter noted last, the
-- sequence's part of which is now one literal. An UPDATE's (a row whose column is still or again
-- null) asks only that, and the function compares: the UPDATE that writes a number at commit
-- fires neither, but PostgreSQL builds the WHEN clause of each UPDATE trigger for it, for every
-- row, and the longer clause cost 27,000 instructions more.
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

-- As in 0013, with the attachment's own trigger function (create_number_trigger()), and the
-- functions of dropped tables' attachments dropped.
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

-- As in 0013, and the attachment's trigger function dropped with its trigger.
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
  -- The statement triggers of attachments made before 0013.
  EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', {{schema}}.attachment_trigger('ordo_note_i_', column_name), rel);
  EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', {{schema}}.attachment_trigger('ordo_note_u_', column_name), rel);
  EXECUTE format('DROP FUNCTION IF EXISTS %s', numbering);
  PERFORM set_config('lock_timeout', caller_lock_timeout, true);
  RETURN true;
END $$;

-- Every attachment's triggers made again: its own trigger function, and the note's new WHEN.
DO $$
DECLARE
  a record;
BEGIN
  FOR a IN SELECT * FROM {{schema}}.attachments LOOP
    EXECUTE format('DROP TRIGGER %I ON %s', a.trigger_name, a.table_name);
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s',
                   {{schema}}.attachment_trigger('zz_ordo_note_', a.column_name), a.table_name);
    PERFORM {{schema}}.create_number_trigger(a.table_name, a.sequence, a.column_name, a.scope_column, a.text_column);
    PERFORM {{schema}}.create_note_trigger(a.table_name, a.sequence, a.column_name, a.scope_column);
  END LOOP;
END $$;

-- As in 0009: every column numbered at commit, now by the attachments' own trigger functions.
CREATE OR REPLACE VIEW {{schema}}.attachments AS
  SELECT a[1] AS sequence, t.tgrelid::regclass AS table_name, a[2] AS column_name,
         nullif(a[3], '') AS scope_column, nullif(a[4], '') AS text_column, t.tgname AS trigger_name
  FROM pg_trigger AS t
  JOIN pg_proc AS p ON p.oid = t.tgfoid
  CROSS JOIN LATERAL (SELECT {{schema}}.trigger_args(t.tgargs) AS a) AS x
  WHERE p.pronamespace = '{{schema}}'::regnamespace
    AND p.proname LIKE 'number\_at\_commit\_%'
    AND t.tgparentid = 0;

-- No trigger calls it any more.
DROP FUNCTION {{schema}}.number_at_commit();
