-- nextval() for either kind. A gapless sequence takes one value (take()). A batched one hands out
-- the first value of a fresh block (the rest of the block is never used, as with PostgreSQL's
-- per-session CACHE): unique, never blocking, never rolled back; the library is for throughput.
-- A batched sequence has no scopes: any other than '' is invalid_argument (OX003).
-- The sequence's kind lock is taken shared before the kind is read, as in take(): a call that
-- waited for a change of kind serves the new kind, rather than failing in take() (OX004).
CREATE OR REPLACE FUNCTION {{schema}}.nextval(seq_name text, seq_scope text DEFAULT '', at timestamptz DEFAULT now())
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF pg_advisory_xact_lock_shared(hashtext('{{schema_name}}.sequence_kind'), hashtext(seq_name)) IS NULL THEN
    NULL; -- a null name: no lock, and no sequence (take() says so)
  END IF;
  IF EXISTS (SELECT 1 FROM {{schema}}.sequences AS d WHERE d.name = seq_name AND d.kind = 'batched') THEN
    IF seq_scope IS DISTINCT FROM '' THEN
      RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('The sequence %L is batched: it has no scopes', seq_name);
    END IF;
    RETURN ({{schema}}.take_blocks(seq_name, 1))[1];
  END IF;
  RETURN (SELECT t.value FROM {{schema}}.take(seq_name, seq_scope, at, 1) AS t);
END $$;
