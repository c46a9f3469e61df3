-- ordo 0012: corrections to the outbox of 0008 (see it for the rounds, bases and clusters).
--
--   * passed() (prune) applies the floor of the base's cluster as receive() does: after a
--     restore, messages carry ids of the old cluster, meaningless against a base of the new
--     one; those below the cluster's first position were delivered whole by the base.
--   * subscription_lag reads what receive() reads (above the base position, the base's xip,
--     its xmax-to-bound range) instead of the whole topic once per partition, and counts at
--     most 10,000 messages per partition.
--   * current_cluster: one session at a time waits, briefly, for appends in flight; the others
--     are told lock_not_available at once instead of queueing in front of every append.
--
-- Custom SQLSTATEs: 55P03 lock_not_available (retry shortly).

-- The cluster this database runs in now, recorded first if it is new. Recording waits for the
-- appends in flight (a SHARE lock on messages, see 0008); while it waits, new appends queue
-- behind it, so the wait is short (100 ms) and only one session waits at a time: the others
-- get lock_not_available at once and try again later.
CREATE OR REPLACE FUNCTION {{schema}}.current_cluster(OUT cluster bigint, OUT first_position bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  here bigint := {{schema}}.cluster_id();
  lock_wait text;
BEGIN
  SELECT c.cluster, c.first_position INTO cluster, first_position FROM {{schema}}.clusters c WHERE c.cluster = here;
  IF FOUND THEN
    RETURN;
  END IF;
  IF NOT pg_try_advisory_xact_lock(hashtext('ordo_cluster.{{schema_name}}'), 0) THEN
    RAISE EXCEPTION USING ERRCODE = '55P03', MESSAGE =
      'ordo is recording the new PostgreSQL cluster this database runs in (after a restore or a failover) in another session; retry shortly';
  END IF;
  -- Recorded by the session that held the lock before.
  SELECT c.cluster, c.first_position INTO cluster, first_position FROM {{schema}}.clusters c WHERE c.cluster = here;
  IF FOUND THEN
    RETURN;
  END IF;
  lock_wait := current_setting('lock_timeout');
  PERFORM set_config('lock_timeout', '100ms', true);
  BEGIN
    LOCK TABLE {{schema}}.messages IN SHARE MODE;
  EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION USING ERRCODE = '55P03', MESSAGE =
      'ordo records the new PostgreSQL cluster this database runs in (after a restore or a failover) once no append is in flight, and a transaction that appended is still open; retry shortly';
  END;
  PERFORM set_config('lock_timeout', lock_wait, true);
  INSERT INTO {{schema}}.clusters AS c (cluster, first_position)
  VALUES (here, {{schema}}.last_position() + 1)
  ON CONFLICT (cluster) DO NOTHING;
  SELECT c.cluster, c.first_position INTO cluster, first_position FROM {{schema}}.clusters c WHERE c.cluster = here;
END $$;

-- Whether a message is delivered by a partition's base: at or below its position, and either
-- below the first position of the base's cluster (committed before that cluster began, so
-- delivered whole, whatever its transaction id) or of a transaction the base saw committed.
CREATE OR REPLACE FUNCTION {{schema}}.passed(st {{schema}}.subscription_partitions, msg_position bigint, msg_tx xid8)
RETURNS boolean
LANGUAGE sql STABLE AS $$
  SELECT msg_position <= st.base_position
     AND (msg_position < coalesce((SELECT c.first_position FROM {{schema}}.clusters c WHERE c.cluster = st.cluster), 0)
          OR NOT (msg_tx = ANY (ARRAY(SELECT pg_snapshot_xip(st.base_snapshot)))
                  OR (msg_tx >= pg_snapshot_xmax(st.base_snapshot)
                      AND (st.base_bound IS NULL OR msg_tx <= st.base_bound))))
$$;

-- The committed messages of a partition not yet delivered (by its base and the round in
-- hand), counted up to `cap`, and the oldest creation time among those read. Read as receive()
-- reads: above the base position, and at or below it only the transactions the base saw
-- running (its xip, and its xmax-to-bound range), by index.
CREATE FUNCTION {{schema}}.behind(st {{schema}}.subscription_partitions, sub_topic text, parts integer,
                                  cap integer, OUT n bigint, OUT oldest timestamptz)
LANGUAGE plpgsql STABLE
SET enable_bitmapscan = off SET enable_seqscan = off
AS $$
DECLARE
  floor_at bigint := coalesce((SELECT c.first_position FROM {{schema}}.clusters c WHERE c.cluster = st.cluster), 0);
