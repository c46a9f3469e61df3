-- ordo 0039: takers of one counter in callers' transactions queue on the counter's own lock,
-- and the counter's row is updated only once they hold it.
--
-- A counter that many transactions number from is updated by one of them at a time: each holds
-- its row from its take to its commit. The others wait on that row as any UPDATE does: one of
-- them holds the row's tuple lock and sleeps on the holder's transaction, the rest sleep on the
-- tuple lock. When the holder commits, the first wakes, finds the row changed, and re-runs its
-- UPDATE's plan on the new version (EvalPlanQual: the plan started again, every condition
-- checked again), then hands the tuple lock on. All of it happens while the counter is held,
-- so it sets the pace of every number taken from that counter; the more the statement checks,
-- the longer.
--
-- take_value() now takes the counter's own advisory lock, exclusive (counter_lock(), keyed by
-- sequence, scope and period), right before its UPDATE. Takers of one counter queue there, in
-- the lock table, and the one that gets it runs its UPDATE with a snapshot taken afterwards:
-- the previous holder's commit is in it, the row is free, and the UPDATE runs straight
-- through. The period is computed in the statement that reads the definition, before the
-- lock, so the UPDATE finds the row by its key alone. Measured with pgbench on PostgreSQL 15,
-- 16 clients on one counter, each transaction a number and an insert, beside a second pgbench
-- running the gapless bench's hand-written upsert on a counter of its own (8 s, so that both
-- meet the same machine): 0.78-0.96x the upsert's transactions before, 1.22-1.33x after. On a
-- counter drawn from 64 per transaction, where the CPU is the limit and waits are few, it runs
-- as 0038 did: 0.70-0.87x the upsert alone against 0.74-0.80x, in alternating rounds.
--
-- The row's lock stays the guarantee: take(), take_many() and numbering at commit update the
-- same rows without the advisory lock and queue on the row as before, and a taker holding the
-- advisory lock that meets one of them there waits for it as before. The key is a 32-bit hash:
-- two counters of one hash queue together, nothing more. The lock is taken after the kind lock,
-- and only by a taker that holds that one shared: a change of kind still waits for every taker
-- and closes no new cycle of waits.
--
-- sequence_holders() counts the takers queued on a counter's lock among those waiting for the
-- counter (they wait for its holder, or for the taker ahead of them that does).
--
-- Custom SQLSTATEs: none new.

-- The key of a counter's advisory lock, under the class hashtext('<schema>.counter'): its
-- period written out, as no setting changes it ('-infinity' for a sequence that never resets).
CREATE FUNCTION {{schema}}.counter_lock(seq_name text, seq_scope text, seq_period date) RETURNS integer
LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT hashtext(seq_name || chr(31) || seq_scope || chr(31) || coalesce(to_char(seq_period, 'YYYY-MM-DD'), '-infinity'))
$$;

-- As in 0038; the counter's lock before its UPDATE, and the period computed with the definition.
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
    IF pg_advisory_xact_lock(hashtext('{{schema_name}}.counter'), {{schema}}.counter_lock(seq_name, seq_scope, seq_period)) IS NULL THEN
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

-- As in 0013, and the takers queued on the counter's lock counted as waiting for it.
CREATE OR REPLACE FUNCTION {{schema}}.sequence_holders(seq_name text)
RETURNS TABLE (scope text, period text, pid integer, prepared_gid text, xact_start timestamptz, state text,
               application_name text, waiting bigint, now timestamptz)
LANGUAGE sql VOLATILE AS $$
  WITH locks AS MATERIALIZED (
    SELECT l.locktype, l.database, l.relation, l.page, l.tuple, l.transactionid, l.classid, l.objid, l.objsubid,
           l.pid, l.mode, l.granted
      FROM pg_locks AS l WHERE l.locktype IN ('transactionid', 'tuple', 'advisory')
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
                         THEN 0 ELSE on_holder.n END
                  + on_counter.n,
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
  -- Queued on the counter's lock (take_value()).
  CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM locks AS w
     WHERE w.locktype = 'advisory' AND NOT w.granted AND w.objsubid = 2
       AND w.database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND w.classid = hashtext('{{schema_name}}.counter')::oid
       AND w.objid = {{schema}}.counter_lock(h.sequence, h.scope, h.period)::oid) AS on_counter
  LEFT JOIN pg_stat_activity AS act ON act.pid = h.pid
  LEFT JOIN pg_prepared_xacts AS px ON h.pid IS NULL AND px.transaction = h.xmax
  ORDER BY h.scope, h.period
$$;
