-- ordo 0040: every take of a counter queues on the counter's lock, and a transaction takes at
-- most 16 such locks.
--
-- 1. 0039 gave each take_value() its own advisory lock, held to the end of the transaction. A
--    transaction numbering from many counters (a billing run over every tenant, in one
--    transaction) held one lock per counter in PostgreSQL's shared lock table, which holds
--    max_locks_per_transaction × max_connections (6,400 by default) for every session at once:
--    20,000 tenants failed with "out of shared memory", and while it ran, other sessions could
--    fail the same way taking any lock. Row locks live on the rows and cost the table nothing
--    (0020 met the same limit when numbering at commit, and striped it). Now a transaction queues
--    on the lock until it has written counters 16 times (queue_on_counter(): rows inserted or
--    updated, so 16 numbers of one counter count as much as one of 16); later takes queue on
--    the counter's row, as every take did before 0039. The queue is for one hot
--    counter taken by many transactions, each of which takes a few numbers; a transaction that
--    takes more numbers than that is a batch, for which waiting on the row is as good.
--
-- 2. 0039 left take() queuing on the row. take() is what numbering at commit calls for every
--    row, what nextval() and a SQL caller of take() run, and take_value()'s way for a new
--    counter. On one hot counter numbered at commit, its takers waited on the row as a plain
--    UPDATE does: each commit woke the one holding the row's tuple lock, which found the row
--    changed and started its INSERT ... ON CONFLICT again, then handed the tuple lock on, all
--    while the counter was held. Measured with pgbench on PostgreSQL 15, 32 clients inserting
--    one row each into a table numbered at commit, 20 ms of other work per transaction, 8
--    alternating rounds of 8 s: 644-869 transactions a second before (mean 749), 677-975 with
--    the lock (mean 834), more in 7 rounds of 8. take() now queues too, after the kind lock and
--    the definition, right before its INSERT ... ON CONFLICT: the next statement's snapshot has
--    the previous holder's commit, so the row is free when it gets there. take_value() falling
--    back to take() holds the lock already. The lock is held as long as the row's and taken
--    right before it, so it adds no wait the row would not make (two counters whose 32-bit keys
--    collide excepted, as in 0039); numbering at commit still locks its stripes first (0020).
--    take_many() (standalone calls coalesced, which give way after 50 ms) still queues on the
--    row alone, and a taker holding the lock that meets it there waits for it as before.
--
-- Custom SQLSTATEs: none new.

-- Queues the transaction on a counter's lock (counter_lock(), 0039) unless it has written
-- counters 16 times already: PostgreSQL counts the rows a transaction inserts and updates in each table
-- (pg_stat_get_xact_tuples_*, kept for the statistics whether or not they are read), so the
-- bound costs no state of ordo's own (a setting to count in cost 15,000 instructions a take,
-- 6% of take_value(); this costs none measurable). With track_counts off (a superuser's
-- setting, which stops autovacuum too) the counts stay 0 and every take queues, as in 0039.
-- Plain SQL of one expression, so that plpgsql inlines it and runs it as a simple expression.
CREATE FUNCTION {{schema}}.queue_on_counter(seq_name text, seq_scope text, seq_period date) RETURNS void
LANGUAGE sql VOLATILE AS $$
  SELECT CASE
    WHEN pg_stat_get_xact_tuples_inserted('{{schema}}.counters'::regclass)
         + pg_stat_get_xact_tuples_updated('{{schema}}.counters'::regclass) >= 16 THEN NULL
    ELSE pg_advisory_xact_lock(hashtext('{{schema_name}}.counter'), {{schema}}.counter_lock(seq_name, seq_scope, seq_period))
  END
$$;

-- As in 0024, and the counter's queue before its row.
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

-- As in 0039, the counter's queue through queue_on_counter().
CREATE OR REPLACE FUNCTION {{schema}}.take_value(seq_name text, seq_scope text DEFAULT '', at timestamptz DEFAULT NULL)
RETURNS text[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  seq_kind text;
  seq_increment bigint;
  -- As in 0031: the last value the next one may follow without passing the maximum.
  seq_before_max bigint;
  seq_reset text;
  seq_time_zone text;
  seq_year_start integer;
  seq_format text;
  seq_period date;
  issued text[];
  durable text;
BEGIN
  -- Read at commit, so set anywhere in the transaction (and only when needed: setting it costs
  -- more than looking).
  IF current_setting('synchronous_commit') <> 'on' THEN
    durable := set_config('synchronous_commit', 'on', true);
  END IF;
  -- As in 0038: before the definition is read.
  IF pg_advisory_xact_lock_shared(hashtext('{{schema_name}}.sequence_kind'), hashtext(seq_name)) IS NULL THEN
    NULL; -- a null name: no lock, and no sequence (take() says so)
  END IF;
  SELECT d.kind, d.increment, d.max_value - d.increment, d.reset, d.time_zone, d.year_start, d.format,
         {{schema}}.period_start(d.reset, d.year_start, coalesce(at, now()) AT TIME ZONE d.time_zone)
    INTO seq_kind, seq_increment, seq_before_max, seq_reset, seq_time_zone, seq_year_start, seq_format, seq_period
    FROM {{schema}}.sequences AS d WHERE d.name = seq_name;
  IF seq_kind = 'gapless' THEN
    -- The counter's queue (above). A null scope: no lock, no row, and take() says why.
    IF {{schema}}.queue_on_counter(seq_name, seq_scope, seq_period) IS NULL THEN
      NULL;
    END IF;
    UPDATE {{schema}}.counters AS c
       SET previous = c.value, value = c.value + seq_increment, updated_at = now()
     WHERE c.sequence = seq_name AND c.scope = seq_scope AND c.period = seq_period AND c.value <= seq_before_max
    RETURNING ARRAY[c.value::text, c.value::text,
      CASE WHEN seq_reset = 'never' THEN NULL ELSE to_char(c.period, 'YYYY-MM-DD') END]
    INTO issued;
  END IF;
  IF issued IS NULL THEN
    SELECT ARRAY[t.value::text, t.text, t.period] INTO issued
      FROM {{schema}}.take(seq_name, seq_scope, coalesce(at, now()), 1) AS t;
  ELSIF seq_format IS NOT NULL THEN
    issued[2] := {{schema}}.render(seq_format, issued[1]::bigint, seq_scope,
      coalesce(at, now()) AT TIME ZONE seq_time_zone, seq_year_start);
  END IF;
  RETURN issued;
END $$;
