-- ordo 0032: an append answers with one array, not with a set of rows.
--
-- append_many() returned its rows as a set: RETURN QUERY kept them in a tuplestore, and the
-- statement around it (SELECT … FROM append_many(…)) scanned the function through another,
-- with a function scan to plan and start. append_answer() does what append_many() did and
-- answers with one bigint[]: the transaction's id, then the position of each message given, in
-- the order given, null for a message not stored because its id was stored before (in this
-- call or earlier). The transaction's id rides in the array because reading it beside the call
-- (`SELECT append_answer(…), pg_current_xact_id()`) cost 20,000 to 29,000 instructions more; an
-- xid8 fits a bigint until 2^63 transactions.
--
-- callgrind (bench/instructions.ts on PostgreSQL 15, one backend, each statement its own
-- transaction), the statement the library sends against the outbox bench's plain INSERT:
--
--                       one message          ten messages
--   append_many()       707,000 (1.12x)    1,165,000 (1.19x)
--   append_answer()     665,000 (1.05x)    1,070,000 (1.09x)
--   plain INSERT        633,000              981,000
--
-- Of what is left, the checks of each message are about 25,000 and the sort that keeps the
-- messages in the order given about 9,000; the lock and NOTIFY the rest.
-- append_many() and append() keep their answers, now read off append_answer().
--
-- Custom SQLSTATEs: none new.

CREATE FUNCTION {{schema}}.append_answer(
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
  -- The transaction id first, then the lock that says this transaction appends to the topic
  -- (0008): whoever sees the lock finds the id in progress.
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

-- As before, read off append_answer(): the messages stored, each with its position and the
-- transaction's id, in the order given.
CREATE OR REPLACE FUNCTION {{schema}}.append_many(
  msg_topic text, msg_types text[], msg_data jsonb[], msg_keys text[], msg_ids text[], msg_headers jsonb[])
RETURNS TABLE (message_id text, "position" bigint, transaction_id xid8)
LANGUAGE sql VOLATILE AS $$
  SELECT a.message_id, a.position, r.answer[1]::text::xid8
    FROM (SELECT {{schema}}.append_answer(msg_topic, msg_types, msg_data, msg_keys, msg_ids, msg_headers) AS answer) AS r
    CROSS JOIN LATERAL unnest(msg_ids, r.answer[2:]) WITH ORDINALITY AS a (message_id, position, n)
   WHERE a.position IS NOT NULL
   ORDER BY a.n
$$;

-- As in 0003: the position, or null for a message whose id was stored before.
CREATE OR REPLACE FUNCTION {{schema}}.append(
  msg_topic text, msg_type text, msg_data jsonb, msg_key text DEFAULT NULL,
  msg_id text DEFAULT NULL, msg_headers jsonb DEFAULT '{}')
RETURNS bigint
LANGUAGE sql VOLATILE AS $$
  SELECT ({{schema}}.append_answer(
    msg_topic, ARRAY[msg_type], ARRAY[msg_data], ARRAY[msg_key], ARRAY[msg_id], ARRAY[msg_headers]))[2]
$$;
