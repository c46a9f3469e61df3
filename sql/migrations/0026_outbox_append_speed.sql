-- ordo 0026: an append's topic compared byte by byte, and its locks taken without the executor.
--
-- Measured with callgrind on PostgreSQL 15 (BEGIN, one append_many, COMMIT, in a database whose
-- collation is C.UTF-8), against a plain INSERT into an outbox table with a BIGSERIAL position:
--
-- * The topic leads two of the table's indexes (and message_id a third), and its comparisons
--   went through the database's collation: strcoll() on every step down each index, for a
--   column whose values are identifiers ([A-Za-z0-9_.:-]) that ordo only ever compares for
--   equality and groups. Now COLLATE "C" (memcmp): 8,000 instructions less for a one-message
--   append, 9,000 less for each further message. A database with a richer collation
--   (en_US.UTF-8) paid more. Equality is unchanged (it is byte equality under any
--   deterministic collation); subscriptions.topic, compared with it, goes along, so that the
--   two sides of a comparison keep one collation and both indexes serve it.
--   The indexes on these columns are rebuilt by the migration, under the table's lock: on a
--   large outbox table this takes a while (prune() first keeps it short).
-- * PERFORM runs its expression as a query through SPI and the executor; an assignment is
--   evaluated as a simple expression. The transaction id and the two advisory locks (and the
--   NOTIFY) are now assignments: 14,500 instructions less. The transaction id is read once and
--   written into every row, not evaluated by the column's default per row.
--
-- One message: 454,000 → about 425,000 instructions (the plain INSERT: 388,000). Ten: 1,377,000
-- → about 1,260,000 (plain: 1,117,000).
--
-- Custom SQLSTATEs: none new.

ALTER TABLE {{schema}}.messages
  ALTER COLUMN topic TYPE text COLLATE "C",
  ALTER COLUMN message_id TYPE text COLLATE "C";
ALTER TABLE {{schema}}.subscriptions ALTER COLUMN topic TYPE text COLLATE "C";

CREATE OR REPLACE FUNCTION {{schema}}.append_many(
  msg_topic text, msg_types text[], msg_data jsonb[], msg_keys text[], msg_ids text[], msg_headers jsonb[])
RETURNS TABLE (message_id text, "position" bigint, transaction_id xid8)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  xid xid8;
  done boolean;
BEGIN
  IF cardinality(msg_types) IS DISTINCT FROM cardinality(msg_data)
     OR cardinality(msg_types) IS DISTINCT FROM cardinality(msg_keys)
     OR cardinality(msg_types) IS DISTINCT FROM cardinality(msg_ids)
     OR cardinality(msg_types) IS DISTINCT FROM cardinality(msg_headers) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = 'append_many needs arrays of one length';
  END IF;
  IF length(msg_topic) > 200 OR msg_topic !~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]*$' THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'topic must be 1 to 200 letters, digits or _ . : - (not starting with . : -), not %L', msg_topic);
  END IF;
  -- The transaction id first, then the lock that says this transaction appends to the topic
  -- (0008): whoever sees the lock finds the id in progress.
  xid := pg_current_xact_id();
  done := pg_advisory_xact_lock_shared(hashtext('ordo_outbox_open.{{schema_name}}'), hashtext(msg_topic)) IS NULL;
  -- Without message ids there is nothing to conflict on, and a plain insert spares each row
  -- the speculative insertion of ON CONFLICT (a lock and one more WAL record per row).
  IF cardinality(array_remove(msg_ids, NULL)) = 0 THEN
    RETURN QUERY
      INSERT INTO {{schema}}.messages AS m (topic, transaction_id, type, data, key, headers)
      SELECT msg_topic, xid, t.type, t.data, t.key, coalesce(t.headers, '{}')
        FROM unnest(msg_types, msg_data, msg_keys, msg_headers) WITH ORDINALITY AS t (type, data, key, headers, n)
       WHERE {{schema}}.message_problem(t.type, t.key, NULL, t.headers) IS NULL
          OR {{schema}}.invalid_message(t.n, t.type, t.key, NULL, t.headers)
       ORDER BY t.n
      RETURNING m.message_id, m.position, m.transaction_id;
  ELSE
    RETURN QUERY
      INSERT INTO {{schema}}.messages AS m (topic, transaction_id, type, data, key, message_id, headers)
      SELECT msg_topic, xid, t.type, t.data, t.key, t.message_id, coalesce(t.headers, '{}')
        FROM unnest(msg_types, msg_data, msg_keys, msg_ids, msg_headers) WITH ORDINALITY
             AS t (type, data, key, message_id, headers, n)
       WHERE {{schema}}.message_problem(t.type, t.key, t.message_id, t.headers) IS NULL
          OR {{schema}}.invalid_message(t.n, t.type, t.key, t.message_id, t.headers)
       ORDER BY t.n
      ON CONFLICT (topic, message_id) WHERE message_id IS NOT NULL DO NOTHING
      RETURNING m.message_id, m.position, m.transaction_id;
  END IF;
  IF pg_try_advisory_xact_lock(hashtext('ordo_outbox.{{schema_name}}'), hashtext(msg_topic)) THEN
    done := pg_notify('ordo_outbox.{{schema_name}}', msg_topic) IS NULL;
  END IF;
END $$;
