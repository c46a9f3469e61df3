-- Numbers one row the way that works for any table, isolation and name: the statement built for
-- rel (numbering_update()) and run with EXECUTE, parsed and planned for each row. An
-- attachment's trigger function calls it when its own planned UPDATE does not apply
-- (create_number_trigger()).
--
-- At REPEATABLE READ or SERIALIZABLE a transaction cannot update a row its snapshot does not
-- show, so its commit fails whenever another transaction numbered the same counter since the
-- snapshot. Nothing lets the counter's update skip the snapshot and still roll back with the
-- transaction (a sequence or a second connection would not roll back: gaps), so it stays a
-- serialization failure (40001, which drivers and frameworks retry), with a message saying what
-- happened and what to do. The first row of each counter is numbered in a subtransaction that
-- catches the failure to name the counter. The last 64 counters numbered are noted in
-- ordo.counters_taken, so that their later rows skip the subtransaction; the note is bounded so
-- that each row's search of it stays short however many counters a commit numbers. A row of a
-- counter no longer in the note is numbered in a subtransaction again, which for a counter this
-- commit already holds cannot fail.
CREATE OR REPLACE FUNCTION {{schema}}.number_row(rel regclass, seq_name text, column_name text, scope_column text,
                                      text_column text, row_ctid tid, seq_scope text)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  numbering text := {{schema}}.numbering_update(rel::text, '$1', '$2', '$3', column_name, scope_column, text_column);
  counter text;
  taken text;
  numbered integer;
BEGIN
  IF {{schema}}.counters_to_lock() THEN
    PERFORM {{schema}}.lock_pending_counters();
  END IF;
  IF current_setting('transaction_isolation') = 'read committed' THEN
    EXECUTE numbering USING seq_name, {{schema}}.commit_instant(), row_ctid;
    RETURN;
  END IF;

  counter := seq_name || chr(31) || seq_scope;
  taken := coalesce(current_setting('ordo.counters_taken', true), '');
  IF strpos(chr(30) || taken || chr(30), chr(30) || counter || chr(30)) > 0 THEN
    EXECUTE numbering USING seq_name, {{schema}}.commit_instant(), row_ctid;
    RETURN;
  END IF;
  BEGIN
    EXECUTE numbering USING seq_name, {{schema}}.commit_instant(), row_ctid;
    GET DIAGNOSTICS numbered = ROW_COUNT;
  EXCEPTION WHEN serialization_failure THEN
    RAISE EXCEPTION USING ERRCODE = 'serialization_failure', SCHEMA = '{{schema_name}}', TABLE = 'counters',
      MESSAGE = format(
        'The sequence %L numbers %s at commit, and another transaction numbered the same counter (scope %L) after this %s transaction took its snapshot: PostgreSQL lets no transaction update a row its snapshot does not show. Retry the transaction, as for any serialization failure (SQLSTATE 40001), or write %s at READ COMMITTED, where numbering at commit never fails this way',
        seq_name, rel, seq_scope, upper(current_setting('transaction_isolation')), rel),
      DETAIL = SQLERRM,
      HINT = 'Numbering at commit is made for READ COMMITTED; a REPEATABLE READ or SERIALIZABLE transaction commits only when no other numbered its counter since its first statement.';
  END;
  IF numbered > 0 THEN
    taken := CASE WHEN taken = '' THEN counter ELSE taken || chr(30) || counter END;
    IF cardinality(string_to_array(taken, chr(30))) > 64 THEN
      taken := substr(taken, strpos(taken, chr(30)) + 1);
    END IF;
    PERFORM set_config('ordo.counters_taken', taken, true);
  END IF;
END $$;
