-- The one decision of a gapless sequence: take `how_many` consecutive values for a scope, in the
-- period that contains `at`, each with its text (the format rendered) and its period (null for a
-- sequence that never resets). take_value() leaves it a new counter, the maximum and every
-- error; take_once(), nextval() and nextval_text() call it.
--
-- Locks, in this order, each held until the caller's transaction ends:
-- 1. The sequence's kind lock, shared (advisory: class hashtext('<schema>.sequence_kind'), key
--    hashtext(name)), before the definition is read. define_sequence() takes it exclusive to turn
--    a gapless sequence batched, so it waits for every transaction that took from the sequence
--    before it reads their counters, and a take that waited for it reads the new kind (OX004).
--    An advisory lock lives in the lock table only; the definition's row locked FOR KEY SHARE by
--    every take would make MultiXacts of one hot row. It is taken in an IF, whose condition
--    plpgsql evaluates as a simple expression, where a PERFORM runs through the executor.
-- 2. The counter's queue (queue_on_counter()), right before its row: takers of one hot counter
--    wait in the lock table, and the one that gets the lock runs the upsert with a snapshot that
--    has the previous holder's commit, so it finds the row free, where a waiter on the row
--    itself would find it changed and run the statement again while the counter is held.
-- 3. The counter's row, created for the period or advanced by a single INSERT … ON CONFLICT DO
--    UPDATE: a rollback returns the numbers, and concurrent first calls of a new period cannot
--    race. The row lock is the guarantee; the queue only orders the takers in front of it.
-- The common case (no wrap, no exhaustion) is plain arithmetic inside the upsert, so the row lock
-- is held for as little work as possible; value_after() handles the rest. Nothing follows the
-- upsert but the answer: a sequence with a format has its text's template (render_template(),
-- all but the number) rendered before the queue, and each value only filled in (render_fill()).
--
-- Raises invalid_argument (OX003) for a null scope or instant or a count outside 1 to 1000000,
-- sequence_not_found (OX001), OX004 for a batched sequence, and sequence_exhausted (OX002).
CREATE OR REPLACE FUNCTION {{schema}}.take(seq_name text, seq_scope text, at timestamptz, how_many integer)
RETURNS TABLE (value bigint, text text, period text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  s {{schema}}.sequences;
  local_at timestamp;
  p date;
  template text[];
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
  IF s.format IS NOT NULL THEN
    template := {{schema}}.render_template(s.format, seq_scope, local_at, s.year_start);
  END IF;
  -- The counter's queue (above), right before its row.
  IF {{schema}}.queue_on_counter(seq_name, seq_scope, p) IS NULL THEN
    NULL;
  END IF;
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
    text := CASE WHEN template IS NULL THEN last_value::text ELSE {{schema}}.render_fill(template, last_value) END;
    RETURN NEXT;
    RETURN;
  END IF;
  RETURN QUERY
    SELECT v, CASE WHEN template IS NULL THEN v::text ELSE {{schema}}.render_fill(template, v) END, period
    FROM (SELECT {{schema}}.value_after(s, prev, i) AS v FROM generate_series(1, how_many) AS i) AS issued;
END $$;
