-- ordo 0028: numbering at commit at REPEATABLE READ or SERIALIZABLE stays linear in the rows.
--
-- At those levels the first row of each counter is numbered in a subtransaction that names the
-- counter when PostgreSQL refuses the update (0013); the counters a commit already numbered are
-- noted in a setting so that their later rows skip it. The note grew by one counter each time,
-- and every row searched all of it: one INSERT across 20,000 tenants at SERIALIZABLE committed
-- in 11.7 s where READ COMMITTED took 4.7 s (PostgreSQL 15 here), and the gap grows with the
-- square of the tenants. The note now keeps the last 64 counters numbered: a row of a counter
-- no longer in it is numbered in a subtransaction, which for a counter this commit already
-- holds cannot fail and numbers the same way. Bulk inserts of one tenant, or of tenants in
-- runs, keep skipping it.
--
-- Custom SQLSTATEs: none new.

CREATE OR REPLACE FUNCTION {{schema}}.number_at_commit() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  numbering text;
  scope text := '';
  counter text;
  taken text;
  numbered integer;
BEGIN
  IF coalesce(current_setting('ordo.counters_locked', true), '') = '' THEN
    PERFORM {{schema}}.lock_pending_counters();
  END IF;
  numbering := format(
    'UPDATE %s AS r SET (%s) = (SELECT %s FROM {{schema}}.take($1, %s, $2, 1) AS t) WHERE r.ctid = $3 AND r.%I IS NULL',
    TG_RELID::regclass,
    CASE WHEN TG_ARGV[3] = '' THEN quote_ident(TG_ARGV[1]) ELSE quote_ident(TG_ARGV[1]) || ', ' || quote_ident(TG_ARGV[3]) END,
    CASE WHEN TG_ARGV[3] = '' THEN 't.value' ELSE 't.value, t.text' END,
    CASE WHEN TG_ARGV[2] = '' THEN '''''' ELSE format('coalesce(r.%I::text, '''')', TG_ARGV[2]) END,
    TG_ARGV[1]);
  IF current_setting('transaction_isolation') = 'read committed' THEN
    EXECUTE numbering USING TG_ARGV[0], {{schema}}.commit_instant(), NEW.ctid;
    RETURN NULL;
  END IF;

  IF TG_ARGV[2] <> '' THEN
    EXECUTE format('SELECT coalesce(($1).%I::text, '''')', TG_ARGV[2]) INTO scope USING NEW;
  END IF;
  counter := TG_ARGV[0] || chr(31) || scope;
  taken := coalesce(current_setting('ordo.counters_taken', true), '');
  IF strpos(chr(30) || taken || chr(30), chr(30) || counter || chr(30)) > 0 THEN
    EXECUTE numbering USING TG_ARGV[0], {{schema}}.commit_instant(), NEW.ctid;
    RETURN NULL;
  END IF;
  BEGIN
    EXECUTE numbering USING TG_ARGV[0], {{schema}}.commit_instant(), NEW.ctid;
    GET DIAGNOSTICS numbered = ROW_COUNT;
  EXCEPTION WHEN serialization_failure THEN
    RAISE EXCEPTION USING ERRCODE = 'serialization_failure', SCHEMA = '{{schema_name}}', TABLE = 'counters',
      MESSAGE = format(
        'The sequence %L numbers %s at commit, and another transaction numbered the same counter (scope %L) after this %s transaction took its snapshot: PostgreSQL lets no transaction update a row its snapshot does not show. Retry the transaction, as for any serialization failure (SQLSTATE 40001), or write %s at READ COMMITTED, where numbering at commit never fails this way',
        TG_ARGV[0], TG_RELID::regclass, scope, upper(current_setting('transaction_isolation')), TG_RELID::regclass),
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
  RETURN NULL;
END $$;
