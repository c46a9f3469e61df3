-- An append answered as a set of rows: each message stored, with its message id, its position and
-- the transaction's id, in the order given; a message not stored because the topic already holds
-- its id is left out. Read off append_answer(), which does the work.
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
