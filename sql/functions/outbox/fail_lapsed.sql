-- A partition just leased to `sub_owner`, at `at_version`, as it was before (`was`): when the lease
-- it had lapsed before its batch was acknowledged (its consumer died or hung, or its
-- visibilityTimeout ran out), that batch failed, as a nack says: several messages come one at a
-- time next, a single one is retried, then parked after `max_attempts` (with `park` false, left
-- 'exhausted'). Null outcome when there was no such batch. lease_partition and receive_any both
-- take a partition through it: one rule for consumers of this library and over HTTP, so a message
-- whose handler kills its process is counted and parked too.
CREATE OR REPLACE FUNCTION {{schema}}.fail_lapsed(was {{schema}}.subscription_partitions, sub_owner text, at_version bigint,
                                       max_attempts integer, park boolean,
                                       OUT outcome text, OUT attempts integer)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF was.batch_last IS NULL OR was.owner IS NULL OR was.lease_until >= clock_timestamp() THEN
    RETURN;
  END IF;
  SELECT n.outcome, n.attempts INTO outcome, attempts
    FROM {{schema}}.nack(was.subscription, was.partition, sub_owner, at_version,
      'the lease lapsed before the batch was acknowledged (its consumer died or hung, or its visibilityTimeout ran out)',
      max_attempts, park, '{0}', false, false) n;
END $$;
