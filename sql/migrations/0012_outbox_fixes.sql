-- ordo 0012: corrections to the outbox of 0008 (see it for the rounds, bases and clusters).
--
--   * passed() (prune) applies the floor of the base's cluster as receive() does: after a
--     restore, messages carry ids of the old cluster, meaningless against a base of the new
--     one; those below the cluster's first position were delivered whole by the base.
--   * subscription_lag reads what receive() reads (above the base position, the base's xip,
--     its xmax-to-bound range) instead of the whole topic once per partition, and counts at
--     most 10,000 messages per partition.
--   * receive_any locks nothing it does not lease (SKIP LOCKED: two callers never wait for
--     each other, so they cannot deadlock), writes nothing when there is nothing to receive,
--     reads a round's target before its transaction has an id (so the round gets a real
--     bound), and counts a batch whose lease lapsed as a failed attempt: after max_attempts
--     lapses a message is parked, as after max_attempts nacks.
--   * nack takes `strict`, as ack does: a receipt whose lease lapsed is refused.
--   * current_cluster: one session at a time waits, briefly, for appends in flight; the others
--     are told lock_not_available at once instead of queueing in front of every append.
--
-- Custom SQLSTATEs: OX003 invalid_argument, OX010 subscription_not_found; 55P03
-- lock_not_available (retry shortly).

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

-- nack of 0008 with `strict`, as ack has: refused once the lease has lapsed, even if nobody
-- took it (receipts over HTTP).
DROP FUNCTION {{schema}}.nack(text, integer, text, bigint, text, integer, boolean, bigint[], boolean);
CREATE FUNCTION {{schema}}.nack(sub_name text, part integer, sub_owner text, at_version bigint,
                                failure text, max_attempts integer, park boolean, retry_ms bigint[],
                                release boolean DEFAULT false, strict boolean DEFAULT false,
                                OUT outcome text, OUT attempts integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  st {{schema}}.subscription_partitions;
  sub {{schema}}.subscriptions;
  m {{schema}}.messages;
BEGIN
  SELECT * INTO st FROM {{schema}}.subscription_partitions p
   WHERE p.subscription = sub_name AND p.partition = part AND p.owner = sub_owner
     AND p.version = at_version AND p.batch_last IS NOT NULL
     AND (NOT strict OR p.lease_until >= clock_timestamp())
  FOR UPDATE;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  IF st.batch_count > 1 THEN
    outcome := 'split';
    attempts := st.attempts;
    UPDATE {{schema}}.subscription_partitions p
       SET version = p.version + 1, single_until = st.batch_last, last_error = failure,
           batch_last = NULL, batch_count = NULL, batch_done = NULL, not_before = NULL,
           owner = CASE WHEN release THEN NULL ELSE p.owner END,
           lease_until = CASE WHEN release THEN NULL ELSE p.lease_until END
     WHERE p.subscription = sub_name AND p.partition = part;
    RETURN;
  END IF;
  attempts := CASE WHEN st.attempts_position = st.batch_last THEN st.attempts + 1 ELSE 1 END;
  IF attempts >= max_attempts AND park THEN
    SELECT * INTO sub FROM {{schema}}.subscriptions s WHERE s.name = sub_name;
    SELECT * INTO m FROM {{schema}}.messages x WHERE x.topic = sub.topic AND x.position = st.batch_last;
    INSERT INTO {{schema}}.dead_letters (subscription, position, transaction_id, topic, type, key,
        message_id, data, headers, created_at, attempts, error)
    VALUES (sub_name, m.position, m.transaction_id, m.topic, m.type, m.key, m.message_id, m.data,
        m.headers, m.created_at, attempts, failure)
    ON CONFLICT (subscription, position) DO NOTHING;
    PERFORM {{schema}}.ack(sub_name, part, sub_owner, at_version, 0, false, release);
    -- Parked is not delivered; the lease stays as it was.
    UPDATE {{schema}}.subscription_partitions p
       SET delivered = p.delivered - 1, lease_until = CASE WHEN release THEN NULL ELSE st.lease_until END,
           attempts = 0, last_error = failure
     WHERE p.subscription = sub_name AND p.partition = part;
    outcome := 'parked';
    RETURN;
  END IF;
  outcome := CASE WHEN attempts >= max_attempts THEN 'exhausted' ELSE 'retry' END;
  UPDATE {{schema}}.subscription_partitions p
     SET version = p.version + 1, attempts = nack.attempts, attempts_position = st.batch_last,
         last_error = failure, batch_last = NULL, batch_count = NULL, batch_done = NULL,
         not_before = clock_timestamp()
                      + greatest(coalesce(retry_ms[least(nack.attempts, cardinality(retry_ms))], 0), 0)
                        * interval '1 millisecond',
         owner = CASE WHEN release THEN NULL ELSE p.owner END,
         lease_until = CASE WHEN release THEN NULL ELSE p.lease_until END
   WHERE p.subscription = sub_name AND p.partition = part;
END $$;

-- For consumers that are not this library (HTTP): lease the first partition that is free, not
-- waiting for a retry, and has something to deliver, and receive from it.
--
-- Partitions are looked at without a lock, least recently checkpointed first, and only one
-- with messages behind is locked, with SKIP LOCKED: a caller never waits for another, so two
-- callers cannot deadlock, and a poll that finds nothing writes nothing. A round's target is
-- read here, before the transaction has an id, and the id taken next is its bound (see 0008);
-- receive() would find the id already taken by the lease. A batch whose lease lapsed counts as
-- a failure (nack): several messages come one at a time next; a single message is parked
-- after `max_attempts` lapses (and nacks).
DROP FUNCTION {{schema}}.receive_any(text, text, integer, bigint);
CREATE FUNCTION {{schema}}.receive_any(sub_name text, sub_owner text, max_count integer, lease_ms bigint,
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
    IF st.batch_last IS NOT NULL AND st.owner IS NOT NULL THEN
      -- Its lease lapsed before the batch was acknowledged: a failure, as a nack would be.
      PERFORM {{schema}}.nack(sub_name, st.partition, sub_owner, at_version,
        'the lease (visibilityTimeout) lapsed before the batch was acknowledged',
        max_attempts, true, '{0}', false, false);
    END IF;
    RETURN QUERY SELECT st.partition, r.* FROM {{schema}}.receive(sub_name, st.partition, sub_owner, max_count, lease_ms) r;
    IF FOUND THEN
      RETURN;
    END IF;
    UPDATE {{schema}}.subscription_partitions sp SET owner = NULL, lease_until = NULL
     WHERE sp.subscription = sub_name AND sp.partition = st.partition AND sp.owner = sub_owner;
  END LOOP;
END $$;
