-- The key of a counter's advisory lock (queue_on_counter()), under the class
-- hashtext('<schema>.counter'): a hash of sequence, scope and period, the period written out as
-- no setting changes it ('-infinity' for a sequence that never resets). Two counters whose keys
-- collide share a queue, nothing more.
CREATE OR REPLACE FUNCTION {{schema}}.counter_lock(seq_name text, seq_scope text, seq_period date) RETURNS integer
LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT hashtext(seq_name || chr(31) || seq_scope || chr(31) || coalesce(to_char(seq_period, 'YYYY-MM-DD'), '-infinity'))
$$;
