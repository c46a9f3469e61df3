-- One decision: (throttle, key) with a cost (default 1), a request of one item of acquire_all.
-- holder NULL: application_name:pid.
CREATE OR REPLACE FUNCTION {{schema}}.try_acquire(throttle_name text, throttle_key text DEFAULT '', permit_holder text DEFAULT NULL,
                                       cost integer DEFAULT 1)
RETURNS TABLE (granted boolean, permit_id uuid, holder text, acquired_at timestamptz, expires_at timestamptz,
               retry_after_ms bigint, reason text)
LANGUAGE sql VOLATILE AS $$
  SELECT a.granted, a.permit_id, a.holder, a.acquired_at, a.expires_at, a.retry_after_ms, a.reason
    FROM {{schema}}.acquire_all(ARRAY[1], ARRAY[throttle_name], ARRAY[throttle_key], ARRAY[cost],
                                ARRAY[permit_holder]) AS a
$$;
