-- ordo 0034: numbering at commit, a third cheaper: the note trigger's WHEN clause is one test,
-- and a commit of one counter runs no query before it is numbered.
--
-- PostgreSQL builds a trigger's WHEN clause again for every statement that fires it: it reads
-- the stored expression, inlines the SQL functions it names (parsing their bodies), folds
-- constants and compiles what is left. The note trigger's clause (0020: two searches of the
-- noted stripes and counters, three settings read, counter_stripe() inlined) cost about 470,000
-- instructions per statement, for a single-row INSERT twice the INSERT itself. And
-- lock_pending_counters() asked in an IF whether more than one counter was noted, with a
-- subquery: plpgsql runs such a condition as a query, planned and started each time (64,000).
-- callgrind, `npx tsx bench/instructions.ts attach` (one backend, each INSERT of one row its own
-- transaction): numbered at commit 1,629,000 instructions before, 1,096,000 after on PostgreSQL
-- 18; 1,586,000 and 960,000 on 15; the same INSERT into a table with no number 211,000 (195,000).
--
-- Now the clause only asks whether the row's counter is the one the trigger noted last
-- (ordo.pending_last), which costs about as much to build as a column test; a row of any other
-- counter runs note_pending_row(), which notes its stripe and whether it is a second counter as
-- before, and is idempotent. A run of rows of one counter (one tenant, a bulk load of tenants
-- in runs) still calls it once; rows alternating between counters call it every row, where the
-- former clause skipped those whose stripes were noted already (about 100,000 instructions a
-- row: 1,000 such rows cost a statement some 30 ms more).
--
-- Custom SQLSTATEs: none new.

-- As in 0020, and the counter noted last in ordo.pending_last.
CREATE OR REPLACE FUNCTION {{schema}}.note_pending_row() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  pending text := coalesce(current_setting('ordo.pending_stripes', true), '');
  first text := coalesce(current_setting('ordo.pending_first', true), '');
  scope text := '';
  counter text;
  stripe text;
BEGIN
  IF TG_ARGV[2] <> '' THEN
    EXECUTE format('SELECT coalesce(($1).%I::text, '''')', TG_ARGV[2]) INTO scope USING NEW;
  END IF;
  counter := TG_ARGV[0] || chr(31) || scope;
  IF first = '' THEN
    PERFORM set_config('ordo.pending_first', counter, true);
  ELSIF first <> counter THEN
    PERFORM set_config('ordo.pending_many', 'yes', true);
  END IF;
  stripe := {{schema}}.counter_stripe(TG_ARGV[0], scope)::text;
  IF strpos(pending, ',' || stripe || ',') = 0 THEN
    PERFORM set_config('ordo.pending_stripes', CASE WHEN pending = '' THEN ',' ELSE pending END || stripe || ',', true);
  END IF;
  PERFORM set_config('ordo.pending_last', counter, true);
  RETURN NEW;
END $$;

-- The row trigger noting an attachment's counters: skipped for a row of the counter noted last.
CREATE OR REPLACE FUNCTION {{schema}}.create_note_trigger(rel regclass, seq_name text, column_name text, scope_column text)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  EXECUTE format(
    'CREATE TRIGGER %I BEFORE INSERT OR UPDATE ON %s FOR EACH ROW WHEN (NEW.%I IS NULL AND current_setting(''ordo.pending_last'', true) IS DISTINCT FROM %s) EXECUTE FUNCTION {{schema}}.note_pending_row(%L, %L, %L)',
    {{schema}}.attachment_trigger('zz_ordo_note_', column_name), rel, column_name,
    CASE WHEN scope_column IS NULL THEN format('%L || chr(31)', seq_name)
         ELSE format('%L || chr(31) || coalesce(NEW.%I::text, '''')', seq_name, scope_column) END,
    seq_name, column_name, coalesce(scope_column, ''));
END $$;

-- As in 0020, but a commit of one counter (the usual) reads two settings and runs no query:
-- an IF whose condition holds a subquery runs as a query, planned and started every time. The
-- counters noted before 0020 (ordo.pending_counters, by a transaction in flight across that
-- migration) take the locking path whatever their number: one stripe locked for one counter
-- is harmless.
CREATE OR REPLACE FUNCTION {{schema}}.lock_pending_counters() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF current_setting('ordo.pending_many', true) = 'yes' OR current_setting('ordo.pending_counters', true) <> '' THEN
    PERFORM pg_advisory_xact_lock(hashtext('{{schema_name}}.counters'), s.stripe)
      FROM (SELECT x::integer AS stripe
              FROM unnest(string_to_array(trim(BOTH ',' FROM coalesce(current_setting('ordo.pending_stripes', true), '')), ',')) AS x
             WHERE x <> ''
            UNION
            SELECT {{schema}}.counter_stripe(split_part(k, chr(31), 1), split_part(k, chr(31), 2))
              FROM unnest(string_to_array(nullif(current_setting('ordo.pending_counters', true), ''), chr(30))) AS k) AS s
     ORDER BY s.stripe;
  END IF;
  PERFORM set_config('ordo.counters_locked', 'yes', true);
END $$;

-- Every attachment's row trigger, made again with the new WHEN clause.
DO $$
DECLARE
  a record;
BEGIN
  FOR a IN SELECT * FROM {{schema}}.attachments LOOP
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s',
                   {{schema}}.attachment_trigger('zz_ordo_note_', a.column_name), a.table_name);
    PERFORM {{schema}}.create_note_trigger(a.table_name, a.sequence, a.column_name, a.scope_column);
  END LOOP;
END $$;
