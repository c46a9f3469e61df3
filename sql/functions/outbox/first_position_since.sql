-- The first position appended at or after `at` on the subscription's topic (for a seek to a time);
-- when there is none, the next position to be handed out.
CREATE OR REPLACE FUNCTION {{schema}}.first_position_since(sub_name text, at timestamptz)
RETURNS bigint
LANGUAGE sql STABLE AS $$
  SELECT coalesce(min(m.position), {{schema}}.last_position() + 1)
    FROM {{schema}}.messages m JOIN {{schema}}.subscriptions s ON s.topic = m.topic
   WHERE s.name = sub_name AND m.created_at >= at
$$;
