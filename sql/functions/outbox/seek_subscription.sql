-- Moves every partition of a subscription to a new base (start_base: everything from
-- `first_position` on is delivered; null: from what is appended next), dropping its round, batch,
-- retries and failures. Returns how many partitions moved.
--
-- Refused while a consumer holds a partition (OX020 subscription_busy): stop it first. The
-- partitions are locked before they are counted, so a receive still writing its batch under a
-- renewed lease is waited for and then counts as the holder it is; counted without locks, the seek
-- would write over that batch while a second consumer could lease the partition and receive the
-- same messages. The subscription is locked FOR NO KEY UPDATE (the seek changes no key):
-- receive_any's write to a partition checks the foreign key to its subscription with a KEY SHARE
-- lock, which FOR UPDATE would block, so a seek and a receive_any could each wait for the other.
--
-- OX010 subscription_not_found.
CREATE OR REPLACE FUNCTION {{schema}}.seek_subscription(sub_name text, first_position bigint)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  held integer;
  b record;
  moved integer;
BEGIN
  PERFORM 1 FROM {{schema}}.subscriptions WHERE name = sub_name FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX010', MESSAGE = format('The subscription %L does not exist', sub_name);
  END IF;
  -- Each partition locked, and counted as it is once its lock is had: a receive still
  -- writing its batch is waited for, and then counts as the holder it is.
  SELECT count(*) FILTER (WHERE p.owner IS NOT NULL AND p.lease_until > clock_timestamp()) INTO held
    FROM (SELECT sp.owner, sp.lease_until FROM {{schema}}.subscription_partitions sp
           WHERE sp.subscription = sub_name FOR UPDATE) p;
  IF held > 0 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX020', MESSAGE = format(
      'The subscription %L is being consumed (%s partition(s) held); stop its consumers, then seek', sub_name, held);
  END IF;
  b := {{schema}}.start_base(first_position);
  UPDATE {{schema}}.subscription_partitions
     SET version = version + 1, base_position = b.base_position, base_snapshot = b.base_snapshot,
         base_bound = b.base_bound, target_position = NULL, target_snapshot = NULL,
         target_bound = NULL, target_floor = NULL, target_cluster = NULL, progress = 0, legacy_transaction_id = NULL,
         legacy_position = NULL, cluster = {{schema}}.cluster_id(), owner = NULL,
         lease_until = NULL, not_before = NULL, batch_last = NULL, batch_count = NULL,
         batch_done = NULL, single_until = NULL, attempts = 0, attempts_position = NULL,
         last_error = NULL
   WHERE subscription = sub_name;
  GET DIAGNOSTICS moved = ROW_COUNT;
  RETURN moved;
END $$;