BEGIN
  SELECT least(count(*), cap), min(x.created_at) INTO n, oldest FROM (
    (SELECT m.created_at FROM {{schema}}.messages m
      WHERE m.topic = sub_topic
        AND m.position > greatest(st.base_position, st.progress)
        AND (parts = 1 OR {{schema}}.partition_of(m.key, parts) = st.partition)
        AND (st.legacy_transaction_id IS NULL
             OR (m.transaction_id, m.position) > (st.legacy_transaction_id, st.legacy_position))
      ORDER BY m.position LIMIT cap)
    UNION ALL
    (SELECT m.created_at FROM {{schema}}.messages m
      WHERE m.topic = sub_topic
        AND m.transaction_id = ANY (ARRAY(SELECT pg_snapshot_xip(st.base_snapshot)))
        AND m.position <= st.base_position AND m.position > st.progress AND m.position >= floor_at
        AND (parts = 1 OR {{schema}}.partition_of(m.key, parts) = st.partition)
      LIMIT cap)
    UNION ALL
    (SELECT m.created_at FROM {{schema}}.messages m
      WHERE m.topic = sub_topic
        AND m.transaction_id >= pg_snapshot_xmax(st.base_snapshot)
        AND m.transaction_id <= coalesce(st.base_bound, '18446744073709551615'::xid8)
        AND m.position <= st.base_position AND m.position > st.progress AND m.position >= floor_at
        AND (parts = 1 OR {{schema}}.partition_of(m.key, parts) = st.partition)
      LIMIT cap)) x;
END $$;

-- How far each partition of a subscription is behind (messages_behind counts at most 10,000
-- per partition: a partition further behind shows 10,000), and what holds its topic back: the
-- oldest open transaction that appended to the topic (its messages wait for it; nothing else
-- does), named by pid or prepared gid. No rows when the subscription was removed meanwhile.
CREATE OR REPLACE FUNCTION {{schema}}.subscription_lag(sub_name text)
RETURNS TABLE (
  name text, topic text, partitions integer, "partition" integer, owner text,
  lease_until timestamptz, "position" bigint, attempts integer, last_error text, delivered bigint,
  redelivered bigint, dead_lettered bigint,
  checkpointed_at timestamptz, messages_behind bigint, oldest_created_at timestamptz,
  waiting bigint, blocker_pid integer, blocker_xid_age integer, blocker_xact_start timestamptz,
  blocker_state text, blocker_application_name text, blocker_prepared_gid text, now timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  sub {{schema}}.subscriptions;
  w bigint;
  b_pid integer; b_age integer; b_start timestamptz; b_state text; b_app text; b_gid text;
BEGIN
  SELECT * INTO sub FROM {{schema}}.subscriptions s WHERE s.name = sub_name;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX010', MESSAGE = format('The subscription %L does not exist', sub_name);
  END IF;
  SELECT count(*) INTO w FROM {{schema}}.appender_locks(sub.topic);
  IF w > 0 THEN
    SELECT a.pid, coalesce(age(a.backend_xid), age(px.transaction)), coalesce(a.xact_start, px.prepared),
           a.state, a.application_name, px.gid
      INTO b_pid, b_age, b_start, b_state, b_app, b_gid
      FROM {{schema}}.appender_locks(sub.topic) l
      LEFT JOIN pg_stat_activity a ON a.pid = l.pid
      -- A prepared transaction has no backend: its own transactionid lock shares the dummy
      -- virtual transaction of its other locks, and names its xid.
      LEFT JOIN pg_locks t ON l.pid IS NULL AND t.pid IS NULL AND t.locktype = 'transactionid'
                          AND t.virtualtransaction = l.virtualtransaction
      LEFT JOIN pg_prepared_xacts px ON px.transaction = t.transactionid
     ORDER BY coalesce(a.xact_start, px.prepared) NULLS LAST
     LIMIT 1;
  END IF;
  RETURN QUERY
    SELECT sub.name, sub.topic, sub.partitions, st.partition,
           CASE WHEN st.lease_until > clock_timestamp() THEN st.owner END,
           CASE WHEN st.lease_until > clock_timestamp() THEN st.lease_until END,
           greatest(st.base_position, st.progress), st.attempts, st.last_error, st.delivered,
           st.redelivered, (SELECT count(*) FROM {{schema}}.dead_letters d WHERE d.subscription = sub_name),
           st.checkpointed_at, b.n, b.oldest, w,
           b_pid, b_age, b_start, b_state, b_app, b_gid, clock_timestamp()
      FROM {{schema}}.subscription_partitions st
      CROSS JOIN LATERAL {{schema}}.behind(st, sub.topic, sub.partitions, 10000) b
     WHERE st.subscription = sub_name
     ORDER BY st.partition;
END $$;
