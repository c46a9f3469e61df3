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
