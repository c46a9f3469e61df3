-- One message, for triggers and other languages: its position, or null when the topic already holds
-- its message id. Read off append_answer().
CREATE OR REPLACE FUNCTION {{schema}}.append(
  msg_topic text, msg_type text, msg_data jsonb, msg_key text DEFAULT NULL,
  msg_id text DEFAULT NULL, msg_headers jsonb DEFAULT '{}')
RETURNS bigint
LANGUAGE sql VOLATILE AS $$
  SELECT ({{schema}}.append_answer(
    msg_topic, ARRAY[msg_type], ARRAY[msg_data], ARRAY[msg_key], ARRAY[msg_id], ARRAY[msg_headers]))[2]
$$;
