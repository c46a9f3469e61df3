-- A key as a decision sees it (a throttle_key), from its definition and state rows (st null: a new
-- key): the key's own limits over the throttle's, its state, and whether this decision holds its
-- lock. A key of a throttle without permits has no concurrency limit, whatever its own limits say
-- (set_key_limits refuses one, but may race with a redefinition). plpgsql, not SQL: it is called
-- from plpgsql statements and loops, one call per key, where a SQL function is not inlined and is
-- parsed and planned again each time its calling expression starts; as plpgsql the row costs a
-- cached expression.
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
    CASE WHEN d.lease_ms IS NOT NULL THEN coalesce(st.own_concurrency, d.concurrency) END,
    d.lease_ms,
    {{schema}}.throttle_cost(coalesce(st.own_rate_limit, d.rate_limit), coalesce(st.own_per_ms, d.per_ms)),
    d.paused_until,
    st.incarnation, st.last_start, st.every_from, st.tat, st.last_end, st.last_outcome, st.last_error,
    st.last_permit, coalesce(st.starts, 0), st.decided_at, st.swept_until, st.paused_until,
    st.own_every_ms, st.own_rate_limit, st.own_per_ms, st.own_concurrency,
    locked, false, NULL, coalesce(st.live_units, 0), NULL, NULL, NULL, false)::{{schema}}.throttle_key;
END $$;
