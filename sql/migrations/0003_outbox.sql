-- ordo 0003: the transactional outbox.
--
-- PostgreSQL hands out positions before commit, so positions commit out of order and a
-- consumer reading `position > last` skips whatever was still in flight. Each message keeps
-- the id of the transaction that wrote it; a consumer reads only messages of transactions
-- older than every transaction still running (pg_snapshot_xmin), in (transaction_id, position)
-- order, and checkpoints that tuple. A message can then only ever appear after the cursor.
--
-- Custom SQLSTATEs: OX003 invalid_argument, OX010 subscription_not_found,
-- OX011 subscription_conflict (the name is subscribed to another topic).

CREATE TABLE {{schema}}.messages (
  position        bigint GENERATED ALWAYS AS IDENTITY,
  transaction_id  xid8 NOT NULL DEFAULT pg_current_xact_id(),
  -- Checked once per append by append_many, not per row: a pattern test per row cost a
  -- fifth of an append's server time.
  topic           text NOT NULL,
  type            text NOT NULL CHECK (length(type) BETWEEN 1 AND 200),
  key             text CHECK (length(key) <= 200),
  message_id      text CHECK (length(message_id) BETWEEN 1 AND 200),
  data            jsonb NOT NULL,
  headers         jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(headers) = 'object'),
  created_at      timestamptz NOT NULL DEFAULT now(),
  -- The consumers' read order; with the topic fixed, an index scan returns it with no sort.
  -- It is the key as well: an index on position alone would cost every append and serve no read.
  CONSTRAINT messages_order PRIMARY KEY (topic, transaction_id, position)
);
-- A repeated message_id on a topic is stored once: retries of an append are harmless.
CREATE UNIQUE INDEX messages_message_id ON {{schema}}.messages (topic, message_id)
  WHERE message_id IS NOT NULL;

CREATE TABLE {{schema}}.subscriptions (
  name                 text PRIMARY KEY CHECK (length(name) <= 200 AND name ~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]*$'),
  topic                text NOT NULL,
  -- The cursor: the last message handled, as a (transaction, position) tuple.
  last_transaction_id  xid8 NOT NULL DEFAULT '0',
  last_position        bigint NOT NULL DEFAULT 0,
  -- The lease: one consumer at a time; another may take over once lease_until has passed.
  owner                text,
  lease_until          timestamptz,
  -- Failed deliveries of the message after the cursor, and why the last one failed.
  attempts             integer NOT NULL DEFAULT 0,
  last_error           text,
  delivered            bigint NOT NULL DEFAULT 0,
  created_at           timestamptz NOT NULL DEFAULT now(),
  checkpointed_at      timestamptz
);
CREATE INDEX subscriptions_topic ON {{schema}}.subscriptions (topic);

CREATE TABLE {{schema}}.dead_letters (
  subscription    text NOT NULL,
  position        bigint NOT NULL,
  transaction_id  xid8 NOT NULL,
  topic           text NOT NULL,
  type            text NOT NULL,
  key             text,
  message_id      text,
  data            jsonb NOT NULL,
  headers         jsonb NOT NULL,
  created_at      timestamptz NOT NULL,
  attempts        integer NOT NULL,
  error           text,
  parked_at       timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (subscription, position)
);

