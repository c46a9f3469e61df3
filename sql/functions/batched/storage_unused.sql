-- Whether no value of a batched sequence's storage can have been handed out: it is where it
-- was created (or moved by a redefinition while unused), and it has never been called.
-- `seqstart` (START WITH) only changes with the position while unused; a redefinition of a
-- used sequence moves the position alone (RESTART WITH); nextval() sets is_called; give_back()
-- moves the position back, not called, only over values never handed out — so it is at
-- `seqstart` and not called only when every range ever reserved was given back whole.
-- Ownership rows of ranges are a second witness: none may exist.
CREATE OR REPLACE FUNCTION {{schema}}.storage_unused(seq_name text, storage text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  at_value bigint;
  called boolean;
  created_at bigint;
BEGIN
  EXECUTE format('SELECT last_value, is_called FROM %s', storage) INTO at_value, called;
  SELECT seqstart INTO created_at FROM pg_sequence WHERE seqrelid = storage::regclass;
  RETURN NOT called AND at_value = created_at
     AND NOT EXISTS (SELECT 1 FROM {{schema}}.sequence_batches AS b WHERE b.sequence = seq_name);
END $$;
