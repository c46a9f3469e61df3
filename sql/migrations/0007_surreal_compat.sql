-- ordo 0007: batched sequences as SurrealDB's tests expect them, without its duplicates.
--
-- 1. A redefinition may move a batched sequence anywhere (OVERWRITE … START -25 below START 0)
--    while it has handed out no value; once it may have, it continues above every value it
--    may have handed out (SurrealDB's issue #7502 is a redefinition that repeats values).
-- 2. A node that closes cleanly gives back the values it never handed out, when they end the
--    last range reserved, so that a restart goes on where it stopped instead of after a hole.

-- Whether no value of a batched sequence's storage can have been handed out: it is where it
-- was created (or moved by a redefinition while unused), and it has never been called.
-- `seqstart` (START WITH) only changes with the position while unused; a redefinition of a
-- used sequence moves the position alone (RESTART WITH); nextval() sets is_called; give_back()
-- moves the position back, not called, only over values never handed out — so it is at
-- `seqstart` and not called only when every range ever reserved was given back whole.
-- Ownership rows of ranges are a second witness: none may exist.
CREATE FUNCTION {{schema}}.storage_unused(seq_name text, storage text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  at_value bigint;
  called boolean;
  created_at bigint;
BEGIN
  EXECUTE format('SELECT last_value, is_called FROM %s', storage) INTO at_value, called;
  SELECT seqstart INTO created_at FROM pg_sequence WHERE seqrelid = storage::regclass;
  RETURN NOT called AND at_value = created_at
     AND NOT EXISTS (SELECT 1 FROM {{schema}}.sequence_batches AS b WHERE b.sequence = seq_name);
END $$;

-- As in 0002, but "never backwards" applies only to values that may have been handed out.
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
BEGIN
  IF mode NOT IN ('create', 'if_not_exists', 'overwrite') THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('unknown define mode %L', mode);
  END IF;
  PERFORM {{schema}}.check_time_zone(seq_time_zone);
  PERFORM pg_advisory_xact_lock(hashtextextended('ordo.define:{{schema_name}}.' || seq_name, 0));
  -- FOR UPDATE waits for every reservation in flight (they hold the row FOR KEY SHARE) and
  -- keeps new ones out until this transaction ends: the storage cannot move meanwhile.
  SELECT * INTO old FROM {{schema}}.sequences AS d WHERE d.name = seq_name FOR UPDATE;
  existed := FOUND;
  IF existed AND mode <> 'overwrite' THEN
    RETURN QUERY SELECT 'exists'::text, old;
    RETURN;
  END IF;

  IF existed AND old.kind = 'batched' THEN
    unused := {{schema}}.storage_unused(seq_name, old.storage);
    IF NOT unused THEN
      start_at := greatest(seq_start, {{schema}}.storage_position(old.storage));
    END IF;
  ELSIF existed AND seq_kind = 'batched' THEN
    -- old.start counts too: a gapless sequence that was batched before continues above it.
    start_at := greatest(seq_start, old.start, coalesce(
      (SELECT max(c.value) + old.increment FROM {{schema}}.counters AS c WHERE c.sequence = seq_name), seq_start));
  END IF;
  IF seq_kind = 'gapless' AND seq_reset <> 'never' THEN
    start_at := seq_start;
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
           epoch = nextval('{{schema}}.epochs'), updated_at = now()
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

-- A closing node gives back the values from `from_value` to the end of its range starting at
-- `last_first`, reserved in `range_epoch`: a compare-and-set on the storage, under the
-- definition's row lock (no range can be reserved meanwhile). It happens only if
--   * the definition is still the one of that epoch,
--   * the storage stands just after that range (no range was reserved since), and
--   * the node owns that range, and `from_value` lies in it or in the node's range just before
--     it (the ownership rows of ranges reserved more than a week ago are gone: then nothing).
-- Otherwise the values stay a gap, as when a node stops without closing. Returns whether
-- they were given back. `wait_ms` bounds the wait for the row lock.
CREATE FUNCTION {{schema}}.give_back(seq_name text, node uuid, range_epoch integer, last_first bigint,
                                     from_value bigint, wait_ms integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  s {{schema}}.sequences;
  step bigint;
  last_range {{schema}}.sequence_batches;
  caller_lock_timeout text := current_setting('lock_timeout');
BEGIN
  PERFORM set_config('lock_timeout', greatest(coalesce(wait_ms, 1000), 1) || 'ms', true);
  BEGIN
    SELECT * INTO s FROM {{schema}}.sequences AS d WHERE d.name = seq_name FOR UPDATE;
  EXCEPTION WHEN lock_not_available THEN
    PERFORM set_config('lock_timeout', caller_lock_timeout, true);
    RETURN false;
  END;
  PERFORM set_config('lock_timeout', caller_lock_timeout, true);
  IF NOT FOUND OR s.kind <> 'batched' OR s.epoch <> range_epoch THEN
    RETURN false;
  END IF;
  SELECT seqincrement INTO step FROM pg_sequence WHERE seqrelid = s.storage::regclass;
  IF {{schema}}.storage_position(s.storage) <> last_first + step THEN
    RETURN false;
  END IF;
  SELECT * INTO last_range FROM {{schema}}.sequence_batches AS b
   WHERE b.sequence = seq_name AND b.first = last_first AND b.node_id = node AND b.epoch = range_epoch;
  IF NOT FOUND OR from_value > last_range.last OR (from_value < last_first AND NOT EXISTS (
       SELECT 1 FROM {{schema}}.sequence_batches AS b
        WHERE b.sequence = seq_name AND b.node_id = node AND b.epoch = range_epoch
          AND b.last + s.increment = last_first AND from_value BETWEEN b.first AND b.last)) THEN
    RETURN false;
  END IF;
  PERFORM setval(s.storage, from_value, false);
  DELETE FROM {{schema}}.sequence_batches AS b
   WHERE b.sequence = seq_name AND b.node_id = node AND b.first >= from_value;
  UPDATE {{schema}}.sequence_batches AS b SET last = from_value - s.increment
   WHERE b.sequence = seq_name AND b.node_id = node AND b.first < from_value AND b.last >= from_value;
  RETURN true;
END $$;
