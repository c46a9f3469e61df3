-- Gives a lease up at once, and notifies the topic's channel, so that another consumer takes the
-- partition without waiting. False when the caller did not hold it.
CREATE OR REPLACE FUNCTION {{schema}}.release_partition(sub_name text, part integer, sub_owner text)
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
