-- Holds a throttle (key null) or one of its keys until `until` (null: no longer held): every
-- request is refused with reason 'paused' meanwhile. Returns true. A key's pause is written into
-- its state row (created if new) under a FOR KEY SHARE lock of the throttle's row, so the throttle
-- cannot be removed before that row is written with its incarnation. Waiters on the throttle are
-- woken (throttle_freed): a pause lifted or shortened may let them go.
-- OX005 throttle_not_found. OX003 invalid_argument: a key over 200 characters.
CREATE OR REPLACE FUNCTION {{schema}}.pause_throttle(throttle_name text, throttle_key text, until timestamptz)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  d {{schema}}.throttles;
BEGIN
  IF throttle_key IS NULL THEN
    UPDATE {{schema}}.throttles AS t SET paused_until = until WHERE t.name = throttle_name;
    IF NOT FOUND THEN
      RAISE EXCEPTION USING ERRCODE = 'OX005', MESSAGE = format('The throttle %L does not exist', throttle_name);
    END IF;
    PERFORM {{schema}}.throttle_freed(ARRAY[throttle_name]);
    RETURN true;
  END IF;
  SELECT * INTO d FROM {{schema}}.throttles AS t WHERE t.name = throttle_name FOR KEY SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX005', MESSAGE = format('The throttle %L does not exist', throttle_name);
  END IF;
  IF length(throttle_key) > 200 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = 'A key is a text of at most 200 characters';
  END IF;
  INSERT INTO {{schema}}.throttle_state AS st (name, key, incarnation, paused_until)
  VALUES (throttle_name, throttle_key, d.incarnation, until)
  ON CONFLICT (name, key) DO UPDATE SET paused_until = EXCLUDED.paused_until;
  PERFORM {{schema}}.throttle_freed(ARRAY[throttle_name]);
  RETURN true;
END $$;
