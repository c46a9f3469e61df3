-- What lag reports of a partition: the messages receive() would still deliver (undelivered()
-- without a target: what this statement sees committed), counted up to `cap`, and the oldest
-- creation time among them. The planner settings keep every read an index scan in position order
-- that stops at `cap`: when the statistics say few rows follow (a caught-up consumer, or a burst
-- since the last ANALYZE), the planner would rather take a bitmap scan and a sort, which read the
-- whole backlog.
CREATE OR REPLACE FUNCTION {{schema}}.behind(st {{schema}}.subscription_partitions, sub_topic text, parts integer,
                                             cap integer, OUT n bigint, OUT oldest timestamptz)
LANGUAGE sql STABLE
SET enable_bitmapscan = off SET enable_seqscan = off
AS $$
  SELECT least(count(*), cap), min(u.created_at)
    FROM {{schema}}.undelivered(st, sub_topic, parts, 9223372036854775807, NULL, NULL, cap) u
$$;
