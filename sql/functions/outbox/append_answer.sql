-- Appends messages to a topic in the caller's transaction, and wakes the topic's consumers when it
-- commits. Answers with one bigint[]: the transaction's id, then the position of each message
-- given, in the order given, null for a message not stored because the topic already holds its id
-- (stored before, or earlier in this call). One array rather than a set of rows, which would be
-- kept in a tuplestore and read back through a function scan the caller's statement must plan and
-- start; the transaction's id rides in it because reading it beside the call costs more (an xid8
-- fits a bigint until 2^63 transactions).
--
-- In this order: the transaction's id is taken, then the topic's shared advisory lock
-- ordo_outbox_open, held until the transaction ends (see the body); the messages are inserted;
-- last, one open transaction per topic notifies: the one that gets the topic's advisory lock
-- ordo_outbox with a try; the others skip it. PostgreSQL serializes the commits of all transactions
-- that sent a NOTIFY (one lock, held through the commit's WAL flush), so notifying on every append
-- would serialize the appends. A consumer woken by that commit reads everything committed by then,
-- and its polling covers the rest: wake-ups only save latency, they never decide what is read.
--
-- The locks and the NOTIFY are assignments, not PERFORM: PERFORM runs its expression as a query
-- through SPI and the executor, an assignment is evaluated as a simple expression. The
-- transaction's id is read once and written into every row, not computed per row by the column's
-- default.
--
-- Each message is checked in the INSERT itself (message_problem(), inlined; a message that breaks a
-- rule calls invalid_message(), which raises, and nothing is written), not by CHECK constraints on
-- messages: PostgreSQL builds a table's CHECK expressions anew for every statement that writes to
-- it.
--
-- OX003 invalid_argument: arrays of different lengths, a topic that is not 1 to 200 of
-- [A-Za-z0-9_.:-] (not starting with . : -), or a message that breaks a rule (see message_problem).
CREATE OR REPLACE FUNCTION {{schema}}.append_answer(
  msg_topic text, msg_types text[], msg_data jsonb[], msg_keys text[], msg_ids text[], msg_headers jsonb[])
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  xid xid8;
  done boolean;
  positions bigint[];
BEGIN
  IF cardinality(msg_types) IS DISTINCT FROM cardinality(msg_data)
     OR cardinality(msg_types) IS DISTINCT FROM cardinality(msg_keys)
     OR cardinality(msg_types) IS DISTINCT FROM cardinality(msg_ids)
     OR cardinality(msg_types) IS DISTINCT FROM cardinality(msg_headers) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = 'An append needs its arrays (types, data, keys, message ids, headers) of one length';
  END IF;
  IF length(msg_topic) > 200 OR msg_topic !~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]*$' THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'topic must be 1 to 200 letters, digits or _ . : - (not starting with . : -), not %L', msg_topic);
  END IF;
  -- The transaction id first, then the lock that says this transaction appends to the topic:
  -- whoever sees the lock finds the id in progress. Every message then gets its position after
  -- its transaction has an id, which a round's bound relies on (see start_base).
  xid := pg_current_xact_id();
  done := pg_advisory_xact_lock_shared(hashtext('ordo_outbox_open.{{schema_name}}'), hashtext(msg_topic)) IS NULL;
  -- Rows are inserted in the order given, so positions rise in that order. Without message ids
  -- every message is stored, and a plain insert spares each row the speculative insertion of
  -- ON CONFLICT (a lock and one more WAL record per row).
  IF cardinality(array_remove(msg_ids, NULL)) = 0 THEN
    WITH stored AS (
      INSERT INTO {{schema}}.messages AS m (topic, transaction_id, type, data, key, headers)
      SELECT msg_topic, xid, t.type, t.data, t.key, coalesce(t.headers, '{}')
        FROM unnest(msg_types, msg_data, msg_keys, msg_headers) WITH ORDINALITY AS t (type, data, key, headers, n)
       WHERE {{schema}}.message_problem(t.type, t.key, NULL, t.headers) IS NULL
          OR {{schema}}.invalid_message(t.n, t.type, t.key, NULL, t.headers)
       ORDER BY t.n
      RETURNING m.position
    )
    SELECT array_agg(s.position ORDER BY s.position) INTO positions FROM stored AS s;
  ELSE
    -- A message id is stored once: the first message given with it gets the row, if this
    -- call stored it. The k-th message without an id gets the k-th row stored without one.
    WITH stored AS (
      INSERT INTO {{schema}}.messages AS m (topic, transaction_id, type, data, key, message_id, headers)
      SELECT msg_topic, xid, t.type, t.data, t.key, t.message_id, coalesce(t.headers, '{}')
        FROM unnest(msg_types, msg_data, msg_keys, msg_ids, msg_headers) WITH ORDINALITY
             AS t (type, data, key, message_id, headers, n)
       WHERE {{schema}}.message_problem(t.type, t.key, t.message_id, t.headers) IS NULL
          OR {{schema}}.invalid_message(t.n, t.type, t.key, t.message_id, t.headers)
       ORDER BY t.n
      ON CONFLICT (topic, message_id) WHERE message_id IS NOT NULL DO NOTHING
      RETURNING m.message_id, m.position
    )
    -- (An id is 1 to 200 characters: '' stands for none.)
    SELECT array_agg(s.position ORDER BY g.n) INTO positions
      FROM (SELECT coalesce(t.id, '') AS id, t.n, row_number() OVER (PARTITION BY t.id ORDER BY t.n) AS k
              FROM unnest(msg_ids) WITH ORDINALITY AS t (id, n)) AS g
      LEFT JOIN (SELECT coalesce(st.message_id, '') AS id, st.position,
                        row_number() OVER (PARTITION BY st.message_id ORDER BY st.position) AS k
                   FROM stored AS st) AS s
        ON s.id = g.id AND s.k = g.k;
  END IF;
  IF pg_try_advisory_xact_lock(hashtext('ordo_outbox.{{schema_name}}'), hashtext(msg_topic)) THEN
    done := pg_notify('ordo_outbox.{{schema_name}}', msg_topic) IS NULL;
  END IF;
  RETURN xid::text::bigint || coalesce(positions, '{}');
END $$;
