-- A batch received at `at_version` failed, for the reason `failure`. A batch of several: its
-- messages are delivered one at a time next, up to its last, to find the one that fails ('split').
-- One message: its failures are counted; below `max_attempts` it is delivered again after
-- retry_ms[n] for its n-th failure (the last entry for later ones) ('retry'); then it is parked in
-- dead_letters and passed ('parked'), or, with `park` false, left where it is and still retried
-- ('exhausted'). Null when the caller no longer holds the partition at that version; the row is
-- locked as it is read, as in ack().
--
-- `strict`: refused once the lease has lapsed, even if nobody took it (receipts over HTTP).
-- `release`: the lease is given up.
CREATE OR REPLACE FUNCTION {{schema}}.nack(sub_name text, part integer, sub_owner text, at_version bigint,
                                failure text, max_attempts integer, park boolean, retry_ms bigint[],
                                release boolean DEFAULT false, strict boolean DEFAULT false,
                                OUT outcome text, OUT attempts integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  st {{schema}}.subscription_partitions;
  sub {{schema}}.subscriptions;
  m {{schema}}.messages;
BEGIN
  SELECT * INTO st FROM {{schema}}.subscription_partitions p
   WHERE p.subscription = sub_name AND p.partition = part AND p.owner = sub_owner
     AND p.version = at_version AND p.batch_last IS NOT NULL
     AND (NOT strict OR p.lease_until >= clock_timestamp())
  FOR UPDATE;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  IF st.batch_count > 1 THEN
    outcome := 'split';
    attempts := st.attempts;
    UPDATE {{schema}}.subscription_partitions p
       SET version = p.version + 1, single_until = st.batch_last, last_error = failure,
           batch_last = NULL, batch_count = NULL, batch_done = NULL, not_before = NULL,
           owner = CASE WHEN release THEN NULL ELSE p.owner END,
           lease_until = CASE WHEN release THEN NULL ELSE p.lease_until END
     WHERE p.subscription = sub_name AND p.partition = part;
    RETURN;
  END IF;
  attempts := CASE WHEN st.attempts_position = st.batch_last THEN st.attempts + 1 ELSE 1 END;
  IF attempts >= max_attempts AND park THEN
    SELECT * INTO sub FROM {{schema}}.subscriptions s WHERE s.name = sub_name;
    SELECT * INTO m FROM {{schema}}.messages x WHERE x.topic = sub.topic AND x.position = st.batch_last;
    INSERT INTO {{schema}}.dead_letters (subscription, position, transaction_id, topic, type, key,
        message_id, data, headers, created_at, attempts, error)
    VALUES (sub_name, m.position, m.transaction_id, m.topic, m.type, m.key, m.message_id, m.data,
        m.headers, m.created_at, attempts, failure)
    ON CONFLICT (subscription, position) DO NOTHING;
    PERFORM {{schema}}.ack(sub_name, part, sub_owner, at_version, 0, false, release);
    -- Parked is not delivered; the lease stays as it was.
    UPDATE {{schema}}.subscription_partitions p
       SET delivered = p.delivered - 1, lease_until = CASE WHEN release THEN NULL ELSE st.lease_until END,
           attempts = 0, last_error = failure
     WHERE p.subscription = sub_name AND p.partition = part;
    outcome := 'parked';
    RETURN;
  END IF;
  outcome := CASE WHEN attempts >= max_attempts THEN 'exhausted' ELSE 'retry' END;
  UPDATE {{schema}}.subscription_partitions p
     SET version = p.version + 1, attempts = nack.attempts, attempts_position = st.batch_last,
         last_error = failure, batch_last = NULL, batch_count = NULL, batch_done = NULL,
         not_before = clock_timestamp()
                      + greatest(coalesce(retry_ms[least(nack.attempts, cardinality(retry_ms))], 0), 0)
                        * interval '1 millisecond',
         owner = CASE WHEN release THEN NULL ELSE p.owner END,
         lease_until = CASE WHEN release THEN NULL ELSE p.lease_until END
   WHERE p.subscription = sub_name AND p.partition = part;
END $$;
