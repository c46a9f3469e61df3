-- ordo 0013: numbering at commit (0009), made safe where a review found it was not.
--
-- 1. REPEATABLE READ and SERIALIZABLE: a transaction cannot update a row its snapshot does not
--    show, so its commit fails (40001) whenever another transaction numbered the same counter
--    since the snapshot. Nothing in PostgreSQL lets the counter's update skip the snapshot and
--    still roll back with the transaction (a sequence or a second connection would not roll
--    back: gaps), so the failure stays a serialization failure (40001, which drivers and
--    frameworks retry), now saying what happened and what to do.
-- 2. Deadlocks: the counters a commit needs are noted by a row trigger (a statement trigger
--    is not copied to partitions, so an insert straight into one noted nothing), and the
--    advisory lock keys format the period without DateStyle.
-- 3. A sequence that numbers a table is not removed, nor turned batched, under it: the
--    sequence's row is locked before the check (a concurrent attach holds it FOR KEY SHARE).
-- 4. holders(): waiters counted once, each on the counter it waits for when PostgreSQL shows
--    which (a tuple lock), else on the holder's first counter; pg_locks read once.
-- 5. The instant of a commit is kept as ISO text in UTC (at::text followed DateStyle and its
--    time zone abbreviations could read back as another instant); scope columns are of types
--    whose text depends on no session setting.
-- 6. detach waits for the table's lock a bounded time (DROP TRIGGER waits for readers too, and
--    every later statement on the table queues behind it).

-- 5. The instant of this commit: the database clock when the commit numbers its first row, or
-- ordo.commit_at when the transaction set it. Kept as ISO 8601 in UTC, which reads back as the
-- same instant whatever DateStyle and TimeZone say.
CREATE OR REPLACE FUNCTION {{schema}}.commit_instant() RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  given text := current_setting('ordo.commit_at', true);
  at timestamptz;
BEGIN
  IF given IS NOT NULL AND given <> '' THEN
    BEGIN
      RETURN given::timestamptz;
    EXCEPTION WHEN data_exception THEN
      RAISE EXCEPTION USING ERRCODE = 'OX003',
        MESSAGE = format('ordo.commit_at must be a timestamp with a time zone, such as ''2026-12-31 23:59:59+01'' (got %L)', given);
    END;
  END IF;
  at := clock_timestamp();
  PERFORM set_config('ordo.commit_at', to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), true);
  RETURN at;
END $$;

