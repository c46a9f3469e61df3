-- Creates a sequence, or with mode 'overwrite' redefines it ('create' and 'if_not_exists' leave
-- an existing one as it is). Returns what happened ('created', 'exists' or 'overwritten') and the
-- definition. Every definition of a name first takes an advisory lock on the name, so two
-- cannot race (a row that does not exist yet cannot be locked).
--
-- Never backwards: once a sequence may have handed out values, a redefinition continues above
-- every one of them; until then it may start anywhere. A batched sequence that stays batched
-- keeps its storage, witness enough of what was handed out. A change of kind drops the witness
-- (batched to gapless drops the storage, gapless to batched deletes the counters), so what the old
-- definition may have handed out is kept in `floor`, which every later START obeys (except a
-- gapless sequence that resets by period, whose periods start afresh anyway). Overwriting bumps
-- the epoch and notifies every node, which drops its cached ranges.
--
-- Locks, in order: the name's advisory lock; the kind lock, exclusive, when a gapless sequence
-- turns batched (below); the definition's row, FOR UPDATE. They wait within the caller's
-- lock_timeout (55P03, changing nothing). Raises invalid_argument (OX003) for an unknown mode or
-- time zone, and when a gapless sequence that numbers a table at commit, or in a transaction
-- that is not READ COMMITTED, would turn batched.
CREATE OR REPLACE FUNCTION {{schema}}.define_sequence(
  seq_name text, seq_kind text, seq_start bigint, seq_increment bigint, seq_min bigint, seq_max bigint,
  seq_cycle boolean, seq_batch integer, seq_timeout_ms bigint, seq_reset text, seq_time_zone text,
  seq_format text, mode text)
RETURNS TABLE (outcome text, definition {{schema}}.sequences)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  old {{schema}}.sequences;
  existed boolean;
  unused boolean := false;
  result {{schema}}.sequences;
  new_storage text := format('{{schema}}.%I', 'batched_' || md5(seq_name));
  start_at bigint := seq_start;
  floor_at bigint;
  kind_locked boolean := false;
  used text;
