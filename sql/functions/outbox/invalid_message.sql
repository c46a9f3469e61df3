-- Raises OX003 invalid_argument naming the n-th message of an append (1-based) and what breaks the
-- rules in it (message_problem). It stands in append_answer's INSERT as `message_problem(…) IS NULL
-- OR invalid_message(…)`, hence its boolean type: it is called only for a message that breaks a
-- rule, and never returns.
CREATE OR REPLACE FUNCTION {{schema}}.invalid_message(n bigint, msg_type text, msg_key text, msg_id text, msg_headers jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('message %s: %s', n,
    {{schema}}.message_problem(msg_type, msg_key, msg_id, msg_headers));
END $$;
