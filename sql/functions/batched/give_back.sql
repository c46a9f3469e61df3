-- A closing node gives back the values from `from_value` to the end of its range starting at
-- `last_first`, reserved in `range_epoch`: a compare-and-set on the storage, under the
-- definition's row lock (no range can be reserved meanwhile). It happens only if
--   * the definition is still the one of that epoch,
--   * the storage stands just after that range (no range was reserved since), and
--   * `from_value` lies in a range the node owns, and the node's ranges from that one to the one
--     at `last_first` follow one another with no value between them (the ownership rows of
--     ranges reserved more than a week ago are gone: then nothing).
-- Otherwise the values stay a gap, as when a node stops without closing. Returns whether
-- they were given back. `wait_ms` bounds the wait for the row lock.
CREATE OR REPLACE FUNCTION {{schema}}.give_back(seq_name text, node uuid, range_epoch integer, last_first bigint,
                                     from_value bigint, wait_ms integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  s {{schema}}.sequences;
  step bigint;
  from_first bigint;
  caller_lock_timeout text := current_setting('lock_timeout');
BEGIN
  PERFORM set_config('lock_timeout', greatest(coalesce(wait_ms, 1000), 1) || 'ms', true);
  BEGIN
    SELECT * INTO s FROM {{schema}}.sequences AS d WHERE d.name = seq_name FOR UPDATE;
  EXCEPTION WHEN lock_not_available THEN
    PERFORM set_config('lock_timeout', caller_lock_timeout, true);
    RETURN false;
  END;
  PERFORM set_config('lock_timeout', caller_lock_timeout, true);
  IF NOT FOUND OR s.kind <> 'batched' OR s.epoch <> range_epoch THEN
    RETURN false;
  END IF;
  SELECT seqincrement INTO step FROM pg_sequence WHERE seqrelid = s.storage::regclass;
  IF {{schema}}.storage_position(s.storage) <> last_first + step THEN
    RETURN false;
  END IF;
  SELECT b.first INTO from_first FROM {{schema}}.sequence_batches AS b
   WHERE b.sequence = seq_name AND b.node_id = node AND b.epoch = range_epoch
     AND from_value BETWEEN b.first AND b.last AND b.first <= last_first;
  -- The node's ranges from there to the one at `last_first` must follow one another with no
  -- value between them: then no other node's values lie in what goes back.
  IF NOT FOUND OR NOT EXISTS (
       SELECT 1 FROM {{schema}}.sequence_batches AS b
        WHERE b.sequence = seq_name AND b.node_id = node AND b.epoch = range_epoch AND b.first = last_first)
     OR EXISTS (
       SELECT 1 FROM (
         SELECT b.first, lag(b.last) OVER (ORDER BY b.first) AS previous_last
           FROM {{schema}}.sequence_batches AS b
          WHERE b.sequence = seq_name AND b.node_id = node AND b.epoch = range_epoch
            AND b.first BETWEEN from_first AND last_first) AS run
        WHERE run.previous_last + s.increment <> run.first) THEN
    RETURN false;
  END IF;
  PERFORM setval(s.storage, from_value, false);
  DELETE FROM {{schema}}.sequence_batches AS b
   WHERE b.sequence = seq_name AND b.node_id = node AND b.first >= from_value;
  UPDATE {{schema}}.sequence_batches AS b SET last = from_value - s.increment
   WHERE b.sequence = seq_name AND b.node_id = node AND b.first < from_value AND b.last >= from_value;
  RETURN true;
END $$;
