-- The stripe of a counter, 0 to 255: a commit that numbers two counters or more locks their
-- stripes, in order, before it numbers a row (lock_pending_counters()). At most 256 locks, where
-- one per counter could fill PostgreSQL's shared lock table on a bulk write across many scopes;
-- two unrelated counters share a stripe 1 time in 256, and commits locking it then run one after
-- the other. The period is not part of it: a commit numbers every counter in the period of one
-- instant.
CREATE OR REPLACE FUNCTION {{schema}}.counter_stripe(seq_name text, seq_scope text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT (hashtextextended(seq_name || chr(31) || seq_scope, 0) & 255)::integer
$$;
