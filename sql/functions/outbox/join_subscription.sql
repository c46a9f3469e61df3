-- A consumer in this library announces itself (alive for `lease_ms`) and learns the live consumers
-- of the subscription, oldest first: each takes the partitions whose number modulo their count is
-- its rank, so a newcomer takes some over and the partitions of one that left are shared out.
-- Members not seen within their lease are forgotten first. OX010 subscription_not_found.
CREATE OR REPLACE FUNCTION {{schema}}.join_subscription(sub_name text, sub_member text, lease_ms bigint)
RETURNS TABLE (member text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
  DELETE FROM {{schema}}.subscription_members
   WHERE subscription = sub_name AND seen_until < clock_timestamp();
  INSERT INTO {{schema}}.subscription_members (subscription, member, seen_until)
  VALUES (sub_name, sub_member, clock_timestamp() + lease_ms * interval '1 millisecond')
  ON CONFLICT (subscription, member) DO UPDATE SET seen_until = excluded.seen_until;
  RETURN QUERY SELECT m.member FROM {{schema}}.subscription_members m
   WHERE m.subscription = sub_name ORDER BY m.joined_at, m.member;
EXCEPTION WHEN foreign_key_violation THEN
  RAISE EXCEPTION USING ERRCODE = 'OX010', MESSAGE = format('The subscription %L does not exist', sub_name);
END $$;
