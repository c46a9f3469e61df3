-- ordo 0011: "never backwards" survives a change of kind.
--
-- A change of kind drops what knew which values were handed out: batched → gapless drops the
-- storage, gapless → batched deletes the counters. 0007's define_sequence() carried it over in
-- the new definition's START only, and the new storage, created at that START and not yet
-- called, counted as unused: a later OVERWRITE … START 0 moved it back over values already
-- handed out (gapless 1, 2, 3 → batched → START 0 gave 0, 1, 2, 3 again; batched → gapless →
-- batched did the same once collect_batches() had deleted the old ownership rows; batched →
-- gapless → gapless START 0 too). Now `floor` keeps it: every value a definition of another
-- kind may have handed out is below it, and no later definition of the sequence starts below
-- it (a gapless one that resets by period excepted: each period starts afresh anyway).
-- A sequence that has handed out nothing still takes any START, lower or higher.

ALTER TABLE {{schema}}.sequences ADD COLUMN floor bigint;
COMMENT ON COLUMN {{schema}}.sequences.floor IS
  'Every value an earlier definition of another kind may have handed out is below this; no definition starts below it (null: none)';

-- Databases that changed kinds before this migration: what can still be known.
-- * Ownership rows of ranges (a week of them, collect_batches) name values handed out by any
--   batched definition, the current one or one before a gapless spell.
-- * A sequence redefined (or altered) before may have been of the other kind then, its START
--   raised above the values handed out as such (0007 kept them nowhere else): unless it resets
--   by period, its START becomes its floor. Such a sequence can no longer be moved below its
--   START; a batched one that has handed out values could not anyway.
UPDATE {{schema}}.sequences AS d
   SET floor = greatest(
         (SELECT max(b.last) + d.increment FROM {{schema}}.sequence_batches AS b WHERE b.sequence = d.name),
         CASE WHEN d.updated_at > d.created_at AND d.reset = 'never' THEN d.start END)
 WHERE EXISTS (SELECT 1 FROM {{schema}}.sequence_batches AS b WHERE b.sequence = d.name)
    OR (d.updated_at > d.created_at AND d.reset = 'never');

-- As in 0007, with `floor`: kept when the kind changes, and obeyed by every new START.
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
      -- old.start counts too, as in 0007: a gapless sequence batched before 0011 carries in its
      -- START alone what it handed out then.
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
