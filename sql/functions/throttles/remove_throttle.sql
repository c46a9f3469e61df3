-- Removes a throttle with every key's state and every permit; its waiters leave its lines, and
-- their next call finds it gone (the NOTIFY wakes them). Returns whether the throttle existed. A
-- decision that read the definition before the removal committed may still leave a row behind; it
-- belongs to the removed incarnation and is never counted (and is cleared by the next decision on
-- its key).
CREATE OR REPLACE FUNCTION {{schema}}.remove_throttle(throttle_name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  removed boolean;
BEGIN
  DELETE FROM {{schema}}.throttles AS d WHERE d.name = throttle_name;
  removed := FOUND;
  DELETE FROM {{schema}}.throttle_state AS s WHERE s.name = throttle_name;
  DELETE FROM {{schema}}.permits AS p WHERE p.name = throttle_name;
  DELETE FROM {{schema}}.throttle_waiters AS w
   WHERE w.id IN (SELECT i.waiter FROM {{schema}}.throttle_waiter_items AS i WHERE i.name = throttle_name);
  PERFORM pg_notify('ordo_throttles.{{schema_name}}', 'freed:' || throttle_name);
  RETURN removed;
END $$;
