-- ordo 0042: a transaction counts the counters it queues on itself, in a transaction-local
-- setting, so that every transaction queues on its first 16 counters however busy its
-- connection is.
--
-- 0040 bounded the counter queue by PostgreSQL's count of the rows a transaction wrote to
-- ordo.counters (pg_stat_get_xact_tuples_inserted + _updated). That count is not the
-- transaction's: it is what the backend has counted since it last flushed its statistics, which
-- it does when idle, at most once a second (every 500 ms before PostgreSQL 15), and the counts of
-- the transactions it committed meanwhile are in it. A connection numbering more than 16 times
-- a second, the load the queue is for, found the bound reached in most of its transactions and
-- waited on the counter's row instead, as before 0039. Measured with pgbench on PostgreSQL 15, 16
-- clients, BEGIN; a number; an INSERT; COMMIT, three alternating rounds of 8 s: on one hot
-- counter 2,246-2,501 transactions a second with 0040's bound, 2,925-2,971 with this one (an
-- INSERT ... ON CONFLICT DO UPDATE by hand: 2,273-2,577); on counters drawn from 64,
-- 7,127-7,427 with 0040's bound, 7,296-8,804 with this one, against 8,052-8,687 by hand (four
-- rounds). The queue then works as 0039 and 0040 meant it to; a test that fails under 0040:
-- test/counter-queue.int.test.ts.
--
-- Now queue_on_counter() appends a character to the setting ordo.counter_queues for each counter
-- it queues on, and queues no more once it holds 16. A transaction-local setting ends with its
-- transaction, and goes back with a rolled-back savepoint, as the locks taken under it do. It
-- costs 12,000 instructions a take (callgrind, PostgreSQL 18: 262,500 with no bound, 263,200 with
-- 0040's, 274,600 with this one): the 15,000 that 0040 avoided, for a count that is right. It
-- tells its caller whether it queued: take_value() queued on a counter before its UPDATE found no
-- row and hands over to take(), which queues on it again, and gives its place back first, so
-- that a counter's first number counts once, not twice.
--
-- Custom SQLSTATEs: none new.

-- The count is of counters queued on, not of rows written: a transaction taking many numbers of
-- one counter holds its one lock, and track_counts (0040's source) no longer matters.
DROP FUNCTION {{schema}}.queue_on_counter(text, text, date);

-- Queues the transaction on a counter's lock (counter_lock(), 0039) unless it has queued on 16
-- counters already: true when it queued, false when it did not, null for a null key (no lock).
-- Plain SQL of one expression, so that plpgsql inlines it and runs it as a simple expression.
CREATE FUNCTION {{schema}}.queue_on_counter(seq_name text, seq_scope text, seq_period date) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
  SELECT CASE
    WHEN length(current_setting('ordo.counter_queues', true)) >= 16 THEN false
    WHEN set_config('ordo.counter_queues', coalesce(current_setting('ordo.counter_queues', true), '') || 'q', true) IS NULL
      THEN NULL
    ELSE pg_advisory_xact_lock(hashtext('{{schema_name}}.counter'), {{schema}}.counter_lock(seq_name, seq_scope, seq_period)) IS NOT NULL
  END
$$;

-- As in 0040; a counter's place in the count is given back before take() queues on it again.
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
  queued boolean;
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
    queued := {{schema}}.queue_on_counter(seq_name, seq_scope, seq_period);
    UPDATE {{schema}}.counters AS c
       SET previous = c.value, value = c.value + seq_increment, updated_at = now()
     WHERE c.sequence = seq_name AND c.scope = seq_scope AND c.period = seq_period AND c.value <= seq_before_max
    RETURNING ARRAY[c.value::text, c.value::text,
      CASE WHEN seq_reset = 'never' THEN NULL ELSE to_char(c.period, 'YYYY-MM-DD') END]
    INTO issued;
  END IF;
  IF issued IS NULL THEN
    IF queued THEN
      -- take() queues on the same counter: its lock is held already, and it counts once.
      PERFORM set_config('ordo.counter_queues', substr(current_setting('ordo.counter_queues'), 2), true);
    END IF;
    SELECT ARRAY[t.value::text, t.text, t.period] INTO issued
      FROM {{schema}}.take(seq_name, seq_scope, coalesce(at, now()), 1) AS t;
  ELSIF seq_format IS NOT NULL THEN
    issued[2] := {{schema}}.render(seq_format, issued[1]::bigint, seq_scope,
      coalesce(at, now()) AT TIME ZONE seq_time_zone, seq_year_start);
  END IF;
  RETURN issued;
END $$;
