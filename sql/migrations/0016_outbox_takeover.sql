-- ordo 0016: a lease that lapsed with a batch in hand counts that batch as failed, for
-- consumers of this library as for those over HTTP.
--
-- receive_any (0012) counted a lapsed lease as a failed attempt, but lease_partition, by which
-- this library's consumers take a partition, did not: a message whose handler kills its
-- process (SIGKILL, out of memory) came to the next holder with its attempts unchanged, and
-- was never parked. Both now lease through fail_lapsed(), one rule: the batch is nacked, so
-- several messages come one at a time next, and a single one is retried, then parked after
-- `max_attempts` (or, with `park` false, left where it is: 'exhausted').
--
-- Custom SQLSTATEs: OX003 invalid_argument, OX010 subscription_not_found.

-- A partition just leased to `sub_owner`, at `at_version`, as it was before (`was`): when the
-- lease it had lapsed before its batch was acknowledged, that batch failed (see nack). Null
-- outcome when there was no such batch.
CREATE FUNCTION {{schema}}.fail_lapsed(was {{schema}}.subscription_partitions, sub_owner text, at_version bigint,
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

-- Takes or renews the lease of one partition: granted to its holder, or to anyone once it has
-- lapsed or was released. Returns the partition when the caller holds the lease, with what
-- became of the batch of a lapsed lease (fail_lapsed: nack's outcome and attempts, null when
-- there was none). `max_attempts` and `park` are the subscription's.
DROP FUNCTION {{schema}}.lease_partition(text, integer, text, bigint);
CREATE FUNCTION {{schema}}.lease_partition(sub_name text, part integer, sub_owner text, lease_ms bigint,
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

-- receive_any of 0012, its lapsed batches failed by fail_lapsed().
CREATE OR REPLACE FUNCTION {{schema}}.receive_any(sub_name text, sub_owner text, max_count integer, lease_ms bigint,
                                                  max_attempts integer DEFAULT 10)
RETURNS TABLE ("partition" integer, "position" bigint, transaction_id xid8, topic text, type text,
               key text, message_id text, data jsonb, headers jsonb, created_at timestamptz,
               version bigint, attempt integer)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  sub {{schema}}.subscriptions;
  seen {{schema}}.subscription_partitions;
  st {{schema}}.subscription_partitions;
  bound_ok boolean;
  to_position bigint;
  to_snapshot pg_snapshot;
  to_floor bigint;
  to_cluster bigint;
  at_version bigint;
BEGIN
  IF max_count IS NULL OR max_count NOT BETWEEN 1 AND 10000 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('max must be an integer from 1 to 10000, not %s', max_count);
  END IF;
  IF max_attempts IS NULL OR max_attempts < 1 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('max_attempts must be a positive integer, not %s', max_attempts);
  END IF;
  SELECT * INTO sub FROM {{schema}}.subscriptions s WHERE s.name = sub_name;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX010', MESSAGE = format('The subscription %L does not exist', sub_name);
  END IF;
  FOR seen IN
    SELECT sp.* FROM {{schema}}.subscription_partitions sp
     WHERE sp.subscription = sub_name
       AND (sp.owner IS NULL OR sp.lease_until < clock_timestamp())
       AND (sp.not_before IS NULL OR sp.not_before <= clock_timestamp())
     ORDER BY sp.checkpointed_at NULLS FIRST, sp.partition
  LOOP
    CONTINUE WHEN ({{schema}}.behind(seen, sub.topic, sub.partitions, 1)).n = 0;
    to_position := NULL;
    IF seen.target_position IS NULL THEN
      SELECT c.cluster, c.first_position INTO to_cluster, to_floor FROM {{schema}}.current_cluster() c;
      bound_ok := pg_current_xact_id_if_assigned() IS NULL;
      to_position := {{schema}}.last_position();
      to_snapshot := pg_current_snapshot();
    END IF;
    SELECT * INTO st FROM {{schema}}.subscription_partitions sp
     WHERE sp.subscription = sub_name AND sp.partition = seen.partition
       AND (sp.owner IS NULL OR sp.lease_until < clock_timestamp())
       AND (sp.not_before IS NULL OR sp.not_before <= clock_timestamp())
    FOR UPDATE SKIP LOCKED;
    CONTINUE WHEN NOT FOUND;
    -- The target read above, unless the partition changed since it was looked at (a newer base
    -- may lie past it): then receive() reads one itself.
    UPDATE {{schema}}.subscription_partitions sp
       SET owner = sub_owner, lease_until = clock_timestamp() + lease_ms * interval '1 millisecond',
           version = sp.version + 1,
           target_position = CASE WHEN u.upd THEN to_position ELSE sp.target_position END,
           target_snapshot = CASE WHEN u.upd THEN to_snapshot ELSE sp.target_snapshot END,
           target_bound = CASE WHEN NOT u.upd THEN sp.target_bound
                               WHEN bound_ok THEN pg_current_xact_id() END,
           target_floor = CASE WHEN u.upd THEN to_floor ELSE sp.target_floor END,
           target_cluster = CASE WHEN u.upd THEN to_cluster ELSE sp.target_cluster END
      FROM (SELECT to_position IS NOT NULL AND st.target_position IS NULL AND st.version = seen.version AS upd) u
     WHERE sp.subscription = sub_name AND sp.partition = st.partition
    RETURNING sp.version INTO at_version;
    PERFORM {{schema}}.fail_lapsed(st, sub_owner, at_version, max_attempts, true);
    RETURN QUERY SELECT st.partition, r.* FROM {{schema}}.receive(sub_name, st.partition, sub_owner, max_count, lease_ms) r;
    IF FOUND THEN
      RETURN;
    END IF;
    UPDATE {{schema}}.subscription_partitions sp SET owner = NULL, lease_until = NULL
     WHERE sp.subscription = sub_name AND sp.partition = st.partition AND sp.owner = sub_owner;
  END LOOP;
END $$;