-- 1. As in 0009. At REPEATABLE READ or SERIALIZABLE, the first row of each counter is numbered
-- in a subtransaction that turns PostgreSQL's "could not serialize access due to concurrent
-- update" into a message saying which counter, why and what to do, with the same SQLSTATE
-- (40001) and TABLE = counters (which ordo's client reads as serialization_failure). Later rows
-- of a counter this commit already holds cannot fail so, and are numbered without one (a
-- subtransaction per row would overflow PostgreSQL's cache of them on bulk inserts).
CREATE OR REPLACE FUNCTION {{schema}}.number_at_commit() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  numbering text;
  scope text := '';
  counter text;
  taken text;
  numbered integer;
BEGIN
  IF coalesce(current_setting('ordo.counters_locked', true), '') = '' THEN
    PERFORM {{schema}}.lock_pending_counters();
  END IF;
  numbering := format(
    'UPDATE %s AS r SET (%s) = (SELECT %s FROM {{schema}}.take($1, %s, $2, 1) AS t) WHERE r.ctid = $3 AND r.%I IS NULL',
    TG_RELID::regclass,
    CASE WHEN TG_ARGV[3] = '' THEN quote_ident(TG_ARGV[1]) ELSE quote_ident(TG_ARGV[1]) || ', ' || quote_ident(TG_ARGV[3]) END,
    CASE WHEN TG_ARGV[3] = '' THEN 't.value' ELSE 't.value, t.text' END,
    CASE WHEN TG_ARGV[2] = '' THEN '''''' ELSE format('coalesce(r.%I::text, '''')', TG_ARGV[2]) END,
    TG_ARGV[1]);
  IF current_setting('transaction_isolation') = 'read committed' THEN
    EXECUTE numbering USING TG_ARGV[0], {{schema}}.commit_instant(), NEW.ctid;
    RETURN NULL;
  END IF;

  IF TG_ARGV[2] <> '' THEN
    EXECUTE format('SELECT coalesce(($1).%I::text, '''')', TG_ARGV[2]) INTO scope USING NEW;
  END IF;
  counter := TG_ARGV[0] || chr(31) || scope;
  taken := coalesce(current_setting('ordo.counters_taken', true), '');
  IF strpos(chr(30) || taken || chr(30), chr(30) || counter || chr(30)) > 0 THEN
    EXECUTE numbering USING TG_ARGV[0], {{schema}}.commit_instant(), NEW.ctid;
    RETURN NULL;
  END IF;
  BEGIN
    EXECUTE numbering USING TG_ARGV[0], {{schema}}.commit_instant(), NEW.ctid;
    GET DIAGNOSTICS numbered = ROW_COUNT;
  EXCEPTION WHEN serialization_failure THEN
    RAISE EXCEPTION USING ERRCODE = 'serialization_failure', SCHEMA = '{{schema_name}}', TABLE = 'counters',
      MESSAGE = format(
        'The sequence %L numbers %s at commit, and another transaction numbered the same counter (scope %L) after this %s transaction took its snapshot: PostgreSQL lets no transaction update a row its snapshot does not show. Retry the transaction, as for any serialization failure (SQLSTATE 40001), or write %s at READ COMMITTED, where numbering at commit never fails this way',
        TG_ARGV[0], TG_RELID::regclass, scope, upper(current_setting('transaction_isolation')), TG_RELID::regclass),
      DETAIL = SQLERRM,
      HINT = 'Numbering at commit is made for READ COMMITTED; a REPEATABLE READ or SERIALIZABLE transaction commits only when no other numbered its counter since its first statement.';
  END;
  IF numbered > 0 THEN
    PERFORM set_config('ordo.counters_taken', CASE WHEN taken = '' THEN counter ELSE taken || chr(30) || counter END, true);
  END IF;
  RETURN NULL;
END $$;

-- 2. The counters a transaction will number at commit, noted as its rows are written, by a row
-- trigger (copied to every partition, those attached later too). BEFORE, so that its WHEN
-- clause, which skips counters noted already, sees what the previous rows noted: the function
-- runs once per counter, not once per row. Named to fire after the table's own BEFORE triggers
-- (alphabetical order), which may set the scope. Arguments: sequence, column, scope column.
CREATE FUNCTION {{schema}}.note_pending_row() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  pending text := coalesce(current_setting('ordo.pending_counters', true), '');
  scope text := '';
  k text;
BEGIN
  IF TG_ARGV[2] <> '' THEN
    EXECUTE format('SELECT coalesce(($1).%I::text, '''')', TG_ARGV[2]) INTO scope USING NEW;
  END IF;
  k := TG_ARGV[0] || chr(31) || scope;
  IF strpos(chr(30) || pending || chr(30), chr(30) || k || chr(30)) = 0 THEN
    PERFORM set_config('ordo.pending_counters', CASE WHEN pending = '' THEN k ELSE pending || chr(30) || k END, true);
  END IF;
  RETURN NEW;
END $$;

-- The statement triggers of attachments made before 0013 stay until detach drops them; their
-- rows are noted by the row trigger created below.
CREATE OR REPLACE FUNCTION {{schema}}.note_pending_counters() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  RETURN NULL;
END $$;

-- The row trigger noting an attachment's counters.
CREATE FUNCTION {{schema}}.create_note_trigger(rel regclass, seq_name text, column_name text, scope_column text)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  EXECUTE format(
    'CREATE TRIGGER %I BEFORE INSERT OR UPDATE ON %s FOR EACH ROW WHEN (NEW.%I IS NULL AND strpos(chr(30) || coalesce(current_setting(''ordo.pending_counters'', true), '''') || chr(30), chr(30) || %L || chr(31) || %s || chr(30)) = 0) EXECUTE FUNCTION {{schema}}.note_pending_row(%L, %L, %L)',
    {{schema}}.attachment_trigger('zz_ordo_note_', column_name), rel, column_name, seq_name,
    CASE WHEN scope_column IS NULL THEN '''''' ELSE format('coalesce(NEW.%I::text, '''')', scope_column) END,
    seq_name, column_name, coalesce(scope_column, ''));
END $$;

-- 2. As in 0009, with the period as YYYY-MM-DD in the key: date's text follows DateStyle, and
-- two sessions with different ones took different locks for the same counter.
CREATE OR REPLACE FUNCTION {{schema}}.lock_pending_counters() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  pending text[] := string_to_array(nullif(current_setting('ordo.pending_counters', true), ''), chr(30));
  at timestamptz;
BEGIN
  IF coalesce(cardinality(pending), 0) > 1 THEN
    at := {{schema}}.commit_instant();
    PERFORM pg_advisory_xact_lock(h.key)
      FROM (SELECT DISTINCT hashtextextended(format('ordo.counter:%s/%s/%s', d.name, split_part(k, chr(31), 2),
                     coalesce(to_char({{schema}}.period_start(d.reset, d.year_start, at AT TIME ZONE d.time_zone), 'YYYY-MM-DD'), 'never')), 0) AS key
              FROM unnest(pending) AS k
              JOIN {{schema}}.sequences AS d ON d.name = split_part(k, chr(31), 1)) AS h
     ORDER BY h.key;
  END IF;
  PERFORM set_config('ordo.counters_locked', 'yes', true);
END $$;

-- 5. A scope column's text must not depend on the session: a date's follows DateStyle, a
-- timestamp's TimeZone, a float's extra_float_digits, and the same row would be numbered in
-- another counter from another session.
CREATE FUNCTION {{schema}}.attachable_scope(rel regclass, col text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
  typ oid;
  base oid;
BEGIN
  PERFORM {{schema}}.attachable_column(rel, col, 'scope column', NULL);
  SELECT a.atttypid INTO typ FROM pg_attribute AS a WHERE a.attrelid = rel AND a.attname = col AND a.attnum > 0;
  base := typ;
  WHILE (SELECT t.typtype FROM pg_type AS t WHERE t.oid = base) = 'd' LOOP
    SELECT t.typbasetype INTO base FROM pg_type AS t WHERE t.oid = base;
  END LOOP;
  IF base NOT IN ('text'::regtype, 'varchar'::regtype, 'int2'::regtype, 'int4'::regtype, 'int8'::regtype, 'uuid'::regtype) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The column %I of %s (the scope column) is %s: it must be text, varchar, smallint, integer, bigint or uuid, whose text is the same in every session (the text of a date, a timestamp or a float depends on DateStyle, TimeZone or extra_float_digits)',
      col, rel, format_type(typ, NULL));
  END IF;
END $$;

-- As in 0009, with the scope column's type checked and the counters noted by the row trigger.
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
  EXECUTE format(
    'CREATE CONSTRAINT TRIGGER %I AFTER INSERT OR UPDATE ON %s DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.%I IS NULL) EXECUTE FUNCTION {{schema}}.number_at_commit(%L, %L, %L, %L)',
    {{schema}}.attachment_trigger('ordo_number_', column_name), rel, column_name, seq_name, column_name,
    coalesce(scope_column, ''), coalesce(text_column, ''));
  PERFORM {{schema}}.create_note_trigger(rel, seq_name, column_name, scope_column);
  RETURN true;
END $$;

-- 6. As in 0009, waiting at most lock_timeout_ms for the table: DROP TRIGGER needs it alone
-- (ACCESS EXCLUSIVE), so it waits for every transaction reading or writing it, and every
-- statement on the table arriving meanwhile queues behind it. Past the bound, nothing is
-- changed and the error (55P03, ordo's `timeout`) says why. The caller's lock_timeout is
-- restored afterwards.
CREATE FUNCTION {{schema}}.detach_sequence(seq_name text, table_name text, column_name text, lock_timeout_ms integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  rel regclass := {{schema}}.attachable_table(table_name);
  existing {{schema}}.attachments;
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
  EXECUTE format('DROP TRIGGER %I ON %s', existing.trigger_name, rel);
  EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', {{schema}}.attachment_trigger('zz_ordo_note_', column_name), rel);
  -- The statement triggers of attachments made before 0013.
  EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', {{schema}}.attachment_trigger('ordo_note_i_', column_name), rel);
  EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', {{schema}}.attachment_trigger('ordo_note_u_', column_name), rel);
  PERFORM set_config('lock_timeout', caller_lock_timeout, true);
  RETURN true;
END $$;

-- The 0009 form waits at most 5 seconds.
CREATE OR REPLACE FUNCTION {{schema}}.detach_sequence(seq_name text, table_name text, column_name text) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
  SELECT {{schema}}.detach_sequence(seq_name, table_name, column_name, 5000)
$$;

-- 3. As in 0009, with the sequence's row locked before the check: an attach in flight holds it
-- FOR KEY SHARE, so the removal waits for it to commit and then sees its attachment.
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

-- 3. A sequence that numbers a table at commit stays gapless: every commit writing the table
-- would fail otherwise. On the table, so that every way of redefining it is covered; the row
-- is locked by then (define_sequence takes it FOR UPDATE first), after any attach in flight.
CREATE FUNCTION {{schema}}.keep_attached_gapless() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  used text;
BEGIN
  SELECT string_agg(format('%s(%I)', a.table_name, a.column_name), ', ') INTO used
    FROM {{schema}}.attachments AS a WHERE a.sequence = OLD.name;
  IF used IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The sequence %L numbers %s at commit: it cannot become %s; detach it first (ordo.sequences.detach)',
      OLD.name, used, NEW.kind);
  END IF;
  RETURN NEW;
END $$;

CREATE TRIGGER keep_attached_gapless BEFORE UPDATE OF kind ON {{schema}}.sequences
  FOR EACH ROW WHEN (OLD.kind = 'gapless' AND NEW.kind <> 'gapless')
  EXECUTE FUNCTION {{schema}}.keep_attached_gapless();

-- 4. As in 0009, with pg_locks read once, and each waiter counted once: on the counter whose
-- row lock it waits for (a tuple lock), or, when it waits for the holder's transaction alone
-- (as INSERT … ON CONFLICT does, which take() runs), on the holder's first counter in (sequence,
-- scope, period) order; the holder's other counters say 0 for those.
CREATE OR REPLACE FUNCTION {{schema}}.sequence_holders(seq_name text)
RETURNS TABLE (scope text, period text, pid integer, prepared_gid text, xact_start timestamptz, state text,
               application_name text, waiting bigint, now timestamptz)
LANGUAGE sql VOLATILE AS $$
  WITH locks AS MATERIALIZED (
    SELECT l.locktype, l.database, l.relation, l.page, l.tuple, l.transactionid, l.pid, l.mode, l.granted
      FROM pg_locks AS l WHERE l.locktype IN ('transactionid', 'tuple')
  ), held AS (
    SELECT c.sequence, c.scope, c.period, c.xmax, (c.ctid::text::point)[0] AS page, (c.ctid::text::point)[1] AS tuple,
           l.pid
      FROM {{schema}}.counters AS c
      JOIN locks AS l ON l.locktype = 'transactionid' AND l.transactionid = c.xmax AND l.granted AND l.mode = 'ExclusiveLock'
     WHERE c.sequence = seq_name AND c.xmax <> '0'::xid
  )
  SELECT h.scope, to_char(nullif(h.period, '-infinity'), 'YYYY-MM-DD'), h.pid, px.gid,
         coalesce(act.xact_start, px.prepared), act.state, act.application_name,
         on_row.n + CASE WHEN on_holder.n = 0 THEN 0
                         WHEN EXISTS (SELECT 1 FROM {{schema}}.counters AS c2
                                       WHERE c2.xmax = h.xmax AND (c2.sequence, c2.scope, c2.period) < (h.sequence, h.scope, h.period))
                         THEN 0 ELSE on_holder.n END,
         clock_timestamp()
  FROM held AS h
  -- Waiting for this row: queued for its tuple lock, or holding that and waiting for the holder.
  CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM locks AS w
     WHERE w.locktype = 'tuple' AND w.relation = '{{schema}}.counters'::regclass
       AND w.database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND w.page = h.page AND w.tuple = h.tuple
       AND (NOT w.granted OR EXISTS (SELECT 1 FROM locks AS x
                                      WHERE x.pid = w.pid AND x.locktype = 'transactionid'
                                        AND x.transactionid = h.xmax AND NOT x.granted))) AS on_row
  -- Waiting for the holder's transaction with no row named (no tuple lock held).
  CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM locks AS w
     WHERE w.locktype = 'transactionid' AND w.transactionid = h.xmax AND NOT w.granted
       AND NOT EXISTS (SELECT 1 FROM locks AS t WHERE t.pid = w.pid AND t.locktype = 'tuple' AND t.granted)) AS on_holder
  LEFT JOIN pg_stat_activity AS act ON act.pid = h.pid
  LEFT JOIN pg_prepared_xacts AS px ON h.pid IS NULL AND px.transaction = h.xmax
  ORDER BY h.scope, h.period
$$;

-- 2. Attachments made before 0013: their counters noted by the row trigger from now on.
DO $$
DECLARE
  a record;
BEGIN
  FOR a IN SELECT * FROM {{schema}}.attachments AS x
            WHERE NOT EXISTS (SELECT 1 FROM pg_trigger AS t
                               WHERE t.tgrelid = x.table_name
                                 AND t.tgname = {{schema}}.attachment_trigger('zz_ordo_note_', x.column_name))
  LOOP
    PERFORM {{schema}}.create_note_trigger(a.table_name, a.sequence, a.column_name, a.scope_column);
  END LOOP;
END $$;
