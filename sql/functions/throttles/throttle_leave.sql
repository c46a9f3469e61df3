-- A waiter leaves the line (it gave up): its permit, if it was served meanwhile, is returned
-- so that the caller may use it (or end it).
CREATE OR REPLACE FUNCTION {{schema}}.throttle_leave(waiter uuid)
RETURNS TABLE (permit_id uuid, holder text, acquired_at timestamptz, expires_at timestamptz)
LANGUAGE sql VOLATILE AS $$
  DELETE FROM {{schema}}.throttle_waiters AS w WHERE w.id = waiter
  RETURNING w.permit_id, w.permit_holder, w.acquired_at, w.expires_at
$$;
