-- The first value of the next block of a batched sequence: one nextval() of its storage, a
-- PostgreSQL sequence stepping by batch × increment, which never blocks behind a caller's
-- transaction and is never rolled back, so values are unique across nodes and SQL callers alike.
-- Lock order, everywhere: the definition row, then the storage. The row is held FOR KEY SHARE
-- (reservations never block each other), so a redefinition or removal, which locks the row
-- FOR UPDATE first, waits for every nextval() in flight before it reads where the storage
-- stands, and the two can never deadlock. Raises sequence_not_found (OX001), OX004 for a gapless
-- sequence, sequence_exhausted (OX002) at the maximum, and 40001 when the storage was dropped
-- under it (the caller retries).
CREATE OR REPLACE FUNCTION {{schema}}.take_block(seq_name text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  s {{schema}}.sequences;
BEGIN
  SELECT * INTO s FROM {{schema}}.sequences AS d WHERE d.name = seq_name FOR KEY SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX001', MESSAGE = format('The sequence %L does not exist', seq_name);
  END IF;
  IF s.kind <> 'batched' THEN
    RAISE EXCEPTION USING ERRCODE = 'OX004', MESSAGE = format('The sequence %L is %s, not batched', seq_name, s.kind);
  END IF;
  RETURN nextval(s.storage);
EXCEPTION
  WHEN sequence_generator_limit_exceeded THEN
    RAISE EXCEPTION USING ERRCODE = 'OX002',
      MESSAGE = format('The sequence %L is exhausted: it cannot go past its maximum value %s', seq_name, s.max_value);
  WHEN undefined_table THEN
    -- The storage was dropped by a concurrent REMOVE or redefinition: the caller retries.
    RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = format('The sequence %L changed while a range was reserved', seq_name);
END $$;
