-- Queues the transaction on a counter's advisory lock (class hashtext('<schema>.counter'), key
-- counter_lock()), exclusive until the transaction ends, unless it has queued 16 times already:
-- true when it queued. take() and take_value() call it right before they write the counter's
-- row, so that takers of one hot counter wait in the lock table rather than on the row (see
-- take()). Taken after the kind lock, and only by a taker holding that one shared: a change of
-- kind still waits for every taker, and no new cycle of waits is closed. The row's lock stays
-- the guarantee: take_many() writes counters without this lock, and a taker holding it that
-- meets such a row waits for the row as any UPDATE does.
--
-- The bound: PostgreSQL's shared lock table holds max_locks_per_transaction × max_connections
-- locks for every session at once, and a transaction numbering from thousands of counters (a
-- billing run over every tenant) would fill it, failing itself and other sessions with "out of
-- shared memory". Past 16 a transaction's takes wait on the row alone, which is as good for a
-- batch. It counts numbers, not counters: 16 numbers of one counter count as much as one of 16.
-- A transaction that has written nothing yet has no transaction id and holds no counter's lock
-- (a take that queues writes the counter before it returns, and one that fails takes its lock
-- with it when it rolls back), so its first take queues without counting; its later ones count,
-- up to 15 (queue_counted()). With a null key (a null scope or name) there is no lock.
--
-- Plain SQL of one expression, so that plpgsql inlines it and runs it as a simple expression,
-- which plpgsql builds again, all of it, in every transaction: the count is in queue_counted(),
-- reached only when needed, and the counter's key is written once.
CREATE OR REPLACE FUNCTION {{schema}}.queue_on_counter(seq_name text, seq_scope text, seq_period date) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
  SELECT pg_advisory_xact_lock(hashtext('{{schema_name}}.counter'),
    CASE WHEN pg_current_xact_id_if_assigned() IS NULL OR {{schema}}.queue_counted()
         THEN {{schema}}.counter_lock(seq_name, seq_scope, seq_period) END) IS NOT NULL
$$;
