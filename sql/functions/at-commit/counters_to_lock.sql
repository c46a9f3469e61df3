-- Whether this commit must lock its counters' stripes before it numbers a row: it numbers two
-- counters or more (note_pending_row()), and has not locked them yet. One expression, inlined
-- into the plpgsql that asks, so that a commit of one counter (the usual) calls nothing.
CREATE OR REPLACE FUNCTION {{schema}}.counters_to_lock() RETURNS boolean
LANGUAGE sql STABLE AS $$
  SELECT current_setting('ordo.pending_many', true) = 'yes'
     AND current_setting('ordo.counters_locked', true) IS DISTINCT FROM 'yes'
$$;
