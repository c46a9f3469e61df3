-- A node reserves the next `how_many` ranges of a batched sequence (take_blocks()) and records
-- that it owns each (sequence_batches); returns them in increasing order, each with the
-- definition's epoch, increment and TIMEOUT. Near the maximum it returns the ranges left. All of
-- one call share their `reserved_at` (the transaction's start), which tells a node's reservations
-- apart. `wait_ms` bounds how long it may wait for a lock (another session redefining the
-- sequence in an open transaction); the caller's lock_timeout is restored afterwards.
CREATE OR REPLACE FUNCTION {{schema}}.reserve(seq_name text, node uuid, wait_ms integer, how_many integer DEFAULT 1)
RETURNS TABLE (first bigint, last bigint, epoch integer, increment bigint, timeout_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  s {{schema}}.sequences;
  firsts bigint[];
  step bigint;
  caller_lock_timeout text := current_setting('lock_timeout');
BEGIN
  IF wait_ms IS NOT NULL THEN
    PERFORM set_config('lock_timeout', greatest(wait_ms, 1) || 'ms', true);
  END IF;
  firsts := {{schema}}.take_blocks(seq_name, how_many);
  -- Read the definition after nextval(): a redefinition that committed first is seen with the
  -- step nextval() used; one that commits later waits for this transaction (it alters the
  -- storage, whose lock nextval() holds).
  SELECT * INTO s FROM {{schema}}.sequences AS d WHERE d.name = seq_name;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX001', MESSAGE = format('The sequence %L does not exist', seq_name);
  END IF;
  SELECT seqincrement INTO step FROM pg_sequence WHERE seqrelid = s.storage::regclass;
  PERFORM set_config('lock_timeout', caller_lock_timeout, true);
  RETURN QUERY
    WITH recorded AS (
      INSERT INTO {{schema}}.sequence_batches AS b (sequence, node_id, first, last, epoch)
      SELECT seq_name, node, f, least(f + step - s.increment, s.max_value), s.epoch FROM unnest(firsts) AS f
      RETURNING b.first, b.last
    )
    SELECT r.first, r.last, s.epoch, s.increment, s.timeout_ms FROM recorded AS r ORDER BY r.first;
END $$;
