-- ordo 0002: batched sequences (SurrealDB's DEFINE SEQUENCE … BATCH … START … TIMEOUT model),
-- and definitions managed by SQL functions so that every language defines, redefines and
-- removes sequences the same way.
--
-- A batched sequence's high-water mark is a PostgreSQL sequence (`storage`) stepping by
-- batch × increment: a node reserves [v, v + (batch − 1) × increment] with one nextval(),
-- which never blocks behind a caller's transaction and is never rolled back, so values are
-- unique across nodes and SQL callers alike.

ALTER TABLE {{schema}}.sequences ADD COLUMN storage text;

-- Epochs come from one sequence, so a name removed and defined again never gets an epoch a
-- node may still hold ranges of.
CREATE SEQUENCE {{schema}}.epochs AS integer;
SELECT setval('{{schema}}.epochs', greatest(1, (SELECT max(epoch) FROM {{schema}}.sequences)));
ALTER TABLE {{schema}}.sequences ALTER COLUMN epoch SET DEFAULT nextval('{{schema}}.epochs');
ALTER TABLE {{schema}}.sequences ADD CONSTRAINT batched_shape CHECK (
  kind = 'gapless'
  OR (batch IS NOT NULL AND storage IS NOT NULL AND NOT cycle AND reset = 'never' AND format IS NULL
      AND batch::numeric * increment <= 9007199254740991)
);

-- Ownership: which node reserved which range, in which epoch of the definition.
CREATE TABLE {{schema}}.sequence_batches (
  sequence    text NOT NULL REFERENCES {{schema}}.sequences (name) ON DELETE CASCADE,
  node_id     uuid NOT NULL,
  first       bigint NOT NULL,
  last        bigint NOT NULL,
  epoch       integer NOT NULL,
  reserved_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (sequence, first)
);
CREATE INDEX sequence_batches_node ON {{schema}}.sequence_batches (node_id, reserved_at);

-- The next value a batched sequence's storage will hand out.
CREATE FUNCTION {{schema}}.storage_position(storage text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  last_value bigint;
  called boolean;
  step bigint;
BEGIN
  EXECUTE format('SELECT last_value, is_called FROM %s', storage) INTO last_value, called;
  SELECT seqincrement INTO step FROM pg_sequence WHERE seqrelid = storage::regclass;
  RETURN CASE WHEN called THEN last_value + step ELSE last_value END;
END $$;

-- Creates, or with mode 'overwrite' redefines, a sequence. Returns the definition and what
-- happened: 'created', 'exists' (left as it was) or 'overwritten'. Overwriting bumps the
-- epoch and notifies every node, which drops its cached ranges; it never moves a batched
-- sequence backwards (a START below what was handed out is raised to the next free value).
CREATE FUNCTION {{schema}}.define_sequence(
  seq_name text, seq_kind text, seq_start bigint, seq_increment bigint, seq_min bigint, seq_max bigint,
  seq_cycle boolean, seq_batch integer, seq_timeout_ms bigint, seq_reset text, seq_time_zone text,
  seq_format text, mode text)
RETURNS TABLE (outcome text, definition {{schema}}.sequences)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  old {{schema}}.sequences;
  existed boolean;
  result {{schema}}.sequences;
  new_storage text := format('{{schema}}.%I', 'batched_' || md5(seq_name));
  start_at bigint := seq_start;
BEGIN
  IF mode NOT IN ('create', 'if_not_exists', 'overwrite') THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('unknown define mode %L', mode);
  END IF;
  PERFORM {{schema}}.check_time_zone(seq_time_zone);
  -- Definitions of one name happen one at a time: two creators would otherwise both find no
  -- row and collide on the insert (and on the storage). The next statement's snapshot sees
  -- what the previous holder committed.
  PERFORM pg_advisory_xact_lock(hashtextextended('ordo.define:{{schema_name}}.' || seq_name, 0));
  SELECT * INTO old FROM {{schema}}.sequences AS d WHERE d.name = seq_name FOR UPDATE;
  existed := FOUND;
  IF existed AND mode <> 'overwrite' THEN
    RETURN QUERY SELECT 'exists'::text, old;
    RETURN;
  END IF;

  -- Never backwards: a redefined sequence continues above every value it may have handed out
  -- (for a gapless one that resets by period, each period starts afresh anyway).
  IF existed AND old.kind = 'batched' THEN
    start_at := greatest(seq_start, {{schema}}.storage_position(old.storage));
  ELSIF existed AND seq_kind = 'batched' THEN
    -- old.start counts too: a gapless sequence that was batched before continues above it.
    start_at := greatest(seq_start, old.start, coalesce(
      (SELECT max(c.value) + old.increment FROM {{schema}}.counters AS c WHERE c.sequence = seq_name), seq_start));
  END IF;
  IF seq_kind = 'gapless' AND seq_reset <> 'never' THEN
    start_at := seq_start;
  END IF;

  IF existed AND old.kind = 'batched' THEN
    IF seq_kind = 'batched' THEN
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

-- Removes a sequence with its counters, batches and storage, and tells every node.
CREATE FUNCTION {{schema}}.remove_sequence(seq_name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  old {{schema}}.sequences;
BEGIN
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

-- ALTER SEQUENCE … TIMEOUT d | DROP TIMEOUT.
CREATE FUNCTION {{schema}}.alter_sequence_timeout(seq_name text, new_timeout_ms bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  UPDATE {{schema}}.sequences AS d SET timeout_ms = new_timeout_ms, updated_at = now() WHERE d.name = seq_name;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  PERFORM pg_notify('ordo_sequences.{{schema_name}}', seq_name);
  RETURN true;
END $$;

-- A node reserves the next range of a batched sequence. `wait_ms` bounds how long it may wait
-- for a lock (another session redefining the sequence in an open transaction).
CREATE FUNCTION {{schema}}.reserve(seq_name text, node uuid, wait_ms integer)
RETURNS TABLE (first bigint, last bigint, epoch integer, increment bigint, timeout_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  s {{schema}}.sequences;
  v bigint;
  step bigint;
  caller_lock_timeout text := current_setting('lock_timeout');
BEGIN
  IF wait_ms IS NOT NULL THEN
    PERFORM set_config('lock_timeout', greatest(wait_ms, 1) || 'ms', true);
  END IF;
  v := {{schema}}.take_block(seq_name);
  -- Read the definition after nextval(): a redefinition that committed first is seen with the
  -- step nextval() used; one that commits later waits for this transaction (it alters the
  -- storage, whose lock nextval() holds).
  SELECT * INTO s FROM {{schema}}.sequences AS d WHERE d.name = seq_name;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX001', MESSAGE = format('The sequence %L does not exist', seq_name);
  END IF;
  SELECT seqincrement INTO step FROM pg_sequence WHERE seqrelid = s.storage::regclass;
  INSERT INTO {{schema}}.sequence_batches (sequence, node_id, first, last, epoch)
  VALUES (seq_name, node, v, least(v + step - s.increment, s.max_value), s.epoch);
  PERFORM set_config('lock_timeout', caller_lock_timeout, true);
  RETURN QUERY SELECT v, least(v + step - s.increment, s.max_value), s.epoch, s.increment, s.timeout_ms;
END $$;

-- The first value of the next block of a batched sequence.
-- Lock order, everywhere: the definition row, then the storage. The row is held FOR KEY SHARE
-- (reservations never block each other), so a redefinition or removal, which locks the row
-- FOR UPDATE first, waits for every nextval() in flight before it reads where the storage
-- stands, and the two can never deadlock.
CREATE FUNCTION {{schema}}.take_block(seq_name text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  s {{schema}}.sequences;
BEGIN
  SELECT * INTO s FROM {{schema}}.sequences AS d WHERE d.name = seq_name FOR KEY SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX001', MESSAGE = format('The sequence %L does not exist', seq_name);
  END IF;
  IF s.kind <> 'batched' THEN
    RAISE EXCEPTION USING ERRCODE = 'OX004', MESSAGE = format('The sequence %L is %s, not batched', seq_name, s.kind);
  END IF;
  RETURN nextval(s.storage);
EXCEPTION
  WHEN sequence_generator_limit_exceeded THEN
    RAISE EXCEPTION USING ERRCODE = 'OX002',
      MESSAGE = format('The sequence %L is exhausted: it cannot go past its maximum value %s', seq_name, s.max_value);
  WHEN undefined_table THEN
    -- The storage was dropped by a concurrent REMOVE or redefinition: the caller retries.
    RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = format('The sequence %L changed while a range was reserved', seq_name);
END $$;

-- nextval() for either kind. From SQL, a batched sequence hands out the first value of a
-- fresh block (the rest of the block is never used, as with PostgreSQL's per-session CACHE):
-- unique, never blocking, never rolled back; use the library for throughput.
CREATE OR REPLACE FUNCTION {{schema}}.nextval(seq_name text, seq_scope text DEFAULT '', at timestamptz DEFAULT now())
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM {{schema}}.sequences AS d WHERE d.name = seq_name AND d.kind = 'batched') THEN
    IF seq_scope IS DISTINCT FROM '' THEN
      RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('The sequence %L is batched: it has no scopes', seq_name);
    END IF;
    RETURN {{schema}}.take_block(seq_name);
  END IF;
  RETURN (SELECT t.value FROM {{schema}}.take(seq_name, seq_scope, at, 1) AS t);
END $$;

-- Ownership rows older than `keep` are deleted: a node gone for that long loses all of them,
-- a live node keeps those of its recent reservations. (They are a record of who reserved
-- what; uniqueness never depends on them.)
CREATE FUNCTION {{schema}}.collect_batches(keep interval) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
  WITH gone AS (
    DELETE FROM {{schema}}.sequence_batches AS b WHERE b.reserved_at < now() - keep RETURNING 1
  )
  SELECT count(*) FROM gone
$$;
