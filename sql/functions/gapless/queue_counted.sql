-- Counts a place in the counter queue (queue_on_counter()) in the setting ordo.counter_queues, a
-- character each, while the transaction has fewer than 15: true when it counted one, false when
-- there are 15. A transaction-local setting, because it must count this transaction's takes
-- alone: it ends with the transaction and goes back with a rolled-back savepoint, as the locks
-- taken under it do. (PostgreSQL's per-transaction row counts would not do: they hold what the
-- backend has counted since it last flushed its statistics, other transactions' writes too.)
CREATE OR REPLACE FUNCTION {{schema}}.queue_counted() RETURNS boolean
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
