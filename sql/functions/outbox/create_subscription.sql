-- Creates the subscription if it is new, with `parts` partitions, all starting from one base
-- (start_base). `start_from`: 'beginning' (the whole topic) or 'now' (what commits from now on,
-- including messages of transactions still open). A subscription that exists with the same topic
-- and partitions is returned as it is.
-- OX003 invalid_argument: another `start_from`, or partitions outside 1 to 256.
-- OX011 subscription_conflict: the name reads another topic, or has another number of partitions
-- (per-key order would not survive a change).
CREATE OR REPLACE FUNCTION {{schema}}.create_subscription(sub_name text, sub_topic text, start_from text, parts integer DEFAULT 1)
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
