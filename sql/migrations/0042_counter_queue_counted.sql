-- ordo 0042: a transaction counts its takes that queued on a counter's lock itself, in a
-- transaction-local setting, so that the first numbers of every transaction queue however busy
-- its connection is.
--
-- 0040 bounded the counter queue by PostgreSQL's count of the rows a transaction wrote to
-- ordo.counters (pg_stat_get_xact_tuples_inserted + _updated). That count is not the
-- transaction's: it is what the backend has counted since it last flushed its statistics, which
-- it does when idle, at most once a second (every 500 ms before PostgreSQL 15), and the counts of
-- the transactions it committed meanwhile are in it. A connection numbering more than 16 times
-- a second, the load the queue is for, found the bound reached in most of its transactions and
-- waited on the counter's row instead, as before 0039. Measured with pgbench on PostgreSQL 15, 16
-- clients, BEGIN; a number; an INSERT; COMMIT, alternating rounds of 8 s, means of four rounds:
-- on one hot counter 2,278 transactions a second under 0041, 2,839 with this migration, 2,851
-- with no bound at all and 2,349 for an INSERT ... ON CONFLICT DO UPDATE by hand (in an earlier
-- run 2,206, 2,483 and 2,206); on counters drawn from 64, 7,147 under 0041, 7,686 with this
-- migration and 8,534 by hand (0.84x and 0.90x). The queue now works as 0039 and 0040 meant it
-- to (test/counter-queue.int.test.ts has a test that fails under 0041).
--
-- Now a transaction counts its own takes that queued, in the setting ordo.counter_queues (a
-- character each), and queues no more once it has queued 16 times: it holds at most 16 counter
-- locks, as 0040 meant. As 0040's count, it counts numbers, not counters: 16 numbers of one
-- counter count as much as one of 16 counters. A transaction-local setting ends with its
-- transaction and goes back with a rolled-back savepoint, as the locks taken under it do. Writing
-- a setting costs, so the first take of a transaction that has written nothing yet (no
-- transaction id), as a take in the caller's transaction usually is, queues without counting:
-- such a transaction holds no counter's lock. Its later takes, and numbering at commit, count (up
-- to 15, in queue_counted()). Counted by callgrind (bench/instructions.ts take attach), a number
-- in the caller's transaction takes 269,700 instructions on PostgreSQL 18 and 232,600 on 15,
-- against 263,200 and 226,000 before; an INSERT numbered at commit 694,000 and 607,600, against
-- 669,000 and 581,000 (a call of queue_counted() per row). take_value() that queued with a
-- transaction id (so counted) before its UPDATE found no row hands over to take(), which counts
-- again; it gives its place back first, so that a counter's first number counts once.
--
-- Custom SQLSTATEs: none new.

-- With the count of its own, track_counts (0040's source) no longer matters.
DROP FUNCTION {{schema}}.queue_on_counter(text, text, date);

-- Counts a place in the counter queue in the setting ordo.counter_queues, a character each, while
-- the transaction has fewer than 15: true when it counted one, false when there are 15.
CREATE FUNCTION {{schema}}.queue_counted() RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  counted text;
BEGIN
  IF length(current_setting('ordo.counter_queues', true)) >= 15 THEN
    RETURN false;
  END IF;
  counted := set_config('ordo.counter_queues', coalesce(current_setting('ordo.counter_queues', true), '') || 'q', true);
  RETURN true;
END $$;

-- Queues the transaction on a counter's lock (counter_lock(), 0039) unless it has queued 16 times
-- already: true when it queued. A transaction that has written nothing yet has no transaction id,
-- and holds no counter's lock (a take that queues writes the counter before it returns, and one
-- that fails takes its lock with it when it rolls back), so its first take queues without
-- counting; its later ones count, up to 15 (queue_counted()). With a null key (a null scope or
-- name) there is no lock. Plain SQL of one expression, so that plpgsql inlines it and runs it as a
-- simple expression, which plpgsql builds again, all of it, in every transaction: the count
-- written out in this expression cost 16,000 instructions a take, even where it was not reached,
-- and the counter's key written twice 14,000.
CREATE FUNCTION {{schema}}.queue_on_counter(seq_name text, seq_scope text, seq_period date) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
  SELECT pg_advisory_xact_lock(hashtext('{{schema_name}}.counter'),
    CASE WHEN pg_current_xact_id_if_assigned() IS NULL OR {{schema}}.queue_counted()
         THEN {{schema}}.counter_lock(seq_name, seq_scope, seq_period) END) IS NOT NULL
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
    IF queued AND pg_current_xact_id_if_assigned() IS NOT NULL THEN
      -- Counted (queued with a transaction id, which the UPDATE that found no row did not change):
      -- take() counts this counter again, so its place goes back first.
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
