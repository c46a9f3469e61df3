-- ordo 0022: an append checks its messages in its own statement, not through the table's
-- CHECK constraints.
--
-- ordo.messages had four CHECK constraints (type 1 to 200 characters, key at most 200, message
-- id 1 to 200, headers an object). PostgreSQL builds a table's CHECK expressions anew for every
-- statement that writes to it (read back from the catalog text and planned), whatever the
-- statement's plan cache keeps: 113,000 of the 546,000 instructions of BEGIN, a one-message
-- append_many and COMMIT (callgrind, PostgreSQL 15), a fifth of the append. A plain INSERT into
-- an outbox table without them costs 384,000.
--
-- append_many() is the one way messages are written (the library and the HTTP server call it,
-- SQL callers are told to), so the rules move into its INSERT (message_problem()): a row that
-- breaks one calls invalid_message(), which names the message and what to change (OX003, as
-- append_many's other checks), and the statement writes nothing. The rules are evaluated in the
-- plan the function keeps: the one-message append now costs about 455,000 (the rules written
-- once, in message_problem(), cost 5,000 of it more than the same rules spelt out in the WHERE).
--
-- Custom SQLSTATEs: none new.

ALTER TABLE {{schema}}.messages
  DROP CONSTRAINT IF EXISTS messages_type_check,
  DROP CONSTRAINT IF EXISTS messages_key_check,
  DROP CONSTRAINT IF EXISTS messages_message_id_check,
  DROP CONSTRAINT IF EXISTS messages_headers_check;

-- What breaks append_many's rules in a message, or null when nothing does. A SQL function that
-- the planner inlines into the INSERT that reads it: the rules stand here once, and a row that
-- keeps them costs their comparisons only.
CREATE FUNCTION {{schema}}.message_problem(msg_type text, msg_key text, msg_id text, msg_headers jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE
    WHEN msg_type IS NULL OR length(msg_type) NOT BETWEEN 1 AND 200 THEN 'type must be 1 to 200 characters'
    WHEN length(msg_key) > 200 THEN 'key must be at most 200 characters'
    WHEN length(msg_id) NOT BETWEEN 1 AND 200 THEN 'message id must be 1 to 200 characters'
    WHEN jsonb_typeof(coalesce(msg_headers, '{}')) <> 'object'
      THEN 'headers must be a JSON object, not ' || jsonb_typeof(msg_headers)
  END
$$;

-- Raises OX003 naming the n-th message of an append (1-based) and what breaks the rules in it.
-- Called only for a message that breaks one.
CREATE FUNCTION {{schema}}.invalid_message(n bigint, msg_type text, msg_key text, msg_id text, msg_headers jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('message %s: %s', n,
    {{schema}}.message_problem(msg_type, msg_key, msg_id, msg_headers));
END $$;

-- As in 0015, with the rules of the dropped constraints in the INSERT.
CREATE OR REPLACE FUNCTION {{schema}}.append_many(
  msg_topic text, msg_types text[], msg_data jsonb[], msg_keys text[], msg_ids text[], msg_headers jsonb[])
RETURNS TABLE (message_id text, "position" bigint, transaction_id xid8)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
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
  PERFORM pg_current_xact_id();
  PERFORM pg_advisory_xact_lock_shared(hashtext('ordo_outbox_open.{{schema_name}}'), hashtext(msg_topic));
  -- Without message ids there is nothing to conflict on, and a plain insert spares each row
  -- the speculative insertion of ON CONFLICT (a lock and one more WAL record per row).
  IF cardinality(array_remove(msg_ids, NULL)) = 0 THEN
    RETURN QUERY
      INSERT INTO {{schema}}.messages AS m (topic, type, data, key, headers)
      SELECT msg_topic, t.type, t.data, t.key, coalesce(t.headers, '{}')
        FROM unnest(msg_types, msg_data, msg_keys, msg_headers) WITH ORDINALITY AS t (type, data, key, headers, n)
       WHERE {{schema}}.message_problem(t.type, t.key, NULL, t.headers) IS NULL
          OR {{schema}}.invalid_message(t.n, t.type, t.key, NULL, t.headers)
       ORDER BY t.n
      RETURNING m.message_id, m.position, m.transaction_id;
  ELSE
    RETURN QUERY
      INSERT INTO {{schema}}.messages AS m (topic, type, data, key, message_id, headers)
      SELECT msg_topic, t.type, t.data, t.key, t.message_id, coalesce(t.headers, '{}')
        FROM unnest(msg_types, msg_data, msg_keys, msg_ids, msg_headers) WITH ORDINALITY
             AS t (type, data, key, message_id, headers, n)
       WHERE {{schema}}.message_problem(t.type, t.key, t.message_id, t.headers) IS NULL
          OR {{schema}}.invalid_message(t.n, t.type, t.key, t.message_id, t.headers)
       ORDER BY t.n
      ON CONFLICT (topic, message_id) WHERE message_id IS NOT NULL DO NOTHING
      RETURNING m.message_id, m.position, m.transaction_id;
  END IF;
  IF pg_try_advisory_xact_lock(hashtext('ordo_outbox.{{schema_name}}'), hashtext(msg_topic)) THEN
    PERFORM pg_notify('ordo_outbox.{{schema_name}}', msg_topic);
  END IF;
END $$;