BEGIN
  IF mode NOT IN ('create', 'if_not_exists', 'overwrite') THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('unknown define mode %L', mode);
  END IF;
  PERFORM {{schema}}.check_time_zone(seq_time_zone);
  PERFORM pg_advisory_xact_lock(hashtextextended('ordo.define:{{schema_name}}.' || seq_name, 0));
  -- A gapless sequence turned batched: its floor is read from the counters, which must hold every
  -- value handed out, committed. The kind lock, exclusive, waits for every transaction that took
  -- from the sequence (they hold it shared until they end) and keeps new takers out until this
  -- one ends; they then read the new definition. Taken before the row is locked: a taker that
  -- waits for the row (attach_sequence, a new counter's foreign key) while holding the kind lock
  -- would otherwise wait for this transaction as it waits for them. The kind cannot change
  -- between this look and the row's lock: every definition of the name waits for the lock above.
  IF mode = 'overwrite' AND seq_kind = 'batched'
     AND EXISTS (SELECT 1 FROM {{schema}}.sequences AS d WHERE d.name = seq_name AND d.kind = 'gapless') THEN
    -- Refused before the wait (keep_attached_gapless() would refuse it only after): a sequence
    -- that numbers a table stays gapless, and the commits numbering it would queue behind the wait.
    SELECT string_agg(format('%s(%I)', a.table_name, a.column_name), ', ') INTO used
      FROM {{schema}}.attachments AS a WHERE a.sequence = seq_name;
    IF used IS NOT NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
        'The sequence %L numbers %s at commit: it cannot become %s; detach it first (ordo.sequences.detach)',
        seq_name, used, seq_kind);
    END IF;
    -- At REPEATABLE READ or SERIALIZABLE the counters would be read as of the snapshot, taken
    -- before the wait: the values committed meanwhile would be missed, and their rows kept.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
      RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
        'The gapless sequence %L can become batched only at READ COMMITTED: a %s transaction reads the counters as of its snapshot, taken before it waits for the transactions taking from the sequence, and would miss what they handed out',
        seq_name, upper(current_setting('transaction_isolation')));
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('{{schema_name}}.sequence_kind'), hashtext(seq_name));
    kind_locked := true;
  END IF;
  -- FOR UPDATE waits for every reservation in flight (they hold the row FOR KEY SHARE) and
  -- keeps new ones out until this transaction ends: the storage cannot move meanwhile.
  SELECT * INTO old FROM {{schema}}.sequences AS d WHERE d.name = seq_name FOR UPDATE;
  existed := FOUND;
  IF existed AND mode <> 'overwrite' THEN
    RETURN QUERY SELECT 'exists'::text, old;
    RETURN;
  END IF;

  -- What the definition being replaced may have handed out, when the change of kind drops
  -- its witness (greatest() skips nulls). A batched sequence that stays batched keeps its
  -- storage, which is witness enough.
  IF existed THEN
    floor_at := old.floor;
    IF old.kind = 'batched' THEN
      unused := {{schema}}.storage_unused(seq_name, old.storage);
      IF seq_kind <> 'batched' AND NOT unused THEN
        floor_at := greatest(floor_at, {{schema}}.storage_position(old.storage));
      END IF;
    ELSIF seq_kind = 'batched' THEN
      IF NOT kind_locked THEN
        -- Never reached (see above), and never a floor without the lock.
        PERFORM pg_advisory_xact_lock(hashtext('{{schema_name}}.sequence_kind'), hashtext(seq_name));
      END IF;
      -- old.start counts too: a definition written before `floor` was kept carries in its START
      -- alone what an earlier batched definition handed out.
      floor_at := greatest(floor_at, old.start,
        (SELECT max(c.value) + old.increment FROM {{schema}}.counters AS c WHERE c.sequence = seq_name));
    END IF;
  END IF;

  IF seq_kind = 'batched' AND existed AND old.kind = 'batched' AND NOT unused THEN
    start_at := greatest(seq_start, floor_at, {{schema}}.storage_position(old.storage));
  ELSIF seq_kind = 'batched' OR seq_reset = 'never' THEN
    start_at := greatest(seq_start, floor_at);
  END IF;

  IF existed AND old.kind = 'batched' THEN
    IF seq_kind = 'batched' AND unused THEN
      EXECUTE format('ALTER SEQUENCE %s INCREMENT BY %s MAXVALUE %s START WITH %s RESTART WITH %s',
                     old.storage, seq_batch::bigint * seq_increment, seq_max, start_at, start_at);
    ELSIF seq_kind = 'batched' THEN
      EXECUTE format('ALTER SEQUENCE %s INCREMENT BY %s MAXVALUE %s RESTART WITH %s',
                     old.storage, seq_batch::bigint * seq_increment, seq_max, start_at);
    ELSE
      EXECUTE format('DROP SEQUENCE %s', old.storage);
    END IF;
  ELSIF seq_kind = 'batched' THEN
    EXECUTE format('CREATE SEQUENCE %s AS bigint INCREMENT BY %s MINVALUE %s MAXVALUE %s START WITH %s NO CYCLE',
                   new_storage, seq_batch::bigint * seq_increment, -9007199254740991, seq_max, start_at);
  END IF;

  IF existed THEN
    IF old.kind <> seq_kind THEN
      DELETE FROM {{schema}}.counters AS c WHERE c.sequence = seq_name;
    END IF;
    UPDATE {{schema}}.sequences AS d
       SET kind = seq_kind, start = start_at,
           increment = seq_increment, min_value = seq_min, max_value = seq_max, cycle = seq_cycle,
           batch = seq_batch, timeout_ms = seq_timeout_ms, reset = seq_reset, time_zone = seq_time_zone,
           format = seq_format, storage = CASE WHEN seq_kind = 'batched' THEN coalesce(old.storage, new_storage) END,
           floor = floor_at, epoch = nextval('{{schema}}.epochs'), updated_at = now()
     WHERE d.name = seq_name
    RETURNING d.* INTO result;
    PERFORM pg_notify('ordo_sequences.{{schema_name}}', seq_name);
    RETURN QUERY SELECT 'overwritten'::text, result;
    RETURN;
  END IF;

  INSERT INTO {{schema}}.sequences AS d
    (name, kind, start, increment, min_value, max_value, cycle, batch, timeout_ms, reset, time_zone, format, storage)
  VALUES (seq_name, seq_kind, seq_start, seq_increment, seq_min, seq_max, seq_cycle, seq_batch, seq_timeout_ms,
          seq_reset, seq_time_zone, seq_format, CASE WHEN seq_kind = 'batched' THEN new_storage END)
  RETURNING d.* INTO result;
  RETURN QUERY SELECT 'created'::text, result;
END $$;

-- The define_sequence() above, with the month the year starts in (1: January), for fiscal
-- years. A year starting elsewhere needs a gapless sequence that resets every year; anything
-- else is invalid_argument (OX003). The month is written after the definition, in the same
-- transaction, and left alone when the sequence existed and mode kept it ('exists').
CREATE OR REPLACE FUNCTION {{schema}}.define_sequence(
  seq_name text, seq_kind text, seq_start bigint, seq_increment bigint, seq_min bigint, seq_max bigint,
  seq_cycle boolean, seq_batch integer, seq_timeout_ms bigint, seq_reset text, seq_time_zone text,
  seq_format text, mode text, seq_year_start integer)
RETURNS TABLE (outcome text, definition {{schema}}.sequences)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  r record;
  result {{schema}}.sequences;
BEGIN
  IF seq_year_start IS NULL OR seq_year_start NOT BETWEEN 1 AND 12 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = format('yearStart must be a month from 1 (January) to 12 (got %s)', coalesce(seq_year_start::text, 'null'));
  END IF;
  IF seq_year_start <> 1 AND (seq_kind <> 'gapless' OR seq_reset <> 'year') THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = 'yearStart applies to gapless sequences with reset ''year'' only';
  END IF;
  SELECT * INTO r FROM {{schema}}.define_sequence(seq_name, seq_kind, seq_start, seq_increment, seq_min, seq_max,
    seq_cycle, seq_batch, seq_timeout_ms, seq_reset, seq_time_zone, seq_format, mode) AS d;
  result := r.definition;
  IF r.outcome <> 'exists' AND result.year_start <> seq_year_start THEN
    UPDATE {{schema}}.sequences AS d SET year_start = seq_year_start WHERE d.name = seq_name RETURNING d.* INTO result;
  END IF;
  RETURN QUERY SELECT r.outcome, result;
END $$;
