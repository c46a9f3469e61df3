-- ordo 0023: a seek waits for a receive still writing its batch, and counts its holder; the
-- hourly clean-up keeps a permit whose hold has not begun to count.
--
-- seek_subscription (0008) counted the partitions held by a consumer without locking them,
-- then reset them all. A consumer whose lease had lapsed could receive in between: its
-- receive renewed the lease and wrote its batch, the seek's count (from before) found no
-- holder, its reset waited for that receive's transaction and then wrote over it. The seek
-- succeeded while a consumer held a batch under a fresh lease; a second consumer could lease
-- the partition at once and receive the same messages, and the first one's acknowledgement
-- found nothing. The seek now locks the partitions before it counts, so it waits for such a
-- receive and refuses (OX020) as for any consumer at work. It locks the subscription FOR NO
-- KEY UPDATE (it changes no key): receive_any's second write to its partition checks the
-- foreign key to the subscription (a KEY SHARE lock), which FOR UPDATE blocked, so a seek and
-- a receive_any could each wait for the other.
--
-- maintain() (0010) deleted permits that ended more than a day ago unless a refund was still
-- to be given back, but not those whose hold (fail() with retryAfter, up to a year) was still
-- to be folded into their key: on a key nobody asked for in a day, the hold was forgotten and
-- the next acquire granted. Such a permit is kept until its hold has passed.
--
-- Custom SQLSTATEs: none new.

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

-- As in 0010, keeping a permit whose hold is still to come.
CREATE OR REPLACE FUNCTION {{schema}}.maintain() RETURNS TABLE (what text, deleted bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  n bigint;
BEGIN
  IF NOT pg_try_advisory_xact_lock(hashtext('{{schema}}.maintain')) THEN
    RETURN;
  END IF;
  DELETE FROM {{schema}}.issued WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {{schema}}.issued WHERE issued_at < now() - interval '1 day' LIMIT 10000));
  GET DIAGNOSTICS n = ROW_COUNT;
  what := 'idempotency keys'; deleted := n; RETURN NEXT;
  DELETE FROM {{schema}}.permits WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {{schema}}.permits
     WHERE ended_at < now() - interval '1 day' AND NOT refund
       AND (hold_until IS NULL OR hold_until < now()) LIMIT 10000));
  GET DIAGNOSTICS n = ROW_COUNT;
  what := 'ended permits'; deleted := n; RETURN NEXT;
  deleted := {{schema}}.collect_batches(interval '7 days');
  what := 'range ownership'; RETURN NEXT;
  DELETE FROM {{schema}}.throttle_waiters WHERE id = ANY (ARRAY(
    SELECT id FROM {{schema}}.throttle_waiters WHERE alive_until < now() - interval '1 minute' LIMIT 10000));
  GET DIAGNOSTICS n = ROW_COUNT;
  DELETE FROM {{schema}}.throttle_lanes WHERE served_at < now() - interval '1 day';
  GET DIAGNOSTICS deleted = ROW_COUNT;
  what := 'abandoned waiters and lanes'; deleted := deleted + n; RETURN NEXT;
END $$;