-- Appends messages in the caller's transaction and wakes consumers when it commits. Returns
-- the stored messages; a message whose message_id the topic already holds is not returned.
--
-- PostgreSQL serializes the commits of all transactions that sent a NOTIFY (one lock, held
-- through the commit's WAL flush): notifying on every append cut append throughput to a
-- quarter under 16 writers. So only one open transaction per topic notifies, the one holding
-- a transaction-scoped advisory lock on the topic; the others skip it. A consumer woken by
-- that commit reads everything committed by then, and its polling covers the rest. Wake-ups
-- only save latency: what a consumer reads is decided by read_messages alone.
CREATE FUNCTION {{schema}}.append_many(
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

-- One message, for triggers and other languages: the position, or null for a message_id the
-- topic already holds.
CREATE FUNCTION {{schema}}.append(
  msg_topic text, msg_type text, msg_data jsonb, msg_key text DEFAULT NULL,
  msg_id text DEFAULT NULL, msg_headers jsonb DEFAULT '{}')
RETURNS bigint
LANGUAGE sql VOLATILE AS $$
  SELECT max(a.position) FROM {{schema}}.append_many(
    msg_topic, ARRAY[msg_type], ARRAY[msg_data], ARRAY[msg_key], ARRAY[msg_id], ARRAY[msg_headers]) AS a
$$;

-- The messages a consumer may take after its cursor: only transactions older than every
-- running one (all of them have ended, so nothing can still commit before the cursor), in
-- (transaction_id, position) order. One statement, so the snapshot that decides what is safe
-- is the one that reads.
--
-- The plan must be an index scan in index order, stopping after max_count rows. When the
-- statistics say few rows follow the cursor (a caught-up consumer, or a burst that arrived
-- after the last ANALYZE) the planner prefers a bitmap scan and a sort, which reads and sorts
-- the whole backlog on every poll (20,000 rows read to return 1,000). The settings below take
-- that choice away from every caller, whatever language it is written in.
CREATE FUNCTION {{schema}}.read_messages(
  msg_topic text, after_transaction_id xid8, after_position bigint, max_count integer)
RETURNS SETOF {{schema}}.messages
LANGUAGE sql STABLE
SET enable_bitmapscan = off SET enable_sort = off SET enable_seqscan = off
AS $$
  SELECT * FROM {{schema}}.messages m
   WHERE m.topic = msg_topic
     AND (m.transaction_id, m.position) > (after_transaction_id, after_position)
     AND m.transaction_id < pg_snapshot_xmin(pg_current_snapshot())
   ORDER BY m.transaction_id, m.position
   LIMIT max_count
$$;

-- Creates the subscription if it is new. `start_from` 'beginning' reads the whole topic;
-- 'now' starts after every transaction already ended, so any message committed from now on
-- is delivered (a message committed a moment before may be too).
CREATE FUNCTION {{schema}}.create_subscription(sub_name text, sub_topic text, start_from text)
RETURNS SETOF {{schema}}.subscriptions
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  s {{schema}}.subscriptions;
BEGIN
  IF start_from NOT IN ('beginning', 'now') THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('from must be beginning or now, not %L', start_from);
  END IF;
  INSERT INTO {{schema}}.subscriptions (name, topic, last_transaction_id)
  VALUES (sub_name, sub_topic,
          CASE start_from WHEN 'now' THEN pg_snapshot_xmin(pg_current_snapshot()) ELSE '0' END)
  ON CONFLICT (name) DO NOTHING;
  SELECT * INTO s FROM {{schema}}.subscriptions WHERE name = sub_name;
  IF s.topic <> sub_topic THEN
    RAISE EXCEPTION USING ERRCODE = 'OX011',
      MESSAGE = format('The subscription %L reads topic %L, not %L', sub_name, s.topic, sub_topic);
  END IF;
  RETURN NEXT s;
END $$;

-- Takes or renews the lease: granted to its holder, or to anyone once it has lapsed or was
-- released. Returns the subscription when the caller holds the lease, nothing otherwise.
CREATE FUNCTION {{schema}}.lease_subscription(sub_name text, sub_owner text, lease_ms bigint)
RETURNS SETOF {{schema}}.subscriptions
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  RETURN QUERY
    UPDATE {{schema}}.subscriptions s
       SET owner = sub_owner, lease_until = clock_timestamp() + lease_ms * interval '1 millisecond'
     WHERE s.name = sub_name
       AND (s.owner = sub_owner OR s.owner IS NULL OR s.lease_until < clock_timestamp())
    RETURNING s.*;
  IF NOT FOUND AND NOT EXISTS (SELECT 1 FROM {{schema}}.subscriptions WHERE name = sub_name) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX010', MESSAGE = format('The subscription %L does not exist', sub_name);
  END IF;
END $$;

-- Gives the lease up at once, so another consumer takes over without waiting for it to lapse.
CREATE FUNCTION {{schema}}.release_subscription(sub_name text, sub_owner text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  sub_topic text;
BEGIN
  UPDATE {{schema}}.subscriptions SET owner = NULL, lease_until = NULL
   WHERE name = sub_name AND owner = sub_owner
  RETURNING topic INTO sub_topic;
  IF sub_topic IS NULL THEN
    RETURN false;
  END IF;
  PERFORM pg_notify('ordo_outbox.{{schema_name}}', sub_topic);
  RETURN true;
END $$;

-- Moves the cursor from (from_tx, from_pos) to (to_tx, to_pos), in the handler's transaction,
-- and renews the lease. False when the caller no longer holds the lease or the cursor moved
-- under it: the caller must roll back, so the handler's work and the cursor stay together.
CREATE FUNCTION {{schema}}.checkpoint(
  sub_name text, sub_owner text, from_tx xid8, from_pos bigint, to_tx xid8, to_pos bigint,
  handled integer, lease_ms bigint)
RETURNS boolean
LANGUAGE sql VOLATILE AS $$
  WITH moved AS (
    UPDATE {{schema}}.subscriptions
       SET last_transaction_id = to_tx, last_position = to_pos, attempts = 0, last_error = NULL,
           delivered = delivered + handled, checkpointed_at = clock_timestamp(),
           lease_until = clock_timestamp() + lease_ms * interval '1 millisecond'
     WHERE name = sub_name AND owner = sub_owner
       AND last_transaction_id = from_tx AND last_position = from_pos
    RETURNING 1)
  SELECT EXISTS (SELECT 1 FROM moved)
$$;

-- Counts a failed delivery of the message after the cursor. Returns the attempts so far, or
-- null when the caller no longer holds the lease or the cursor has moved.
CREATE FUNCTION {{schema}}.record_failure(
  sub_name text, sub_owner text, at_tx xid8, at_pos bigint, failure text, counted boolean)
RETURNS integer
LANGUAGE sql VOLATILE AS $$
  UPDATE {{schema}}.subscriptions
     SET attempts = attempts + CASE WHEN counted THEN 1 ELSE 0 END, last_error = failure
   WHERE name = sub_name AND owner = sub_owner
     AND last_transaction_id = at_tx AND last_position = at_pos
  RETURNING attempts
$$;

-- Parks the message after the cursor in dead_letters with the reason, and moves past it.
CREATE FUNCTION {{schema}}.park_message(
  sub_name text, sub_owner text, from_tx xid8, from_pos bigint, msg_tx xid8, msg_position bigint,
  failure text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  s {{schema}}.subscriptions;
  m {{schema}}.messages;
BEGIN
  SELECT * INTO s FROM {{schema}}.subscriptions
   WHERE name = sub_name AND owner = sub_owner
     AND last_transaction_id = from_tx AND last_position = from_pos
  FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  SELECT * INTO m FROM {{schema}}.messages
   WHERE topic = s.topic AND transaction_id = msg_tx AND position = msg_position;
  IF NOT FOUND OR (m.transaction_id, m.position) <= (from_tx, from_pos) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = format('message %s is not the next one of subscription %L', msg_position, sub_name);
  END IF;
  INSERT INTO {{schema}}.dead_letters (subscription, position, transaction_id, topic, type, key,
      message_id, data, headers, created_at, attempts, error)
  VALUES (sub_name, m.position, m.transaction_id, m.topic, m.type, m.key, m.message_id, m.data,
      m.headers, m.created_at, s.attempts, failure)
  ON CONFLICT (subscription, position) DO NOTHING;
  UPDATE {{schema}}.subscriptions
     SET last_transaction_id = m.transaction_id, last_position = m.position, attempts = 0,
         last_error = NULL, checkpointed_at = clock_timestamp()
   WHERE name = sub_name;
  RETURN true;
END $$;

-- How far a subscription is behind, and what holds it back. A committed message the consumer
-- may not read yet waits for an older transaction that is still open: that transaction is
-- named (pid, xid age, how long it has been open, state, application), wherever it runs.
CREATE FUNCTION {{schema}}.subscription_lag(sub_name text)
RETURNS TABLE (
  name text, topic text, owner text, lease_until timestamptz, last_transaction_id xid8,
  last_position bigint, attempts integer, last_error text, delivered bigint,
  checkpointed_at timestamptz, messages_behind bigint, oldest_created_at timestamptz,
  waiting bigint, blocker_pid integer, blocker_xid_age integer, blocker_xact_start timestamptz,
  blocker_state text, blocker_application_name text, blocker_prepared_gid text, now timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  s {{schema}}.subscriptions;
  horizon xid8 := pg_snapshot_xmin(pg_current_snapshot());
BEGIN
  SELECT * INTO s FROM {{schema}}.subscriptions sub WHERE sub.name = sub_name;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX010', MESSAGE = format('The subscription %L does not exist', sub_name);
  END IF;
  name := s.name; topic := s.topic; owner := s.owner; lease_until := s.lease_until;
  last_transaction_id := s.last_transaction_id; last_position := s.last_position;
  attempts := s.attempts; last_error := s.last_error; delivered := s.delivered;
  checkpointed_at := s.checkpointed_at; now := clock_timestamp();
  SELECT count(*), min(m.created_at), count(*) FILTER (WHERE m.transaction_id >= horizon)
    INTO messages_behind, oldest_created_at, waiting
    FROM {{schema}}.messages m
   WHERE m.topic = s.topic
     AND (m.transaction_id, m.position) > (s.last_transaction_id, s.last_position);
  IF waiting > 0 THEN
    -- The horizon is the oldest transaction still running: a session's, or a prepared one.
    SELECT a.pid, age(a.backend_xid), a.xact_start, a.state, a.application_name
      INTO blocker_pid, blocker_xid_age, blocker_xact_start, blocker_state, blocker_application_name
      FROM pg_stat_activity a
     WHERE a.backend_xid = xid(horizon);
    IF blocker_pid IS NULL THEN
      SELECT p.gid, age(p.transaction), p.prepared
        INTO blocker_prepared_gid, blocker_xid_age, blocker_xact_start
        FROM pg_prepared_xacts p
       WHERE p.transaction = xid(horizon);
    END IF;
  END IF;
  RETURN NEXT;
END $$;

-- Deletes messages older than `older_than` that every subscription of their topic has passed.
CREATE FUNCTION {{schema}}.prune(older_than interval, only_topic text DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE AS $$
  WITH gone AS (
    DELETE FROM {{schema}}.messages m
     WHERE m.created_at < now() - older_than
       AND (only_topic IS NULL OR m.topic = only_topic)
       AND NOT EXISTS (
         SELECT 1 FROM {{schema}}.subscriptions s
          WHERE s.topic = m.topic
            AND (m.transaction_id, m.position) > (s.last_transaction_id, s.last_position))
    RETURNING 1)
  SELECT count(*) FROM gone
$$;
