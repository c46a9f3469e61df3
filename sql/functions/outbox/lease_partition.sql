-- Takes or renews the lease of one partition for `sub_owner`: granted to its holder, or to anyone
-- once it has lapsed or was released. Returns the partition when the caller now holds the lease,
-- with what became of the batch of a lapsed lease (fail_lapsed: nack's outcome and attempts, null
-- when there was none); no row when another consumer holds it. `max_attempts` and `park` are the
-- subscription's.
-- OX003 invalid_argument: max_attempts below 1. OX010 subscription_not_found.
CREATE OR REPLACE FUNCTION {{schema}}.lease_partition(sub_name text, part integer, sub_owner text, lease_ms bigint,
                                           max_attempts integer DEFAULT 10, park boolean DEFAULT true)
RETURNS TABLE ("partition" integer, outcome text, attempts integer)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  was {{schema}}.subscription_partitions;
  taken record;
BEGIN
  IF max_attempts IS NULL OR max_attempts < 1 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('max_attempts must be a positive integer, not %s', max_attempts);
  END IF;
  -- A lease held by another is not locked (the row is filtered out first): a consumer waiting
  -- for it writes nothing and takes no transaction id.
  SELECT * INTO was FROM {{schema}}.subscription_partitions p
   WHERE p.subscription = sub_name AND p.partition = part
     AND (p.owner = sub_owner OR p.owner IS NULL OR p.lease_until < clock_timestamp())
  FOR UPDATE;
  IF NOT FOUND THEN
    IF NOT EXISTS (
         SELECT 1 FROM {{schema}}.subscription_partitions p WHERE p.subscription = sub_name AND p.partition = part) THEN
      RAISE EXCEPTION USING ERRCODE = 'OX010', MESSAGE = format('The subscription %L does not exist', sub_name);
    END IF;
    RETURN;
  END IF;
  UPDATE {{schema}}.subscription_partitions p
     SET owner = sub_owner, lease_until = clock_timestamp() + lease_ms * interval '1 millisecond'
   WHERE p.subscription = sub_name AND p.partition = part;
  taken := {{schema}}.fail_lapsed(was, sub_owner, was.version, max_attempts, park);
  RETURN QUERY SELECT part, taken.outcome, taken.attempts;
END $$;
