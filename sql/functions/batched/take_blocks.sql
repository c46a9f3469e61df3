-- The first values of the next `how_many` blocks of a batched sequence, in increasing order: as
-- many nextval() of its storage, a PostgreSQL sequence stepping by batch × increment, which never
-- blocks behind a caller's transaction and is never rolled back, so values are unique across
-- nodes and SQL callers alike. The blocks need not be adjacent: other nodes take theirs meanwhile.
-- Lock order, everywhere: the definition row, then the storage. The row is held FOR KEY SHARE
-- (reservations never block each other), so a redefinition or removal, which locks the row
-- FOR UPDATE first, waits for every nextval() in flight before it reads where the storage
-- stands, and the two can never deadlock. Near the maximum, the blocks left are returned, fewer
-- than asked. Raises sequence_not_found (OX001), OX004 for a gapless sequence,
-- sequence_exhausted (OX002) when not one block is left, and 40001 when the storage was dropped
-- under it (the caller retries).
CREATE OR REPLACE FUNCTION {{schema}}.take_blocks(seq_name text, how_many integer) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  s {{schema}}.sequences;
  firsts bigint[] := '{}';
BEGIN
  SELECT * INTO s FROM {{schema}}.sequences AS d WHERE d.name = seq_name FOR KEY SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX001', MESSAGE = format('The sequence %L does not exist', seq_name);
  END IF;
  IF s.kind <> 'batched' THEN
    RAISE EXCEPTION USING ERRCODE = 'OX004', MESSAGE = format('The sequence %L is %s, not batched', seq_name, s.kind);
  END IF;
  -- A block of its own, so that the exception at the maximum releases nothing taken above (the
  -- row lock); the values already taken stay in `firsts`, as variables are not rolled back.
  BEGIN
    FOR i IN 1..greatest(how_many, 1) LOOP
      firsts := firsts || nextval(s.storage);
    END LOOP;
  EXCEPTION WHEN sequence_generator_limit_exceeded THEN
    IF cardinality(firsts) = 0 THEN
      RAISE EXCEPTION USING ERRCODE = 'OX002',
        MESSAGE = format('The sequence %L is exhausted: it cannot go past its maximum value %s', seq_name, s.max_value);
    END IF;
  END;
  RETURN firsts;
EXCEPTION
  WHEN undefined_table THEN
    -- The storage was dropped by a concurrent REMOVE or redefinition: the caller retries.
    RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = format('The sequence %L changed while a range was reserved', seq_name);
END $$;
