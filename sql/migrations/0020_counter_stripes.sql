-- ordo 0020: numbering at commit locks one of 256 stripes per counter, not one advisory lock per
-- counter, and keeps that note in a string of bounded length.
--
-- 0013 noted every counter a transaction would number at commit in a setting (sequence and scope
-- joined, appended per new counter, searched by each row's trigger) and, at commit, took one
-- advisory lock per counter, in key order, before numbering. Both failed on bulk writes that
-- touch many scopes: the note grew with the scopes, so each row searched a longer string (1,000
-- scopes in one INSERT took 0.15 s, 3,000 took 1 s, 5,000 took 3.2 s); and 20,000 scopes asked
-- PostgreSQL's shared lock table for 20,000 locks, which fails the commit with "out of shared
-- memory" (the table holds max_locks_per_transaction × max_connections, 6,400 by default).
--
-- Now a counter (sequence, scope) belongs to one of 256 stripes by a hash. The note holds the
-- stripes (at most 256 short numbers), the first counter, and whether another followed; a
-- commit of two counters or more locks its stripes in order: the same deadlock freedom with at
-- most 256 locks. Counters of different stripes commit side by side; two of one stripe commit
-- one after the other, which for unrelated counters happens 1 time in 256, and only for as long
-- as the commits take. A commit of one counter takes no advisory lock, as in 0013: it waits for
-- nothing but that counter's row, so it closes no cycle of waits, and its critical section
-- stays the row's (a lock taken before the first row is numbered made two committers of one
-- counter 25–30% slower here, the whole trigger then running under it).

-- The stripe of a counter, 0 to 255. The period is not part of it: a commit numbers every
-- counter in the period of one instant.
CREATE FUNCTION {{schema}}.counter_stripe(seq_name text, seq_scope text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT (hashtextextended(seq_name || chr(31) || seq_scope, 0) & 255)::integer
$$;

-- As in 0013, noting the counter's stripe in ordo.pending_stripes, read as ',3,17,' (every
-- stripe between commas, so that a search for ',17,' finds exactly that one); the first counter
-- in ordo.pending_first; ordo.pending_many = 'yes' once another counter is noted.
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
  RETURN NEW;
END $$;

-- As in 0013: the WHEN clause skips rows whose stripe is noted already, unless a second
-- counter is still to be found (a row of another counter of the first one's stripe).
CREATE OR REPLACE FUNCTION {{schema}}.create_note_trigger(rel regclass, seq_name text, column_name text, scope_column text)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  scope text := CASE WHEN scope_column IS NULL THEN '''''' ELSE format('coalesce(NEW.%I::text, '''')', scope_column) END;
BEGIN
  EXECUTE format(
    'CREATE TRIGGER %I BEFORE INSERT OR UPDATE ON %s FOR EACH ROW WHEN (NEW.%I IS NULL AND (strpos(coalesce(current_setting(''ordo.pending_stripes'', true), ''''), '','' || {{schema}}.counter_stripe(%L, %s) || '','') = 0 OR (coalesce(current_setting(''ordo.pending_many'', true), '''') = '''' AND coalesce(current_setting(''ordo.pending_first'', true), '''') <> %L || chr(31) || %s))) EXECUTE FUNCTION {{schema}}.note_pending_row(%L, %L, %L)',
    {{schema}}.attachment_trigger('zz_ordo_note_', column_name), rel, column_name, seq_name, scope,
    seq_name, scope, seq_name, column_name, coalesce(scope_column, ''));
END $$;

-- Before the first row is numbered at commit: with two counters or more, the stripes noted,
-- locked in order. A transaction that was writing while this migration ran noted its counters
-- the 0013 way; they count too.
CREATE OR REPLACE FUNCTION {{schema}}.lock_pending_counters() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  first text := coalesce(current_setting('ordo.pending_first', true), '');
  legacy text[] := string_to_array(nullif(current_setting('ordo.pending_counters', true), ''), chr(30));
BEGIN
  IF coalesce(current_setting('ordo.pending_many', true), '') = 'yes'
     OR (SELECT count(DISTINCT k) FROM unnest(legacy || nullif(first, '')) AS k) > 1 THEN
    PERFORM pg_advisory_xact_lock(hashtext('{{schema_name}}.counters'), s.stripe)
      FROM (SELECT x::integer AS stripe
              FROM unnest(string_to_array(trim(BOTH ',' FROM coalesce(current_setting('ordo.pending_stripes', true), '')), ',')) AS x
             WHERE x <> ''
            UNION
            SELECT {{schema}}.counter_stripe(split_part(k, chr(31), 1), split_part(k, chr(31), 2))
              FROM unnest(legacy) AS k) AS s
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
