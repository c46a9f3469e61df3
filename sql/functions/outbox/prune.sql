-- Deletes messages older than `older_than` that every partition of every subscription of their
-- topic has passed (by its base: a round in hand keeps its messages). Returns how many it deleted.
CREATE OR REPLACE FUNCTION {{schema}}.prune(older_than interval, only_topic text DEFAULT NULL)
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
