-- Moves the partition past the batch received at `at_version` (the round's target becomes the base
-- when the batch ended it) and returns how many messages the batch held. In the handler's
-- transaction, so that what the handler wrote and the move commit together. Null, and nothing
-- written, when the caller no longer holds the partition at that version (taken over, or sought).
-- The row is locked as it is read (FOR UPDATE), so an ack waits for a takeover or seek in progress,
-- and then finds the partition no longer its own.
--
-- `strict`: refused once the lease has lapsed, even if nobody took it (receipts over HTTP).
-- `release`: the lease is given up, and the topic's channel notified so that another consumer takes
-- the partition at once; otherwise the lease is renewed for `lease_ms`.
CREATE OR REPLACE FUNCTION {{schema}}.ack(sub_name text, part integer, sub_owner text, at_version bigint,
                               lease_ms bigint, strict boolean DEFAULT false, release boolean DEFAULT false)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  st {{schema}}.subscription_partitions;
BEGIN
  SELECT * INTO st FROM {{schema}}.subscription_partitions
   WHERE subscription = sub_name AND partition = part AND owner = sub_owner AND version = at_version
     AND batch_last IS NOT NULL AND (NOT strict OR lease_until >= clock_timestamp())
  FOR UPDATE;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  UPDATE {{schema}}.subscription_partitions
     SET version = version + 1,
         base_position = CASE WHEN st.batch_done THEN st.target_position ELSE base_position END,
         base_snapshot = CASE WHEN st.batch_done THEN st.target_snapshot ELSE base_snapshot END,
         base_bound = CASE WHEN st.batch_done THEN st.target_bound ELSE base_bound END,
         target_position = CASE WHEN st.batch_done THEN NULL ELSE target_position END,
         target_snapshot = CASE WHEN st.batch_done THEN NULL ELSE target_snapshot END,
         target_bound = CASE WHEN st.batch_done THEN NULL ELSE target_bound END,
         cluster = CASE WHEN st.batch_done THEN st.target_cluster ELSE cluster END,
         target_floor = CASE WHEN st.batch_done THEN NULL ELSE target_floor END,
         target_cluster = CASE WHEN st.batch_done THEN NULL ELSE target_cluster END,
         legacy_transaction_id = CASE WHEN st.batch_done THEN NULL ELSE legacy_transaction_id END,
         legacy_position = CASE WHEN st.batch_done THEN NULL ELSE legacy_position END,
         progress = CASE WHEN st.batch_done THEN 0 ELSE st.batch_last END,
         single_until = CASE WHEN st.batch_done OR st.batch_last >= single_until THEN NULL ELSE single_until END,
         batch_last = NULL, batch_count = NULL, batch_done = NULL,
         attempts = 0, attempts_position = NULL, last_error = NULL,
         delivered = delivered + st.batch_count, checkpointed_at = clock_timestamp(),
         owner = CASE WHEN release THEN NULL ELSE owner END,
         lease_until = CASE WHEN release THEN NULL
                            ELSE clock_timestamp() + lease_ms * interval '1 millisecond' END
   WHERE subscription = sub_name AND partition = part;
  IF release THEN
    PERFORM pg_notify('ordo_outbox.{{schema_name}}', (SELECT topic FROM {{schema}}.subscriptions WHERE name = sub_name));
  END IF;
  RETURN st.batch_count;
END $$;
