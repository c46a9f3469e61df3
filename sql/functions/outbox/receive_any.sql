-- For consumers that are not this library (HTTP): leases the first partition that is free, not
-- waiting for a retry, and has something to deliver, and receives from it; no rows when none has. A
-- partition leased and found empty after all is released at once.
--
-- Partitions are looked at without a lock, least recently checkpointed first, and one is locked
-- only when it has messages behind, with SKIP LOCKED: a caller never waits for another, so two
-- callers cannot deadlock, and a poll that finds nothing writes nothing. A round's target is read
-- here, before the transaction has an id, so that the id the lease's write takes is its bound (see
-- receive); receive() would find the id already taken. A batch whose lease lapsed counts as a
-- failure (fail_lapsed).
--
-- OX003 invalid_argument: max_count outside 1 to 10000, or max_attempts below 1.
-- OX010 subscription_not_found.
CREATE OR REPLACE FUNCTION {{schema}}.receive_any(sub_name text, sub_owner text, max_count integer, lease_ms bigint,
                                                  max_attempts integer DEFAULT 10)
RETURNS TABLE ("partition" integer, "position" bigint, transaction_id xid8, topic text, type text,
               key text, message_id text, data jsonb, headers jsonb, created_at timestamptz,
               version bigint, attempt integer)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  sub {{schema}}.subscriptions;
  seen {{schema}}.subscription_partitions;
  st {{schema}}.subscription_partitions;
  bound_ok boolean;
  to_position bigint;
  to_snapshot pg_snapshot;
  to_floor bigint;
  to_cluster bigint;
  at_version bigint;
BEGIN
  IF max_count IS NULL OR max_count NOT BETWEEN 1 AND 10000 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('max must be an integer from 1 to 10000, not %s', max_count);
  END IF;
  IF max_attempts IS NULL OR max_attempts < 1 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('max_attempts must be a positive integer, not %s', max_attempts);
  END IF;
  SELECT * INTO sub FROM {{schema}}.subscriptions s WHERE s.name = sub_name;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX010', MESSAGE = format('The subscription %L does not exist', sub_name);
  END IF;
  FOR seen IN
    SELECT sp.* FROM {{schema}}.subscription_partitions sp
     WHERE sp.subscription = sub_name
       AND (sp.owner IS NULL OR sp.lease_until < clock_timestamp())
       AND (sp.not_before IS NULL OR sp.not_before <= clock_timestamp())
     ORDER BY sp.checkpointed_at NULLS FIRST, sp.partition
  LOOP
    CONTINUE WHEN ({{schema}}.behind(seen, sub.topic, sub.partitions, 1)).n = 0;
    to_position := NULL;
    IF seen.target_position IS NULL THEN
      SELECT c.cluster, c.first_position INTO to_cluster, to_floor FROM {{schema}}.current_cluster() c;
      bound_ok := pg_current_xact_id_if_assigned() IS NULL;
      to_position := {{schema}}.last_position();
      to_snapshot := pg_current_snapshot();
    END IF;
    SELECT * INTO st FROM {{schema}}.subscription_partitions sp
     WHERE sp.subscription = sub_name AND sp.partition = seen.partition
       AND (sp.owner IS NULL OR sp.lease_until < clock_timestamp())
       AND (sp.not_before IS NULL OR sp.not_before <= clock_timestamp())
    FOR UPDATE SKIP LOCKED;
    CONTINUE WHEN NOT FOUND;
    -- The target read above, unless the partition changed since it was looked at (a newer base
    -- may lie past it): then receive() reads one itself.
    UPDATE {{schema}}.subscription_partitions sp
       SET owner = sub_owner, lease_until = clock_timestamp() + lease_ms * interval '1 millisecond',
           version = sp.version + 1,
           target_position = CASE WHEN u.upd THEN to_position ELSE sp.target_position END,
           target_snapshot = CASE WHEN u.upd THEN to_snapshot ELSE sp.target_snapshot END,
           target_bound = CASE WHEN NOT u.upd THEN sp.target_bound
                               WHEN bound_ok THEN pg_current_xact_id() END,
           target_floor = CASE WHEN u.upd THEN to_floor ELSE sp.target_floor END,
           target_cluster = CASE WHEN u.upd THEN to_cluster ELSE sp.target_cluster END
      FROM (SELECT to_position IS NOT NULL AND st.target_position IS NULL AND st.version = seen.version AS upd) u
     WHERE sp.subscription = sub_name AND sp.partition = st.partition
    RETURNING sp.version INTO at_version;
    PERFORM {{schema}}.fail_lapsed(st, sub_owner, at_version, max_attempts, true);
    RETURN QUERY SELECT st.partition, r.* FROM {{schema}}.receive(sub_name, st.partition, sub_owner, max_count, lease_ms) r;
    IF FOUND THEN
      RETURN;
    END IF;
    UPDATE {{schema}}.subscription_partitions sp SET owner = NULL, lease_until = NULL
     WHERE sp.subscription = sub_name AND sp.partition = st.partition AND sp.owner = sub_owner;
  END LOOP;
END $$;
