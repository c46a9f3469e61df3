-- A key's state with its own limits and pause, and how many wait in its line.
-- OX005 throttle_not_found.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_key_state(throttle_name text, throttle_key text)
RETURNS TABLE (name text, key text, last_start timestamptz, starts bigint, last_end timestamptz, last_outcome text,
               last_error text, last_permit uuid, observed_at timestamptz, own_every_ms bigint,
               own_rate_limit integer, own_per_ms bigint, own_concurrency integer, paused_until timestamptz,
               throttle_paused_until timestamptz, waiting bigint, permits json)
LANGUAGE plpgsql STABLE AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM {{schema}}.throttles AS d WHERE d.name = throttle_name) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX005', MESSAGE = format('The throttle %L does not exist', throttle_name);
  END IF;
  RETURN QUERY
  SELECT throttle_name, throttle_key, st.last_start, st.starts, st.last_end, st.last_outcome, st.last_error,
         st.last_permit, st.observed_at, o.own_every_ms, o.own_rate_limit, o.own_per_ms, o.own_concurrency,
         CASE WHEN o.paused_until > st.observed_at THEN o.paused_until END,
         CASE WHEN d.paused_until > st.observed_at THEN d.paused_until END,
         (SELECT count(*) FROM {{schema}}.throttle_waiter_items AS i
            JOIN {{schema}}.throttle_waiters AS w ON w.id = i.waiter
           WHERE i.name = throttle_name AND i.key = throttle_key AND w.permit_id IS NULL
             AND w.alive_until >= st.observed_at),
         (SELECT coalesce(json_agg(json_build_object('id', p.id, 'holder', p.holder, 'cost', p.cost,
                   'acquired_at', p.acquired_at, 'expires_at', p.expires_at) ORDER BY p.acquired_at, p.id), '[]')
            FROM {{schema}}.permits AS p
           WHERE p.name = throttle_name AND p.key = throttle_key AND p.incarnation = d.incarnation
             AND p.ended_at IS NULL AND p.expires_at > st.observed_at)
    FROM {{schema}}.throttle_status(throttle_name, throttle_key) AS st
    JOIN {{schema}}.throttles AS d ON d.name = throttle_name
    LEFT JOIN {{schema}}.throttle_state AS o
      ON o.name = throttle_name AND o.key = throttle_key AND o.incarnation = d.incarnation;
END $$;
