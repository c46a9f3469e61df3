-- A consumer in this library leaves the subscription: the others share its partitions out when they
-- next join (join_subscription).
CREATE OR REPLACE FUNCTION {{schema}}.leave_subscription(sub_name text, sub_member text)
RETURNS void
LANGUAGE sql VOLATILE AS $$
  DELETE FROM {{schema}}.subscription_members WHERE subscription = sub_name AND member = sub_member
$$;
