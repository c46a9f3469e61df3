-- How far each partition of a subscription is behind (messages_behind counts at most 10,000 per
-- partition: a partition further behind shows 10,000), and what holds its topic back: the oldest
-- open transaction that appended to the topic (its messages wait for it; nothing else does), named
-- by pid or prepared gid. No rows when the subscription was removed meanwhile.
-- OX010 subscription_not_found.
CREATE OR REPLACE FUNCTION {{schema}}.subscription_lag(sub_name text)
RETURNS TABLE (
  name text, topic text, partitions integer, "partition" integer, owner text,
  lease_until timestamptz, "position" bigint, attempts integer, last_error text, delivered bigint,
  redelivered bigint, dead_lettered bigint,
  checkpointed_at timestamptz, messages_behind bigint, oldest_created_at timestamptz,
  waiting bigint, blocker_pid integer, blocker_xid_age integer, blocker_xact_start timestamptz,
  blocker_state text, blocker_application_name text, blocker_prepared_gid text, now timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  sub {{schema}}.subscriptions;
  w bigint;
  b_pid integer; b_age integer; b_start timestamptz; b_state text; b_app text; b_gid text;
BEGIN
  SELECT * INTO sub FROM {{schema}}.subscriptions s WHERE s.name = sub_name;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX010', MESSAGE = format('The subscription %L does not exist', sub_name);
  END IF;
  SELECT count(*) INTO w FROM {{schema}}.appender_locks(sub.topic);
  IF w > 0 THEN
    SELECT a.pid, coalesce(age(a.backend_xid), age(px.transaction)), coalesce(a.xact_start, px.prepared),
           a.state, a.application_name, px.gid
      INTO b_pid, b_age, b_start, b_state, b_app, b_gid
      FROM {{schema}}.appender_locks(sub.topic) l
      LEFT JOIN pg_stat_activity a ON a.pid = l.pid
      -- A prepared transaction has no backend: its own transactionid lock shares the dummy
      -- virtual transaction of its other locks, and names its xid.
      LEFT JOIN pg_locks t ON l.pid IS NULL AND t.pid IS NULL AND t.locktype = 'transactionid'
                          AND t.virtualtransaction = l.virtualtransaction
      LEFT JOIN pg_prepared_xacts px ON px.transaction = t.transactionid
     ORDER BY coalesce(a.xact_start, px.prepared) NULLS LAST
     LIMIT 1;
  END IF;
  RETURN QUERY
    SELECT sub.name, sub.topic, sub.partitions, st.partition,
           CASE WHEN st.lease_until > clock_timestamp() THEN st.owner END,
           CASE WHEN st.lease_until > clock_timestamp() THEN st.lease_until END,
           greatest(st.base_position, st.progress), st.attempts, st.last_error, st.delivered,
           st.redelivered, (SELECT count(*) FROM {{schema}}.dead_letters d WHERE d.subscription = sub_name),
           st.checkpointed_at, b.n, b.oldest, w,
           b_pid, b_age, b_start, b_state, b_app, b_gid, clock_timestamp()
      FROM {{schema}}.subscription_partitions st
      CROSS JOIN LATERAL {{schema}}.behind(st, sub.topic, sub.partitions, 10000) b
     WHERE st.subscription = sub_name
     ORDER BY st.partition;
END $$;
