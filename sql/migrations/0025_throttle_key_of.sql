-- ordo 0025: a key's decision state built by plpgsql, not SQL.
--
-- throttle_key_of (0010) was a SQL function. PostgreSQL inlines a SQL function only into a
-- query that calls it on its own terms; called from plpgsql's statements (throttle_lock's and
-- throttle_fold's loops, one call per key) it was not inlined, and a SQL function not inlined
-- is parsed and planned again each time its calling expression starts: 81 microseconds a key,
-- measured with track_functions on 1,000 keys, where a decision that had to wait for its keys
-- (two composite acquires sharing a global limit) built every key that way. As plpgsql the
-- same row costs a cached expression. 32 callers for 5 s on this machine's PostgreSQL 15,
-- acquireAll of a global limit and one of 1,000 tenant keys, then complete: 4,100 to 5,000-5,600
-- a second; acquire and complete on 1,000 keys: +10%.
--
-- Custom SQLSTATEs: none new.

CREATE OR REPLACE FUNCTION {{schema}}.throttle_key_of(d {{schema}}.throttles, st {{schema}}.throttle_state,
                                                      key_name text, locked boolean)
RETURNS {{schema}}.throttle_key
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  RETURN ROW(
    d.name, key_name, d.incarnation,
    coalesce(st.own_every_ms, d.every_ms),
    coalesce(st.own_rate_limit, d.rate_limit),
    coalesce(st.own_per_ms, d.per_ms),
    coalesce(st.own_concurrency, d.concurrency),
    d.lease_ms,
    {{schema}}.throttle_cost(coalesce(st.own_rate_limit, d.rate_limit), coalesce(st.own_per_ms, d.per_ms)),
    d.paused_until,
    st.incarnation, st.last_start, st.every_from, st.tat, st.last_end, st.last_outcome, st.last_error,
    st.last_permit, coalesce(st.starts, 0), st.decided_at, st.swept_until, st.paused_until,
    st.own_every_ms, st.own_rate_limit, st.own_per_ms, st.own_concurrency,
    locked, false, NULL, 0, NULL, NULL, NULL, false)::{{schema}}.throttle_key;
END $$;
