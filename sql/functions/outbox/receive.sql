-- The next batch of a partition whose lease `sub_owner` holds: the first `max_count` messages of
-- the round in position order (one at a time while a failed batch is searched, up to single_until).
-- The batch is recorded against the partition's version, which is returned with each message: ack()
-- moves past exactly this batch. Nothing to deliver: no rows, and nothing written (but a round
-- whose rest is gone is closed).
--
-- A partition without a round in hand starts one: its target is the current cluster, the last
-- position handed out, then a snapshot, read in that order before this transaction has an id; the
-- id it takes in the write is the target's bound (see start_base; a transaction that already had
-- one gives no bound).
--
-- The partition is read without a lock, and both writes apply only if it is still the caller's and
-- at the version read (every change of its round or batch moves the version; a renewal of the
-- caller's own lease does not). A takeover or a seek that commits in between wins, and the caller
-- gets nothing and looks again: two consumers never hold one partition's messages at once. A lock
-- taken by the first read would give the transaction its id before the target is read, and make
-- every receive write, the empty looks of an idle consumer too.
--
-- One statement reads the candidates once, whole (undelivered(), inlined), picks the batch and
-- moves the partition (a data-modifying CTE), so the batch returned and the version recorded cannot
-- differ. The planner settings keep the reads index scans in position order that stop at the limit
-- (see behind).
--
-- OX003 invalid_argument: max_count outside 1 to 10000. OX010 subscription_not_found.
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
  -- The batch is the first limit_to picked: its last position ends what is returned (an array
  -- of the positions, not a window over the rows, which costs more).
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
       AND p.owner = sub_owner AND p.version = st.version
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
     WHERE p.subscription = sub_name AND p.partition = part
       AND p.owner = sub_owner AND p.version = st.version;
  END IF;
END $$;
