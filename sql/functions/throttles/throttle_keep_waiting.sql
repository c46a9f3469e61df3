-- A process's waiters are still there: renewed for alive_ms. Answers those served meanwhile.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_keep_waiting(waiters uuid[], alive_ms bigint)
RETURNS TABLE (waiter uuid, served boolean)
LANGUAGE sql VOLATILE AS $$
  UPDATE {{schema}}.throttle_waiters AS w SET alive_until = clock_timestamp() + alive_ms * interval '1 millisecond'
   WHERE w.id = ANY (waiters)
  RETURNING w.id, w.permit_id IS NOT NULL
$$;
