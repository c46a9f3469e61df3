-- A node reserves the next range of a batched sequence (take_block()) and records that it owns
-- it (sequence_batches); returns the range with the definition's epoch, increment and TIMEOUT.
-- `wait_ms` bounds how long it may wait for a lock (another session redefining the sequence in
-- an open transaction); the caller's lock_timeout is restored afterwards.
CREATE OR REPLACE FUNCTION {{schema}}.reserve(seq_name text, node uuid, wait_ms integer)
RETURNS TABLE (first bigint, last bigint, epoch integer, increment bigint, timeout_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  s {{schema}}.sequences;
  v bigint;
  step bigint;
  caller_lock_timeout text := current_setting('lock_timeout');
BEGIN
  IF wait_ms IS NOT NULL THEN
    PERFORM set_config('lock_timeout', greatest(wait_ms, 1) || 'ms', true);
  END IF;
  v := {{schema}}.take_block(seq_name);
  -- Read the definition after nextval(): a redefinition that committed first is seen with the
  -- step nextval() used; one that commits later waits for this transaction (it alters the
  -- storage, whose lock nextval() holds).
  SELECT * INTO s FROM {{schema}}.sequences AS d WHERE d.name = seq_name;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX001', MESSAGE = format('The sequence %L does not exist', seq_name);
  END IF;
  SELECT seqincrement INTO step FROM pg_sequence WHERE seqrelid = s.storage::regclass;
  INSERT INTO {{schema}}.sequence_batches (sequence, node_id, first, last, epoch)
  VALUES (seq_name, node, v, least(v + step - s.increment, s.max_value), s.epoch);
  PERFORM set_config('lock_timeout', caller_lock_timeout, true);
  RETURN QUERY SELECT v, least(v + step - s.increment, s.max_value), s.epoch, s.increment, s.timeout_ms;
END $$;
