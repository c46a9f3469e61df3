-- ordo 0015: the outbox's hot paths, same results in less time, and one reading of what a
-- partition has not delivered.
--
-- receive() in one statement: 0008's receive() picked the batch's positions, then read the
-- rows again by position: about half of its time for a batch of 1,000 went to that second
-- read (a hash join and a sort) and to planning two statements. The candidates are read whole
-- once: the rows a visibility test reads from the heap anyway. The partition's row is moved by
-- a data-modifying CTE of the same statement, so the batch returned and the version recorded
-- cannot differ. What a batch holds, and in which order, is unchanged (see 0008).
--
-- receive() and lag (0012's behind()) each spelled out which messages a partition has not
-- delivered, and differed: receive looked for late messages (of transactions the base saw
-- running) below the first position of the base's own cluster when the target was in another
-- one, so after two restores a message of the first cluster whose id the base saw running came
-- again. Both now read undelivered(), with the floor of the base's own cluster.
--
-- append_many() without ON CONFLICT when no message has an id (see there).

-- The messages a partition has not delivered, each kind in position order and at most `cap`
-- of it: above its base position (and its progress in the round); at or below it, those of
-- transactions its base saw running, by its xip and by the short range from its xmax to its
-- bound (two index scans on the primary key), above the first position of the base's own
-- cluster (what lies below was delivered whole). receive() gives its round's target: at most
-- `upto`, committed in `seen` (no test below `seen_floor`, committed before the target's
-- cluster began); lag gives none, and counts what its statement sees committed. A SQL function
-- without settings, so that the planner inlines it into the statement that reads it.
CREATE FUNCTION {{schema}}.undelivered(st {{schema}}.subscription_partitions, sub_topic text, parts integer,
                                       upto bigint, seen pg_snapshot, seen_floor bigint, cap integer)
RETURNS SETOF {{schema}}.messages
LANGUAGE sql STABLE AS $$
  (SELECT m.* FROM {{schema}}.messages m
    WHERE m.topic = sub_topic
      AND m.position > greatest(st.base_position, st.progress) AND m.position <= upto
      AND (seen IS NULL OR m.position < seen_floor OR pg_visible_in_snapshot(m.transaction_id, seen))
      AND (parts = 1 OR {{schema}}.partition_of(m.key, parts) = st.partition)
      AND (st.legacy_transaction_id IS NULL
           OR (m.transaction_id, m.position) > (st.legacy_transaction_id, st.legacy_position))
    ORDER BY m.position LIMIT cap)
  UNION ALL
  (SELECT m.* FROM {{schema}}.messages m
    WHERE m.topic = sub_topic
      AND m.transaction_id = ANY (ARRAY(SELECT pg_snapshot_xip(st.base_snapshot)))
      AND m.position <= st.base_position AND m.position > st.progress
      AND m.position >= coalesce((SELECT c.first_position FROM {{schema}}.clusters c WHERE c.cluster = st.cluster), 0)
      AND (seen IS NULL OR m.position < seen_floor OR pg_visible_in_snapshot(m.transaction_id, seen))
      AND (parts = 1 OR {{schema}}.partition_of(m.key, parts) = st.partition)
    ORDER BY m.position LIMIT cap)
  UNION ALL
  (SELECT m.* FROM {{schema}}.messages m
    WHERE m.topic = sub_topic
      AND m.transaction_id >= pg_snapshot_xmax(st.base_snapshot)
      AND m.transaction_id <= coalesce(st.base_bound, '18446744073709551615'::xid8)
      AND m.position <= st.base_position AND m.position > st.progress
      AND m.position >= coalesce((SELECT c.first_position FROM {{schema}}.clusters c WHERE c.cluster = st.cluster), 0)
      AND (seen IS NULL OR m.position < seen_floor OR pg_visible_in_snapshot(m.transaction_id, seen))
      AND (parts = 1 OR {{schema}}.partition_of(m.key, parts) = st.partition)
    ORDER BY m.position LIMIT cap)
$$;

CREATE OR REPLACE FUNCTION {{schema}}.receive(sub_name text, part integer, sub_owner text, max_count integer, lease_ms bigint)
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
  RETURN QUERY
  -- The first limit_to + 1 of the round, in position order: one more than is shown tells
  -- whether the round ends with this batch.
  WITH candidates AS (
    SELECT * FROM {{schema}}.undelivered(st, sub.topic, sub.partitions, st.target_position,
                                         st.target_snapshot, st.target_floor, limit_to + 1)),
  picked AS (SELECT * FROM candidates c ORDER BY c.position LIMIT limit_to + 1),
  -- The batch is the first limit_to picked: its last position ends what is returned (no window
  -- over the rows, a fifth of the statement's time).
  batch AS (
    SELECT a.positions[1] AS first, a.positions[least(cardinality(a.positions), limit_to)] AS last,
           least(cardinality(a.positions), limit_to) AS shown, cardinality(a.positions) AS picked
      FROM (SELECT array_agg(k.position ORDER BY k.position) AS positions FROM picked k) a
     WHERE a.positions IS NOT NULL),
  moved AS (
    UPDATE {{schema}}.subscription_partitions p
       SET version = p.version + 1,
           target_position = st.target_position, target_snapshot = st.target_snapshot,
           target_floor = st.target_floor, target_cluster = st.target_cluster,
           target_bound = CASE WHEN NOT fresh THEN st.target_bound
                               WHEN had_id THEN NULL ELSE pg_current_xact_id() END,
           redelivered = p.redelivered + CASE
             WHEN p.batch_last IS NOT NULL OR p.single_until IS NOT NULL
                  OR p.attempts_position = b.first THEN b.shown ELSE 0 END,
           batch_last = b.last,
           batch_count = b.shown,
           batch_done = b.picked <= limit_to,
           lease_until = clock_timestamp() + lease_ms * interval '1 millisecond'
      FROM batch b
     WHERE p.subscription = sub_name AND p.partition = part
    RETURNING p.version, b.first, b.last)
  SELECT k.position, k.transaction_id, k.topic, k.type, k.key, k.message_id, k.data, k.headers,
         k.created_at,
         mv.version, CASE WHEN st.attempts_position = mv.first THEN st.attempts + 1 ELSE 1 END
    FROM picked k JOIN moved mv ON k.position <= mv.last
   ORDER BY k.position;
  IF NOT FOUND AND NOT fresh THEN
    -- A round whose rest is gone (deleted by hand): it is done.
    UPDATE {{schema}}.subscription_partitions p
       SET version = p.version + 1, base_position = p.target_position,
           base_snapshot = p.target_snapshot, base_bound = p.target_bound, cluster = p.target_cluster,
           target_position = NULL, target_snapshot = NULL, target_bound = NULL,
           target_floor = NULL, target_cluster = NULL, legacy_transaction_id = NULL, legacy_position = NULL,
           progress = 0, single_until = NULL
     WHERE p.subscription = sub_name AND p.partition = part;
  END IF;
END $$;

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
  -- Without message ids there is nothing to conflict on, and a plain insert spares each row
  -- the speculative insertion of ON CONFLICT (a lock and one more WAL record per row).
  IF cardinality(array_remove(msg_ids, NULL)) = 0 THEN
    RETURN QUERY
      INSERT INTO {{schema}}.messages AS m (topic, type, data, key, headers)
      SELECT msg_topic, t.type, t.data, t.key, coalesce(t.headers, '{}')
        FROM unnest(msg_types, msg_data, msg_keys, msg_headers) WITH ORDINALITY AS t (type, data, key, headers, n)
       ORDER BY t.n
      RETURNING m.message_id, m.position, m.transaction_id;
  ELSE
    RETURN QUERY
      INSERT INTO {{schema}}.messages AS m (topic, type, data, key, message_id, headers)
      SELECT msg_topic, t.type, t.data, t.key, t.message_id, coalesce(t.headers, '{}')
        FROM unnest(msg_types, msg_data, msg_keys, msg_ids, msg_headers) WITH ORDINALITY
             AS t (type, data, key, message_id, headers, n)
       ORDER BY t.n
      ON CONFLICT (topic, message_id) WHERE message_id IS NOT NULL DO NOTHING
      RETURNING m.message_id, m.position, m.transaction_id;
  END IF;
  IF pg_try_advisory_xact_lock(hashtext('ordo_outbox.{{schema_name}}'), hashtext(msg_topic)) THEN
    PERFORM pg_notify('ordo_outbox.{{schema_name}}', msg_topic);
  END IF;
END $$;

-- Lag counts what receive() would read (see undelivered), up to `cap`.
CREATE OR REPLACE FUNCTION {{schema}}.behind(st {{schema}}.subscription_partitions, sub_topic text, parts integer,
                                             cap integer, OUT n bigint, OUT oldest timestamptz)
LANGUAGE sql STABLE
SET enable_bitmapscan = off SET enable_seqscan = off
AS $$
  SELECT least(count(*), cap), min(u.created_at)
    FROM {{schema}}.undelivered(st, sub_topic, parts, 9223372036854775807, NULL, NULL, cap) u
$$;
