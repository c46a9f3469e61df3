-- ordo 0024: "never backwards" holds while takers are in flight when a gapless sequence turns
-- batched.
--
-- 0011 keeps what a gapless sequence handed out in the floor of its batched definition, read by
-- define_sequence() as max(counters.value) before it deletes the counters. take(), take_value()
-- and take_many() read the definition with no lock, so three interleavings with an OVERWRITE
-- that turns a gapless sequence batched handed out a value twice:
-- (a) a transaction holds a value it took (4, after 1–3 committed) while the redefinition reads
--     the floor (3 + 1): the redefinition's DELETE waits for it, it commits, and the batched
--     sequence starts at 4 again.
-- (b) a take starts while the redefinition is open: it reads the gapless definition, its upsert
--     waits for the counter the redefinition deleted, and when that commits it inserts a new
--     counter at the start: 1 again, and a counter row for a batched sequence.
-- (c) the same with no counter yet (a sequence, or a scope, that has handed out nothing): the
--     take waits for the definition's row (its counter's foreign key), then inserts at the
--     start, which the batched sequence hands out too.
--
-- Now every take holds the sequence's kind lock, a transaction-scoped advisory lock keyed by
-- the sequence's name, shared, from before it reads the definition until its transaction ends:
-- take() (so take_once(), nextval_text() and numbering at commit), take_value(), take_many()
-- (within its short lock wait: a batch gives way, and its calls are served alone) and nextval(),
-- which then serves whichever kind it finds. define_sequence(), turning a gapless sequence
-- batched, takes the lock exclusive before it reads the counters: it waits for every
-- transaction that took from the sequence, committed or rolled back, and takes arriving
-- meanwhile queue behind it. A take that waited reads the definition afterwards (at READ
-- COMMITTED each statement of a function has a snapshot of its own): the new kind, so it fails
-- with OX004 in a caller's transaction (the library retries a standalone call as batched), and
-- nextval() serves a batched value. Other redefinitions take no such lock (the counters stay,
-- or the storage is their witness, locked FOR UPDATE as before).
--
-- A lock on the definition's row (FOR KEY SHARE) would do the same, but one hot row locked by
-- every take makes MultiXacts under concurrency (0018); the advisory lock lives in the lock
-- table only. Taken in an IF rather than a PERFORM, which plpgsql runs through the executor
-- (4,500 instructions more). BEGIN, take_value() and COMMIT: 265,000 → 272,000 instructions
-- (callgrind, PostgreSQL 15, the same cluster and counter); nextval() of a gapless sequence
-- 362,000 → 371,000.
--
-- The redefinition waits within the caller's lock_timeout, as for its other locks (55P03,
-- ordo's `timeout`, changing nothing). A transaction that took from the sequence may redefine
-- it itself (its own shared lock does not hold it back). Two more refusals, both before the
-- wait, with OX003:
-- * a sequence that numbers a table at commit (0013's trigger refused it only after the
--   counters' locks, which commits numbering the table would now queue behind);
-- * at REPEATABLE READ or SERIALIZABLE: the counters would be read as of the snapshot, taken
--   before the wait, and a value committed meanwhile as a new counter row was missed (and its
--   row kept). A take at those levels whose snapshot predates the change already fails: the
--   counter's foreign key check finds the definition changed since (40001).
-- take_once() was safe already: its claim's foreign key holds the definition's row (KEY SHARE),
-- which the redefinition locks FOR UPDATE. A sequence that numbers a table cannot become
-- batched (0013), so numbering at commit met none of this.
--
-- Custom SQLSTATEs: none new.

-- Counter rows that a take racing a change of kind (b) left to a batched sequence: nothing
-- reads them (a batched sequence counts in its storage, and a change back to gapless deletes
-- them), but they are listed as if the sequence were counting there.
DELETE FROM {{schema}}.counters AS c
 USING {{schema}}.sequences AS d
 WHERE d.name = c.sequence AND d.kind = 'batched';

-- As in 0009, the sequence's kind lock shared before its definition is read.
CREATE OR REPLACE FUNCTION {{schema}}.take(seq_name text, seq_scope text, at timestamptz, how_many integer)
RETURNS TABLE (value bigint, text text, period text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  s {{schema}}.sequences;
  local_at timestamp;
  p date;
  step bigint;
  last_value bigint;
  prev bigint;
BEGIN
  IF seq_scope IS NULL OR at IS NULL OR how_many IS NULL OR how_many < 1 OR how_many > 1000000 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = 'scope and at must not be null, and the count must be from 1 to 1000000';
  END IF;
  IF pg_advisory_xact_lock_shared(hashtext('{{schema_name}}.sequence_kind'), hashtext(seq_name)) IS NULL THEN
    NULL; -- a null name: no lock, and no sequence (below)
  END IF;
  SELECT * INTO s FROM {{schema}}.sequences AS d WHERE d.name = seq_name;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX001', MESSAGE = format('The sequence %L does not exist', seq_name);
  END IF;
  IF s.kind <> 'gapless' THEN
    RAISE EXCEPTION USING ERRCODE = 'OX004',
      MESSAGE = format('The sequence %L is %s, not gapless', seq_name, s.kind);
  END IF;
  local_at := at AT TIME ZONE s.time_zone;
  p := {{schema}}.period_start(s.reset, s.year_start, local_at);
  -- NULL when it would overflow: every comparison with it is then false and value_after() decides.
  step := CASE WHEN s.increment <= 9007199254740991 / how_many THEN s.increment * how_many END;

  INSERT INTO {{schema}}.counters AS c (sequence, scope, period, value, previous)
  VALUES (seq_name, seq_scope, p,
          CASE WHEN s.start <= s.max_value - (step - s.increment) THEN s.start + (step - s.increment)
               ELSE {{schema}}.value_after(s, NULL, how_many) END,
          NULL)
  ON CONFLICT (sequence, scope, period) DO UPDATE
    SET previous = c.value,
        value = CASE WHEN c.value <= s.max_value - step THEN c.value + step
                     ELSE {{schema}}.value_after(s, c.value, how_many) END,
        updated_at = now()
  RETURNING c.value, c.previous INTO last_value, prev;

  period := CASE WHEN s.reset = 'never' THEN NULL ELSE to_char(p, 'YYYY-MM-DD') END;
  IF how_many = 1 THEN
    value := last_value;
    text := CASE WHEN s.format IS NULL THEN last_value::text
                 ELSE {{schema}}.render(s.format, last_value, seq_scope, local_at, s.year_start) END;
    RETURN NEXT;
    RETURN;
  END IF;
  RETURN QUERY
    SELECT v, CASE WHEN s.format IS NULL THEN v::text
                   ELSE {{schema}}.render(s.format, v, seq_scope, local_at, s.year_start) END,
           period
    FROM (SELECT {{schema}}.value_after(s, prev, i) AS v FROM generate_series(1, how_many) AS i) AS issued;
END $$;

-- As in 0018, the kind lock shared before the definition is read.
CREATE OR REPLACE FUNCTION {{schema}}.take_value(seq_name text, seq_scope text DEFAULT '', at timestamptz DEFAULT NULL)
RETURNS text[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  seq_kind text;
  seq_start bigint;
  seq_increment bigint;
  -- The last value the next one may follow without passing the maximum; null when the
  -- increment alone would overflow the arithmetic (take() decides then).
  seq_before_max bigint;
  seq_reset text;
  seq_time_zone text;
  seq_year_start integer;
  seq_format text;
  local_at timestamp;
  issued text[];
  durable text;
BEGIN
  -- Read at commit, so set anywhere in the transaction: here, before the counter is locked
  -- (and only when needed: setting it costs more than looking).
  IF current_setting('synchronous_commit') <> 'on' THEN
    durable := set_config('synchronous_commit', 'on', true);
  END IF;
  IF pg_advisory_xact_lock_shared(hashtext('{{schema_name}}.sequence_kind'), hashtext(seq_name)) IS NULL THEN
    NULL; -- a null name: no lock, and no sequence (take() says so)
  END IF;
  SELECT d.kind, d.start, d.increment,
         CASE WHEN d.increment <= 9007199254740991 THEN d.max_value - d.increment END,
         d.reset, d.time_zone, d.year_start, d.format
    INTO seq_kind, seq_start, seq_increment, seq_before_max, seq_reset, seq_time_zone, seq_year_start, seq_format
    FROM {{schema}}.sequences AS d WHERE d.name = seq_name;
  IF seq_kind = 'gapless' AND seq_scope IS NOT NULL THEN
    local_at := coalesce(at, now()) AT TIME ZONE seq_time_zone;
    -- As take() does for one value. When the next value would pass the maximum, the row is
    -- locked and left as it is (no row returned), and take() goes on from there.
    INSERT INTO {{schema}}.counters AS c (sequence, scope, period, value, previous)
    VALUES (seq_name, seq_scope, {{schema}}.period_start(seq_reset, seq_year_start, local_at), seq_start, NULL)
    ON CONFLICT (sequence, scope, period) DO UPDATE
      SET previous = c.value, value = c.value + seq_increment, updated_at = now()
      WHERE c.value <= seq_before_max
    RETURNING ARRAY[c.value::text,
      CASE WHEN seq_format IS NULL THEN c.value::text
           ELSE {{schema}}.render(seq_format, c.value, seq_scope, local_at, seq_year_start) END,
      CASE WHEN seq_reset = 'never' THEN NULL ELSE to_char(c.period, 'YYYY-MM-DD') END]
    INTO issued;
  END IF;
  IF issued IS NULL THEN
    SELECT ARRAY[t.value::text, t.text, t.period] INTO issued
      FROM {{schema}}.take(seq_name, seq_scope, coalesce(at, now()), 1) AS t;
  END IF;
  RETURN issued;
END $$;

-- As in 0009, the kind locks of the requests' sequences shared, in one order, before their
-- definitions are read, and within the statement's short lock wait: a batch gives way to a
-- change of kind as to a held counter, and its calls are then served alone.
CREATE OR REPLACE FUNCTION {{schema}}.take_many(names text[], scopes text[], ats timestamptz[], counts integer[])
RETURNS TABLE (request integer, value bigint, text text, period text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  missing text;
  caller_lock_timeout text := current_setting('lock_timeout');
BEGIN
  IF cardinality(names) IS DISTINCT FROM cardinality(scopes) OR cardinality(names) IS DISTINCT FROM cardinality(ats)
     OR cardinality(names) IS DISTINCT FROM cardinality(counts)
     OR array_position(names, NULL) IS NOT NULL OR array_position(scopes, NULL) IS NOT NULL
     OR EXISTS (SELECT 1 FROM unnest(counts) AS n WHERE n IS NULL OR n < 1 OR n > 1000000) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = 'take_many needs arrays of equal length, with no null name or scope, and counts from 1 to 1000000';
  END IF;
  PERFORM set_config('lock_timeout', '50ms', true);
  PERFORM pg_advisory_xact_lock_shared(hashtext('{{schema_name}}.sequence_kind'), k.key)
    FROM (SELECT DISTINCT hashtext(n) AS key FROM unnest(names) AS n) AS k
   ORDER BY k.key;
  SELECT n INTO missing FROM unnest(names) AS n
    WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.sequences AS d WHERE d.name = n AND d.kind = 'gapless') LIMIT 1;
  IF FOUND THEN
    -- The caller serves each request on its own, which names the exact error.
    RAISE EXCEPTION USING ERRCODE = 'OX001', MESSAGE = format('The sequence %L does not exist or is not gapless', missing);
  END IF;

  RETURN QUERY
  WITH input AS (
    SELECT u.i::integer AS request, u.name, u.scope, u.how_many::bigint AS how_many, d AS def,
           d.start, d.increment, d.max_value, d.reset, d.format, d.year_start,
           coalesce(u.at, now()) AT TIME ZONE d.time_zone AS local_at
    FROM unnest(names, scopes, ats, counts) WITH ORDINALITY AS u(name, scope, at, how_many, i)
    JOIN {{schema}}.sequences AS d ON d.name = u.name
  ), keyed AS (
    SELECT i.*, {{schema}}.period_start(i.reset, i.year_start, i.local_at) AS p
    FROM input AS i
  ), placed AS (
    -- How many values earlier requests on the same row take before this one.
    SELECT k.*, (sum(k.how_many) OVER (PARTITION BY k.name, k.scope, k.p ORDER BY k.request) - k.how_many)::bigint AS before
    FROM keyed AS k
  ), grouped AS (
    SELECT k.name, k.scope, k.p, (array_agg(k.def))[1] AS def, min(k.start) AS start, min(k.max_value) AS max_value,
           -- NULL when it would overflow: comparisons with it fail and value_after() decides.
           CASE WHEN min(k.increment) <= 9007199254740991 / sum(k.how_many) THEN min(k.increment) * sum(k.how_many) END::bigint AS step,
           min(k.increment) AS increment, sum(k.how_many)::bigint AS total
    FROM keyed AS k GROUP BY k.name, k.scope, k.p
  ), upserted AS (
    INSERT INTO {{schema}}.counters AS c (sequence, scope, period, value, previous)
    SELECT g.name, g.scope, g.p,
           CASE WHEN g.start <= g.max_value - (g.step - g.increment) THEN g.start + (g.step - g.increment)
                ELSE {{schema}}.value_after(g.def, NULL, g.total) END,
           NULL
    FROM grouped AS g
    ORDER BY g.name, g.scope, g.p
    ON CONFLICT (sequence, scope, period) DO UPDATE
      SET previous = c.value,
          value = (SELECT CASE WHEN c.value <= g.max_value - g.step THEN c.value + g.step
                               ELSE {{schema}}.value_after(g.def, c.value, g.total) END
                   FROM grouped AS g WHERE g.name = c.sequence AND g.scope = c.scope AND g.p = c.period),
          updated_at = now()
    RETURNING c.sequence, c.scope, c.period, c.previous
  )
  SELECT pl.request, v.v,
         CASE WHEN pl.format IS NULL THEN v.v::text
              ELSE {{schema}}.render(pl.format, v.v, pl.scope, pl.local_at, pl.year_start) END,
         CASE WHEN pl.reset = 'never' THEN NULL ELSE to_char(pl.p, 'YYYY-MM-DD') END
  FROM placed AS pl
  JOIN upserted AS up ON up.sequence = pl.name AND up.scope = pl.scope AND up.period = pl.p
  CROSS JOIN LATERAL (
    -- The (before + j)-th value after `previous`: arithmetic when it cannot wrap, else value_after().
    SELECT j,
           CASE
             WHEN pl.increment > 9007199254740991 / (pl.before + j) THEN {{schema}}.value_after(pl.def, up.previous, pl.before + j)
             WHEN up.previous IS NULL AND pl.start <= pl.max_value - (pl.before + j - 1) * pl.increment
               THEN pl.start + (pl.before + j - 1) * pl.increment
             WHEN up.previous IS NOT NULL AND up.previous <= pl.max_value - (pl.before + j) * pl.increment
               THEN up.previous + (pl.before + j) * pl.increment
             ELSE {{schema}}.value_after(pl.def, up.previous, pl.before + j)
           END AS v
    FROM generate_series(1, pl.how_many) AS j
  ) AS v
  ORDER BY pl.request, v.j;
  -- A caller's own transaction keeps its own setting.
  PERFORM set_config('lock_timeout', caller_lock_timeout, true);
END $$;

-- As in 0002, the kind lock shared before the kind is read: a call that waited for a change of
-- kind serves the new kind, rather than failing in take() (OX004).
CREATE OR REPLACE FUNCTION {{schema}}.nextval(seq_name text, seq_scope text DEFAULT '', at timestamptz DEFAULT now())
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF pg_advisory_xact_lock_shared(hashtext('{{schema_name}}.sequence_kind'), hashtext(seq_name)) IS NULL THEN
    NULL; -- a null name: no lock, and no sequence (take() says so)
  END IF;
  IF EXISTS (SELECT 1 FROM {{schema}}.sequences AS d WHERE d.name = seq_name AND d.kind = 'batched') THEN
    IF seq_scope IS DISTINCT FROM '' THEN
      RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('The sequence %L is batched: it has no scopes', seq_name);
    END IF;
    RETURN {{schema}}.take_block(seq_name);
  END IF;
  RETURN (SELECT t.value FROM {{schema}}.take(seq_name, seq_scope, at, 1) AS t);
END $$;

-- As in 0011; a gapless sequence turned batched takes its kind lock alone first (below).
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
    -- Refused before the wait, as 0013's trigger would refuse it after: a sequence that numbers
    -- a table stays gapless, and the commits numbering it would queue behind the wait.
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
