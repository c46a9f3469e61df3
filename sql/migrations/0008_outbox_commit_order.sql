-- ordo 0008: the outbox in commit order, stalled by nobody else, safe across a restore, and
-- split into partitions by key.
--
-- 0003 read only transactions older than the oldest one running. That order is the order in
-- which transactions first wrote, not the order in which they committed, and one idle session
-- anywhere on the server held every consumer back. Consumers now read in rounds, by snapshot
-- differences (as PgQ's ticks do), bounded by positions:
--
--   * A partition's state is a base (base_position, base_snapshot, base_bound): the messages
--     delivered are those with position <= base_position whose transaction is visible in
--     base_snapshot. base_bound is an xid8 taken after base_position was read: messages are
--     appended after their transaction has an id (append_many makes sure of it), so every
--     message at or below base_position has a transaction id below base_bound.
--   * A round takes a target (position, snapshot) read the same way, and delivers, in
--     position order, the messages at or below the target position visible in the target
--     snapshot and not yet delivered: those above the base position, and those at or below it
--     whose transaction the base saw running (in its xip, or between its xmax and its bound:
--     a short range, looked up by the primary key). When the round is done, the target is the
--     new base.
--
-- Why this order: if B committed before A appended, A's positions are above B's, and any
-- snapshot that sees A committed sees B committed; so B is in an earlier round than A, or in
-- the same one before it. An open transaction that appended nothing to the topic holds back
-- nothing; one that appended holds back only its own messages, delivered in the first round
-- after it commits.
--
-- Positions survive a dump and restore (the identity's value is restored), transaction ids do
-- not: a new cluster hands out ids below those of the restored messages, which mean nothing
-- there. `clusters` records each cluster the database has lived in (its system identifier:
-- the same on a physical replica, new after initdb) and the first position appended in it.
-- The first round that begins in a cluster not yet recorded records it, under a SHARE lock on
-- messages (so no append is in flight, and every message below the new first position is
-- committed). Messages below the first position of the current cluster need no visibility
-- test; a base taken in an older cluster is judged on its own stored values, which are
-- consistent among themselves (a dump holds only committed rows).
--
-- Custom SQLSTATEs: OX003 invalid_argument, OX010 subscription_not_found, OX011
-- subscription_conflict, OX020 subscription_busy.

-- Rounds read by position within a topic.
CREATE INDEX messages_topic_position ON {{schema}}.messages (topic, position);

-- The locks of transactions that appended to a topic and are still open (append_many takes
-- the topic's shared advisory lock): their messages are the only ones the topic waits for.
CREATE FUNCTION {{schema}}.appender_locks(msg_topic text) RETURNS SETOF pg_locks
LANGUAGE sql STABLE AS $$
  SELECT l.* FROM pg_locks l
   WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
     AND l.classid = ((hashtext('ordo_outbox_open.{{schema_name}}')::bigint + 4294967296) % 4294967296)::oid
     AND l.objid = ((hashtext(msg_topic)::bigint + 4294967296) % 4294967296)::oid
$$;

-- Which partition of `parts` a key belongs to. Messages without a key share one place, as if
-- their key were the empty text, so they keep their order too.
CREATE FUNCTION {{schema}}.partition_of(msg_key text, parts integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE WHEN parts <= 1 THEN 0
              ELSE (((hashtextextended(coalesce(msg_key, ''), 0) % parts) + parts) % parts)::integer END
$$;

-- This cluster, as its system identifier: the same on a physical replica, new after initdb.
CREATE FUNCTION {{schema}}.cluster_id() RETURNS bigint
LANGUAGE sql STABLE AS $$ SELECT system_identifier FROM pg_control_system() $$;

-- The last position handed out (by any transaction, committed or not), 0 before the first.
CREATE FUNCTION {{schema}}.last_position() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
  SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('{{schema}}.messages', 'position')::regclass), 0)
$$;

CREATE TABLE {{schema}}.clusters (
  cluster         bigint PRIMARY KEY,
  first_position  bigint NOT NULL,
  recorded_at     timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {{schema}}.clusters (cluster, first_position) VALUES ({{schema}}.cluster_id(), 0);

-- The cluster this database runs in now, recorded first if it is new (see above). `wait_ms`
-- bounds the wait for appends in flight; past it the caller gets lock_not_available and tries
-- again later.
CREATE FUNCTION {{schema}}.current_cluster(OUT cluster bigint, OUT first_position bigint)
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
  lock_wait := current_setting('lock_timeout');
  PERFORM set_config('lock_timeout', '2s', true);
  LOCK TABLE {{schema}}.messages IN SHARE MODE;
  PERFORM set_config('lock_timeout', lock_wait, true);
  INSERT INTO {{schema}}.clusters AS c (cluster, first_position)
  VALUES (here, {{schema}}.last_position() + 1)
  ON CONFLICT (cluster) DO NOTHING;
  SELECT c.cluster, c.first_position INTO cluster, first_position FROM {{schema}}.clusters c WHERE c.cluster = here;
END $$;

ALTER TABLE {{schema}}.subscriptions
  ADD COLUMN partitions integer NOT NULL DEFAULT 1 CHECK (partitions BETWEEN 1 AND 256);

CREATE TABLE {{schema}}.subscription_partitions (
  subscription        text NOT NULL REFERENCES {{schema}}.subscriptions (name) ON DELETE CASCADE,
  partition           integer NOT NULL,
  -- Bumped by every change: a batch is acknowledged only against the version it was read at.
  version             bigint NOT NULL DEFAULT 0,
  base_position       bigint NOT NULL,
  base_snapshot       pg_snapshot NOT NULL,
  base_bound          xid8,            -- null: unknown, every id from the snapshot's xmax up
  target_position     bigint,
  target_snapshot     pg_snapshot,
  target_bound        xid8,
  -- Messages below it were committed before the target's cluster began: no visibility test.
  target_floor        bigint,
  target_cluster      bigint,
  progress            bigint NOT NULL DEFAULT 0,       -- last position delivered in this round
  -- A cursor of 0003, kept until the first round after the upgrade is done.
  legacy_transaction_id xid8,
  legacy_position     bigint,
  -- The cluster the base was taken in.
  cluster             bigint NOT NULL,
  owner               text,
  lease_until         timestamptz,
  not_before          timestamptz,
  -- The batch handed out under the lease and not yet acknowledged.
  batch_last          bigint,
  batch_count         integer,
  batch_done          boolean,
  -- After a batch failed: deliver one at a time up to here, to find the message that fails.
  single_until        bigint,
  attempts            integer NOT NULL DEFAULT 0,
  attempts_position   bigint,
  last_error          text,
  delivered           bigint NOT NULL DEFAULT 0,
  -- Messages handed out again: after a failure, a lapsed lease, or a crash before the ack.
  redelivered         bigint NOT NULL DEFAULT 0,
  checkpointed_at     timestamptz,
  PRIMARY KEY (subscription, partition)
);

-- The consumers of a subscription in this library, so that they share its partitions.
CREATE TABLE {{schema}}.subscription_members (
  subscription  text NOT NULL REFERENCES {{schema}}.subscriptions (name) ON DELETE CASCADE,
  member        text NOT NULL,
  joined_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
  seen_until    timestamptz NOT NULL,
  PRIMARY KEY (subscription, member)
);

-- The upgrade: each subscription of 0003 becomes one partition whose first round delivers
-- everything committed after its cursor, in position order. The target is read in a statement
-- before the snapshot's, as every target is.
DO $$
DECLARE
  upto bigint := {{schema}}.last_position();
BEGIN
  INSERT INTO {{schema}}.subscription_partitions (subscription, partition, base_position,
      base_snapshot, base_bound, target_position, target_snapshot, target_bound, target_floor,
      target_cluster, legacy_transaction_id, legacy_position, cluster, owner, lease_until,
      attempts, last_error, delivered, checkpointed_at)
  SELECT s.name, 0, 0, '1:1:', '0', upto, pg_current_snapshot(), NULL, 0, {{schema}}.cluster_id(),
         s.last_transaction_id, s.last_position, {{schema}}.cluster_id(), NULL, NULL, s.attempts,
         s.last_error, s.delivered, s.checkpointed_at
    FROM {{schema}}.subscriptions s;
END $$;

DROP FUNCTION {{schema}}.read_messages(text, xid8, bigint, integer);
DROP FUNCTION {{schema}}.create_subscription(text, text, text);
DROP FUNCTION {{schema}}.lease_subscription(text, text, bigint);
DROP FUNCTION {{schema}}.release_subscription(text, text);
DROP FUNCTION {{schema}}.checkpoint(text, text, xid8, bigint, xid8, bigint, integer, bigint);
DROP FUNCTION {{schema}}.record_failure(text, text, xid8, bigint, text, boolean);
DROP FUNCTION {{schema}}.park_message(text, text, xid8, bigint, xid8, bigint, text);
DROP FUNCTION {{schema}}.subscription_lag(text);
DROP FUNCTION {{schema}}.prune(interval, text);
ALTER TABLE {{schema}}.subscriptions
  DROP COLUMN last_transaction_id, DROP COLUMN last_position, DROP COLUMN owner,
  DROP COLUMN lease_until, DROP COLUMN attempts, DROP COLUMN last_error, DROP COLUMN delivered,
  DROP COLUMN checkpointed_at;

-- An append gives its transaction an id before any position is taken (the rounds rely on it),
-- and marks the transaction as an open appender of the topic (a shared advisory lock), so that
-- lag can name it.
CREATE OR REPLACE FUNCTION {{schema}}.append_many(
  msg_topic text, msg_types text[], msg_data jsonb[], msg_keys text[], msg_ids text[], msg_headers jsonb[])
RETURNS TABLE (message_id text, "position" bigint, transaction_id xid8)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
  IF cardinality(msg_types) IS DISTINCT FROM cardinality(msg_data)
     OR cardinality(msg_types) IS DISTINCT FROM cardinality(msg_keys)
     OR cardinality(msg_types) IS DISTINCT FROM cardinality(msg_ids)
     OR cardinality(msg_types) IS DISTINCT FROM cardinality(msg_headers) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = 'append_many needs arrays of one length';
  END IF;
  IF length(msg_topic) > 200 OR msg_topic !~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]*$' THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'topic must be 1 to 200 letters, digits or _ . : - (not starting with . : -), not %L', msg_topic);
  END IF;
  PERFORM pg_current_xact_id();
  PERFORM pg_advisory_xact_lock_shared(hashtext('ordo_outbox_open.{{schema_name}}'), hashtext(msg_topic));
  RETURN QUERY
    INSERT INTO {{schema}}.messages AS m (topic, type, data, key, message_id, headers)
    SELECT msg_topic, t.type, t.data, t.key, t.message_id, coalesce(t.headers, '{}')
      FROM unnest(msg_types, msg_data, msg_keys, msg_ids, msg_headers) WITH ORDINALITY
           AS t (type, data, key, message_id, headers, n)
     ORDER BY t.n
    ON CONFLICT (topic, message_id) WHERE message_id IS NOT NULL DO NOTHING
    RETURNING m.message_id, m.position, m.transaction_id;
  IF pg_try_advisory_xact_lock(hashtext('ordo_outbox.{{schema_name}}'), hashtext(msg_topic)) THEN
    PERFORM pg_notify('ordo_outbox.{{schema_name}}', msg_topic);
  END IF;
END $$;

-- The base a subscription starts from, or is moved to: everything before `first_position` is
-- passed over, and everything from it on is delivered, committed or still to commit (null:
-- from what is appended next).
CREATE FUNCTION {{schema}}.start_base(first_position bigint,
  OUT base_position bigint, OUT base_snapshot pg_snapshot, OUT base_bound xid8)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  had_id boolean := pg_current_xact_id_if_assigned() IS NOT NULL;
BEGIN
  PERFORM {{schema}}.current_cluster();
  base_position := coalesce(first_position - 1, {{schema}}.last_position());
  IF base_position <= 0 THEN
    base_position := 0; base_snapshot := '1:1:'; base_bound := '0';
    RETURN;
  END IF;
  base_bound := CASE WHEN had_id THEN NULL ELSE pg_current_xact_id() END;
  base_snapshot := pg_current_snapshot();
END $$;

-- Creates the subscription if it is new, with `parts` partitions. `start_from`: 'beginning'
-- (the whole topic) or 'now' (what commits from now on, including messages of transactions
-- still open).
CREATE FUNCTION {{schema}}.create_subscription(sub_name text, sub_topic text, start_from text, parts integer DEFAULT 1)
RETURNS SETOF {{schema}}.subscriptions
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  s {{schema}}.subscriptions;
  b record;
BEGIN
  IF start_from NOT IN ('beginning', 'now') THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('from must be beginning or now, not %L', start_from);
  END IF;
  IF parts IS NULL OR parts NOT BETWEEN 1 AND 256 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('partitions must be an integer from 1 to 256, not %s', parts);
  END IF;
  b := {{schema}}.start_base(CASE start_from WHEN 'beginning' THEN 1 END);
  INSERT INTO {{schema}}.subscriptions (name, topic, partitions) VALUES (sub_name, sub_topic, parts)
  ON CONFLICT (name) DO NOTHING;
  IF FOUND THEN
    INSERT INTO {{schema}}.subscription_partitions (subscription, partition, base_position, base_snapshot, base_bound, cluster)
    SELECT sub_name, p, b.base_position, b.base_snapshot, b.base_bound, {{schema}}.cluster_id()
      FROM generate_series(0, parts - 1) AS p;
  END IF;
  SELECT * INTO s FROM {{schema}}.subscriptions WHERE name = sub_name;
  IF s.topic <> sub_topic THEN
    RAISE EXCEPTION USING ERRCODE = 'OX011',
      MESSAGE = format('The subscription %L reads topic %L, not %L', sub_name, s.topic, sub_topic);
  END IF;
  IF s.partitions <> parts THEN
    RAISE EXCEPTION USING ERRCODE = 'OX011', MESSAGE = format(
      'The subscription %L has %s partitions, not %s: per-key order would not survive a change; remove it or use another name',
      sub_name, s.partitions, parts);
  END IF;
  RETURN NEXT s;
END $$;

-- Moves every partition of a subscription to a new base (see start_base). Refused while a
-- consumer holds a partition: stop it first.
CREATE FUNCTION {{schema}}.seek_subscription(sub_name text, first_position bigint)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  held integer;
  b record;
  moved integer;
BEGIN
  PERFORM 1 FROM {{schema}}.subscriptions WHERE name = sub_name FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX010', MESSAGE = format('The subscription %L does not exist', sub_name);
  END IF;
  SELECT count(*) INTO held FROM {{schema}}.subscription_partitions
   WHERE subscription = sub_name AND owner IS NOT NULL AND lease_until > clock_timestamp();
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

-- The first position appended at or after `at` on the topic (for seek to a time), or null.
CREATE FUNCTION {{schema}}.first_position_since(sub_name text, at timestamptz)
RETURNS bigint
LANGUAGE sql STABLE AS $$
  SELECT coalesce(min(m.position), {{schema}}.last_position() + 1)
    FROM {{schema}}.messages m JOIN {{schema}}.subscriptions s ON s.topic = m.topic
   WHERE s.name = sub_name AND m.created_at >= at
$$;

-- A consumer in this library announces itself and learns the live consumers of the
-- subscription, oldest first: each takes the partitions whose number modulo their count is
-- its rank, so a newcomer takes some over and the partitions of one that left are shared out.
CREATE FUNCTION {{schema}}.join_subscription(sub_name text, sub_member text, lease_ms bigint)
RETURNS TABLE (member text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
  DELETE FROM {{schema}}.subscription_members
   WHERE subscription = sub_name AND seen_until < clock_timestamp();
  INSERT INTO {{schema}}.subscription_members (subscription, member, seen_until)
  VALUES (sub_name, sub_member, clock_timestamp() + lease_ms * interval '1 millisecond')
  ON CONFLICT (subscription, member) DO UPDATE SET seen_until = excluded.seen_until;
  RETURN QUERY SELECT m.member FROM {{schema}}.subscription_members m
   WHERE m.subscription = sub_name ORDER BY m.joined_at, m.member;
EXCEPTION WHEN foreign_key_violation THEN
  RAISE EXCEPTION USING ERRCODE = 'OX010', MESSAGE = format('The subscription %L does not exist', sub_name);
END $$;

CREATE FUNCTION {{schema}}.leave_subscription(sub_name text, sub_member text)
RETURNS void
LANGUAGE sql VOLATILE AS $$
  DELETE FROM {{schema}}.subscription_members WHERE subscription = sub_name AND member = sub_member
$$;

-- Takes or renews the lease of one partition: granted to its holder, or to anyone once it has
-- lapsed or was released. Returns the partition when the caller holds the lease.
CREATE FUNCTION {{schema}}.lease_partition(sub_name text, part integer, sub_owner text, lease_ms bigint)
RETURNS SETOF {{schema}}.subscription_partitions
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  RETURN QUERY
    UPDATE {{schema}}.subscription_partitions p
       SET owner = sub_owner, lease_until = clock_timestamp() + lease_ms * interval '1 millisecond'
     WHERE p.subscription = sub_name AND p.partition = part
       AND (p.owner = sub_owner OR p.owner IS NULL OR p.lease_until < clock_timestamp())
    RETURNING p.*;
  IF NOT FOUND AND NOT EXISTS (
       SELECT 1 FROM {{schema}}.subscription_partitions WHERE subscription = sub_name AND partition = part) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX010', MESSAGE = format('The subscription %L does not exist', sub_name);
  END IF;
END $$;

-- Gives a lease up at once, so that another consumer takes the partition without waiting.
CREATE FUNCTION {{schema}}.release_partition(sub_name text, part integer, sub_owner text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  sub_topic text;
BEGIN
  UPDATE {{schema}}.subscription_partitions SET owner = NULL, lease_until = NULL
   WHERE subscription = sub_name AND partition = part AND owner = sub_owner;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  SELECT topic INTO sub_topic FROM {{schema}}.subscriptions WHERE name = sub_name;
  PERFORM pg_notify('ordo_outbox.{{schema_name}}', sub_topic);
  RETURN true;
END $$;

-- The next batch of a partition whose lease `sub_owner` holds: the first `max_count` messages
-- of the round in position order (one while a failed batch is being searched). The batch is
-- recorded against the partition's version, which is returned with each message: ack() moves
-- past exactly this batch. Nothing to deliver: no rows, and nothing written.
CREATE FUNCTION {{schema}}.receive(sub_name text, part integer, sub_owner text, max_count integer, lease_ms bigint)
RETURNS TABLE ("position" bigint, transaction_id xid8, topic text, type text, key text,
               message_id text, data jsonb, headers jsonb, created_at timestamptz,
               version bigint, attempt integer)
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
  had_id boolean := pg_current_xact_id_if_assigned() IS NOT NULL;
  st {{schema}}.subscription_partitions;
  sub {{schema}}.subscriptions;
  fresh boolean := false;
  here record;
  limit_to integer;
  picked bigint[];
  shown bigint[];
BEGIN
  IF max_count IS NULL OR max_count NOT BETWEEN 1 AND 10000 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('max must be an integer from 1 to 10000, not %s', max_count);
  END IF;
  SELECT * INTO sub FROM {{schema}}.subscriptions s WHERE s.name = sub_name;
  SELECT * INTO st FROM {{schema}}.subscription_partitions p
   WHERE p.subscription = sub_name AND p.partition = part;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX010', MESSAGE = format('The subscription %L does not exist', sub_name);
  END IF;
  IF st.owner IS DISTINCT FROM sub_owner THEN
    RETURN;
  END IF;
  IF st.target_position IS NULL THEN
    fresh := true;
    here := {{schema}}.current_cluster();
    st.target_cluster := here.cluster;
    st.target_floor := here.first_position;
    st.target_position := {{schema}}.last_position();
    st.target_snapshot := pg_current_snapshot();
  END IF;
  limit_to := CASE WHEN st.single_until IS NOT NULL THEN 1 ELSE max_count END;
  WITH fresh_rows AS (
    SELECT m.position AS p FROM {{schema}}.messages m
     WHERE m.topic = sub.topic
       AND m.position > greatest(st.base_position, st.progress) AND m.position <= st.target_position
       AND (m.position < st.target_floor OR pg_visible_in_snapshot(m.transaction_id, st.target_snapshot))
       AND (sub.partitions = 1 OR {{schema}}.partition_of(m.key, sub.partitions) = part)
       AND (st.legacy_transaction_id IS NULL
            OR (m.transaction_id, m.position) > (st.legacy_transaction_id, st.legacy_position))
     ORDER BY m.position LIMIT limit_to + 1),
  -- At or below the base position, of transactions the base saw running: by its xip, and by
  -- the short range from its xmax to its bound (two index scans on the primary key).
  late_listed AS (
    SELECT m.position AS p FROM {{schema}}.messages m
     WHERE m.topic = sub.topic
       AND m.transaction_id = ANY (ARRAY(SELECT pg_snapshot_xip(st.base_snapshot)))
       AND m.position <= st.base_position AND m.position > st.progress
       -- A base of this cluster: what lies below its first position was delivered whole.
       AND (st.cluster <> st.target_cluster OR m.position >= st.target_floor)
       AND (m.position < st.target_floor OR pg_visible_in_snapshot(m.transaction_id, st.target_snapshot))
       AND (sub.partitions = 1 OR {{schema}}.partition_of(m.key, sub.partitions) = part)
     ORDER BY m.position LIMIT limit_to + 1),
  late_ranged AS (
    SELECT m.position AS p FROM {{schema}}.messages m
     WHERE m.topic = sub.topic
       AND m.transaction_id >= pg_snapshot_xmax(st.base_snapshot)
       AND m.transaction_id <= coalesce(st.base_bound, '18446744073709551615'::xid8)
       AND m.position <= st.base_position AND m.position > st.progress
       -- A base of this cluster: what lies below its first position was delivered whole.
       AND (st.cluster <> st.target_cluster OR m.position >= st.target_floor)
       AND (m.position < st.target_floor OR pg_visible_in_snapshot(m.transaction_id, st.target_snapshot))
       AND (sub.partitions = 1 OR {{schema}}.partition_of(m.key, sub.partitions) = part)
     ORDER BY m.position LIMIT limit_to + 1),
  both_sets AS (SELECT p FROM fresh_rows UNION ALL SELECT p FROM late_listed UNION ALL SELECT p FROM late_ranged)
  -- Positions only: the rows are read once more, by position, to be returned.
  SELECT array_agg(b.p ORDER BY b.p) INTO picked
    FROM (SELECT p FROM both_sets ORDER BY p LIMIT limit_to + 1) b;
  IF picked IS NULL THEN
    IF NOT fresh THEN
      -- A round whose rest is gone (deleted by hand): it is done.
      UPDATE {{schema}}.subscription_partitions p
         SET version = p.version + 1, base_position = p.target_position,
             base_snapshot = p.target_snapshot, base_bound = p.target_bound, cluster = p.target_cluster,
             target_position = NULL, target_snapshot = NULL, target_bound = NULL,
             target_floor = NULL, target_cluster = NULL, legacy_transaction_id = NULL, legacy_position = NULL,
             progress = 0, single_until = NULL
       WHERE p.subscription = sub_name AND p.partition = part;
    END IF;
    RETURN;  -- nothing new: no round begins, nothing is written
  END IF;
  shown := picked[1:limit_to];
  UPDATE {{schema}}.subscription_partitions p
     SET version = p.version + 1,
         target_position = st.target_position, target_snapshot = st.target_snapshot,
         target_floor = st.target_floor, target_cluster = st.target_cluster,
         target_bound = CASE WHEN NOT fresh THEN st.target_bound
                             WHEN had_id THEN NULL ELSE pg_current_xact_id() END,
         redelivered = p.redelivered + CASE
           WHEN p.batch_last IS NOT NULL OR p.single_until IS NOT NULL
                OR p.attempts_position = shown[1] THEN cardinality(shown) ELSE 0 END,
         batch_last = coalesce(shown[cardinality(shown)], p.progress),
         batch_count = cardinality(shown),
         batch_done = cardinality(picked) <= limit_to,
         lease_until = clock_timestamp() + lease_ms * interval '1 millisecond'
   WHERE p.subscription = sub_name AND p.partition = part
  RETURNING p.version INTO st.version;
  RETURN QUERY
    SELECT m.position, m.transaction_id, m.topic, m.type, m.key, m.message_id, m.data, m.headers,
           m.created_at, st.version,
           CASE WHEN st.attempts_position = shown[1] THEN st.attempts + 1 ELSE 1 END
      -- A join over the batch's position range reads the rows in index order: half the time
      -- of `position = ANY (shown)` and a sort.
      FROM {{schema}}.messages m JOIN unnest(shown) AS u (p) ON m.position = u.p
     WHERE m.topic = sub.topic AND m.position BETWEEN shown[1] AND shown[cardinality(shown)]
     ORDER BY m.position;
END $$;

-- Moves the partition past the batch received at `at_version` (the round's target becomes the
-- base when the batch ended it). In the handler's transaction, so that what the handler wrote
-- and the move commit together. `strict`: refused once the lease has lapsed, even if nobody
-- took it (receipts over HTTP); `release`: the lease is given up.
CREATE FUNCTION {{schema}}.ack(sub_name text, part integer, sub_owner text, at_version bigint,
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

-- A batch received at `at_version` failed. A batch of several: its messages are delivered one
-- at a time next ('split'). One message: its failures are counted; below `max_attempts` it is
-- delivered again after retry_ms[n] for its n-th failure (the last entry for later ones) ('retry'); then it is parked in dead_letters and passed
-- ('parked'), or, with park false, left where it is ('exhausted'). Null when the caller no
-- longer holds the partition at that version.
CREATE FUNCTION {{schema}}.nack(sub_name text, part integer, sub_owner text, at_version bigint,
                                failure text, max_attempts integer, park boolean, retry_ms bigint[],
                                release boolean DEFAULT false,
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
CREATE FUNCTION {{schema}}.receive_any(sub_name text, sub_owner text, max_count integer, lease_ms bigint)
RETURNS TABLE ("partition" integer, "position" bigint, transaction_id xid8, topic text, type text,
               key text, message_id text, data jsonb, headers jsonb, created_at timestamptz,
               version bigint, attempt integer)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  p integer;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM {{schema}}.subscriptions WHERE name = sub_name) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX010', MESSAGE = format('The subscription %L does not exist', sub_name);
  END IF;
  FOR p IN
    SELECT sp.partition FROM {{schema}}.subscription_partitions sp
     WHERE sp.subscription = sub_name
       AND (sp.owner IS NULL OR sp.lease_until < clock_timestamp())
       AND (sp.not_before IS NULL OR sp.not_before <= clock_timestamp())
     ORDER BY sp.checkpointed_at NULLS FIRST, sp.partition
  LOOP
    UPDATE {{schema}}.subscription_partitions sp
       SET owner = sub_owner, lease_until = clock_timestamp() + lease_ms * interval '1 millisecond'
     WHERE sp.subscription = sub_name AND sp.partition = p
       AND (sp.owner IS NULL OR sp.lease_until < clock_timestamp());
    CONTINUE WHEN NOT FOUND;
    RETURN QUERY SELECT p, r.* FROM {{schema}}.receive(sub_name, p, sub_owner, max_count, lease_ms) r;
    IF FOUND THEN
      RETURN;
    END IF;
    UPDATE {{schema}}.subscription_partitions sp SET owner = NULL, lease_until = NULL
     WHERE sp.subscription = sub_name AND sp.partition = p AND sp.owner = sub_owner;
  END LOOP;
END $$;

-- Whether a message is delivered by a partition's base.
CREATE FUNCTION {{schema}}.passed(st {{schema}}.subscription_partitions, msg_position bigint, msg_tx xid8)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
  SELECT msg_position <= st.base_position
     AND NOT (msg_tx = ANY (ARRAY(SELECT pg_snapshot_xip(st.base_snapshot)))
              OR (msg_tx >= pg_snapshot_xmax(st.base_snapshot)
                  AND (st.base_bound IS NULL OR msg_tx <= st.base_bound)))
$$;

-- How far each partition of a subscription is behind, and what holds its topic back: the
-- oldest open transaction that appended to the topic (its messages wait for it; nothing else
-- does), named by pid or prepared gid.
CREATE FUNCTION {{schema}}.subscription_lag(sub_name text)
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
           st.checkpointed_at, behind.n, behind.oldest, w,
           b_pid, b_age, b_start, b_state, b_app, b_gid, clock_timestamp()
      FROM {{schema}}.subscription_partitions st
      CROSS JOIN LATERAL (
        SELECT count(*) AS n, min(m.created_at) AS oldest FROM {{schema}}.messages m
         WHERE m.topic = sub.topic
           AND (sub.partitions = 1 OR {{schema}}.partition_of(m.key, sub.partitions) = st.partition)
           AND m.position > st.progress
           AND NOT {{schema}}.passed(st, m.position, m.transaction_id)
           AND (st.legacy_transaction_id IS NULL
                OR (m.transaction_id, m.position) > (st.legacy_transaction_id, st.legacy_position))) behind
     WHERE st.subscription = sub_name
     ORDER BY st.partition;
END $$;

-- Deletes messages older than `older_than` that every partition of every subscription of their
-- topic has passed (by its base: a round in hand keeps its messages).
CREATE FUNCTION {{schema}}.prune(older_than interval, only_topic text DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE AS $$
  WITH gone AS (
    DELETE FROM {{schema}}.messages m
     WHERE m.created_at < now() - older_than
       AND (only_topic IS NULL OR m.topic = only_topic)
       AND NOT EXISTS (
         SELECT 1 FROM {{schema}}.subscriptions s
           JOIN {{schema}}.subscription_partitions st ON st.subscription = s.name
          WHERE s.topic = m.topic
            AND st.partition = {{schema}}.partition_of(m.key, s.partitions)
            AND NOT {{schema}}.passed(st, m.position, m.transaction_id))
    RETURNING 1)
  SELECT count(*) FROM gone
$$;
