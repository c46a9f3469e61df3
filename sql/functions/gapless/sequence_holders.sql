-- Who holds each locked counter of a sequence: a transaction that took a number in the
-- transaction and has not ended. Its update left its xid as xmax on the row version others see;
-- the xid's lock (a subtransaction's too) names the backend, or the prepared transaction. A
-- counter created by the open transaction (its period's first number) is invisible to others and
-- not listed. pg_locks is read once.
--
-- `waiting` counts each waiter once: on the counter whose row it waits for (a tuple lock), or,
-- when it waits for the holder's transaction alone (as INSERT … ON CONFLICT does, which take()
-- runs), on the holder's first counter in (sequence, scope, period) order, the holder's other
-- counters saying 0 for those; and the takers queued on the counter's advisory lock
-- (queue_on_counter()), which wait for its holder or for the taker ahead of them that does.
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
  -- Queued on the counter's lock (queue_on_counter(), by take() and take_value()).
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
