-- Ownership rows older than `keep` are deleted: a node gone for that long loses all of them,
-- a live node keeps those of its recent reservations. (They are a record of who reserved
-- what; uniqueness never depends on them.)
CREATE OR REPLACE FUNCTION {{schema}}.collect_batches(keep interval) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
  WITH gone AS (
    DELETE FROM {{schema}}.sequence_batches AS b WHERE b.reserved_at < now() - keep RETURNING 1
  )
  SELECT count(*) FROM gone
$$;
