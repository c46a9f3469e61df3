-- fail(error, { retryAfter }) of a start without a permit: there is no permit for the next decision
-- to fold, so its keys are held until then at once, never shortening a longer pause (as a permit's
-- hold does not). Keys are created if new and written in (throttle, key) order, the order decisions
-- lock them in; a throttle removed meanwhile is skipped.
CREATE OR REPLACE FUNCTION {{schema}}.hold_keys(names text[], keys text[], hold_ms bigint) RETURNS void
LANGUAGE sql VOLATILE AS $$
  INSERT INTO {{schema}}.throttle_state AS st (name, key, incarnation, paused_until)
  SELECT d.name, u.k, d.incarnation, clock_timestamp() + hold_ms * interval '1 millisecond'
    FROM unnest(names, keys) AS u(n, k)
    JOIN {{schema}}.throttles AS d ON d.name = u.n
   ORDER BY d.name, u.k
  ON CONFLICT (name, key) DO UPDATE SET paused_until = greatest(st.paused_until, EXCLUDED.paused_until)
$$;
