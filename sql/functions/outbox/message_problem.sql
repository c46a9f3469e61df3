-- What breaks an append's rules in a message, or null when nothing does: a type of 1 to 200
-- characters, a key of at most 200, a message id of 1 to 200 (null: none), headers a JSON object. A
-- SQL function that the planner inlines into the INSERT that reads it (append_answer): the rules
-- stand here once, and a row that keeps them costs their comparisons only.
CREATE OR REPLACE FUNCTION {{schema}}.message_problem(msg_type text, msg_key text, msg_id text, msg_headers jsonb)
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
