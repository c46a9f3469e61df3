-- The messages a partition has not delivered, each kind in position order and at most `cap`
-- of it: above its base position (and its progress in the round); at or below it, those of
-- transactions its base saw running, by its xip and by the short range from its xmax to its
-- bound (two index scans on the primary key), above the first position of the base's own
-- cluster (what lies below was delivered whole). receive() gives its round's target: at most
-- `upto`, committed in `seen` (no test below `seen_floor`, committed before the target's
-- cluster began); lag gives none, and counts what its statement sees committed. A SQL function
-- without settings, so that the planner inlines it into the statement that reads it.
CREATE OR REPLACE FUNCTION {{schema}}.undelivered(st {{schema}}.subscription_partitions, sub_topic text, parts integer,
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
