-- The keys of a throttle with a state, the most recently active first. OX005 throttle_not_found.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_keys(throttle_name text, max_rows integer)
RETURNS SETOF text
LANGUAGE plpgsql STABLE AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM {{schema}}.throttles AS d WHERE d.name = throttle_name) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX005', MESSAGE = format('The throttle %L does not exist', throttle_name);
  END IF;
  RETURN QUERY
    SELECT st.key FROM {{schema}}.throttle_state AS st
      JOIN {{schema}}.throttles AS d ON d.name = st.name AND d.incarnation = st.incarnation
     WHERE st.name = throttle_name
     ORDER BY greatest(st.decided_at, st.last_start, st.last_end) DESC NULLS LAST, st.key
     LIMIT max_rows;
END $$;
