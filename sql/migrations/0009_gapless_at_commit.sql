-- ordo 0009: gapless numbers assigned at commit, who holds a counter, fiscal years.
--
-- 1. attach_sequence() puts a deferred constraint trigger on a table: each inserted row gets the
--    next gapless value when its transaction commits, so the counter's row lock is held for the
--    commit only, not for the whole business transaction. The triggers are the registry (the
--    view `attachments` reads them), so a dropped table takes its attachment with it.
-- 2. sequence_holders() names the transactions holding counters in the in-transaction mode.
-- 3. Fiscal years: reset 'year' from any month (year_start), with the tokens {FY} and {FYE}.
--    The period of an instant is decided by period_start() alone, for take(), take_many() and
--    the commit trigger alike.

ALTER TABLE {{schema}}.sequences
  ADD COLUMN year_start smallint NOT NULL DEFAULT 1 CHECK (year_start BETWEEN 1 AND 12);

-- The local start of the period containing local_at: a year may begin on the first of any month.
CREATE FUNCTION {{schema}}.period_start(reset text, year_start integer, local_at timestamp) RETURNS date
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE
    WHEN reset = 'never' THEN '-infinity'::date
    WHEN reset = 'year' AND year_start > 1 THEN
      (date_trunc('year', local_at - make_interval(months => year_start - 1)) + make_interval(months => year_start - 1))::date
    ELSE date_trunc(reset, local_at)::date
  END
$$;

-- {FY}: the year in which the fiscal year containing local_at starts; {FYE}: the year it ends.
-- With year_start 1 both are the calendar year.
CREATE OR REPLACE FUNCTION {{schema}}.token_width(piece text) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT AS $$
  SELECT CASE
    WHEN piece IN ('{YYYY}', '{IYYY}', '{FY}', '{FYE}') THEN 6
    WHEN piece IN ('{YY}', '{MM}', '{DD}', '{WW}') THEN 2
    WHEN piece = '{n}' THEN 20
    WHEN piece ~ '^\{n:([1-9]|1[0-9]|20)\}$' THEN 20
    WHEN piece = '{scope}' THEN 200
  END
$$;

CREATE OR REPLACE FUNCTION {{schema}}.check_format(fmt text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  bad text;
  longest integer;
BEGIN
  IF fmt IS NULL THEN
    RETURN true;
  END IF;
  IF length(fmt) NOT BETWEEN 1 AND 200 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = 'format must be a text of 1 to 200 characters';
  END IF;
  SELECT piece INTO bad FROM {{schema}}.format_pieces(fmt)
   WHERE piece ~ '[{}]' AND {{schema}}.token_width(piece) IS NULL ORDER BY ord LIMIT 1;
  IF bad IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'format has %s; braces only enclose the tokens {YYYY} {YY} {MM} {DD} {WW} {IYYY} {FY} {FYE} {scope} {n} {n:W} (W: a width from 1 to 20)',
      CASE WHEN length(bad) = 1 THEN format('a stray %L', bad) ELSE 'an unknown token ' || bad END);
  END IF;
  IF NOT EXISTS (SELECT 1 FROM {{schema}}.format_pieces(fmt) WHERE piece ~ '^\{n(:[0-9]+)?\}$') THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = 'format must contain {n} or {n:W}';
  END IF;
  longest := {{schema}}.format_max_length(fmt);
  IF longest > 1000 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'format may render up to %s characters; at most 1000 are allowed (each {scope} may take 200)', longest);
  END IF;
  RETURN true;
END $$;

CREATE FUNCTION {{schema}}.render(fmt text, v bigint, scope text, local_at timestamp, year_start integer)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN fmt IS NULL THEN v::text ELSE coalesce((
    SELECT string_agg(CASE
        WHEN piece = '{YYYY}' THEN to_char(local_at, 'YYYY')
        WHEN piece = '{YY}' THEN to_char(local_at, 'YY')
        WHEN piece = '{MM}' THEN to_char(local_at, 'MM')
        WHEN piece = '{DD}' THEN to_char(local_at, 'DD')
        WHEN piece = '{WW}' THEN to_char(local_at, 'IW')
        WHEN piece = '{IYYY}' THEN to_char(local_at, 'IYYY')
        WHEN piece = '{FY}' THEN to_char(local_at - make_interval(months => year_start - 1), 'YYYY')
        WHEN piece = '{FYE}' THEN
          to_char(local_at - make_interval(months => year_start - 1) + make_interval(years => (year_start > 1)::integer), 'YYYY')
        WHEN piece = '{scope}' THEN scope
        WHEN piece = '{n}' THEN v::text
        -- Zero-padded to W digits, never truncated; the sign goes in front.
        WHEN piece ~ '^\{n:([1-9]|1[0-9]|20)\}$' THEN
          CASE WHEN v < 0 THEN '-' ELSE '' END ||
          lpad(ltrim(v::text, '-'), greatest(length(ltrim(v::text, '-')), rtrim(substring(piece FROM 4), '}')::integer), '0')
        ELSE piece
      END, '' ORDER BY ord)
    FROM {{schema}}.format_pieces(fmt)), '') END
$$;

-- The 0005 form, for callers that know no fiscal year.
CREATE OR REPLACE FUNCTION {{schema}}.render(fmt text, v bigint, scope text, local_at timestamp) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT {{schema}}.render(fmt, v, scope, local_at, 1)
$$;

-- As in 0001, with period_start() and the fiscal year. The upsert is the only statement run
-- under the counter's lock before the caller's next statement, so nothing else follows it but
-- the answer (the text is rendered only when the sequence has a format).
CREATE OR REPLACE FUNCTION {{schema}}.take(seq_name text, seq_scope text, at timestamptz, how_many integer)
RETURNS TABLE (value bigint, text text, period text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  s {{schema}}.sequences;
  local_at timestamp;
  p date;
  step bigint;
  last_value bigint;
  prev bigint;
BEGIN
  IF seq_scope IS NULL OR at IS NULL OR how_many IS NULL OR how_many < 1 OR how_many > 1000000 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = 'scope and at must not be null, and the count must be from 1 to 1000000';
  END IF;
  SELECT * INTO s FROM {{schema}}.sequences AS d WHERE d.name = seq_name;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX001', MESSAGE = format('The sequence %L does not exist', seq_name);
  END IF;
  IF s.kind <> 'gapless' THEN
    RAISE EXCEPTION USING ERRCODE = 'OX004',
      MESSAGE = format('The sequence %L is %s, not gapless', seq_name, s.kind);
  END IF;
  local_at := at AT TIME ZONE s.time_zone;
  p := {{schema}}.period_start(s.reset, s.year_start, local_at);
  -- NULL when it would overflow: every comparison with it is then false and value_after() decides.
  step := CASE WHEN s.increment <= 9007199254740991 / how_many THEN s.increment * how_many END;

  INSERT INTO {{schema}}.counters AS c (sequence, scope, period, value, previous)
  VALUES (seq_name, seq_scope, p,
          CASE WHEN s.start <= s.max_value - (step - s.increment) THEN s.start + (step - s.increment)
               ELSE {{schema}}.value_after(s, NULL, how_many) END,
          NULL)
  ON CONFLICT (sequence, scope, period) DO UPDATE
    SET previous = c.value,
        value = CASE WHEN c.value <= s.max_value - step THEN c.value + step
                     ELSE {{schema}}.value_after(s, c.value, how_many) END,
        updated_at = now()
  RETURNING c.value, c.previous INTO last_value, prev;

  period := CASE WHEN s.reset = 'never' THEN NULL ELSE to_char(p, 'YYYY-MM-DD') END;
  IF how_many = 1 THEN
    value := last_value;
    text := CASE WHEN s.format IS NULL THEN last_value::text
                 ELSE {{schema}}.render(s.format, last_value, seq_scope, local_at, s.year_start) END;
    RETURN NEXT;
    RETURN;
  END IF;
  RETURN QUERY
    SELECT v, CASE WHEN s.format IS NULL THEN v::text
                   ELSE {{schema}}.render(s.format, v, seq_scope, local_at, s.year_start) END,
           period
    FROM (SELECT {{schema}}.value_after(s, prev, i) AS v FROM generate_series(1, how_many) AS i) AS issued;
END $$;

-- As in 0001, with period_start() and the fiscal year.
CREATE OR REPLACE FUNCTION {{schema}}.take_many(names text[], scopes text[], ats timestamptz[], counts integer[])
RETURNS TABLE (request integer, value bigint, text text, period text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  missing text;
  caller_lock_timeout text := current_setting('lock_timeout');
BEGIN
  IF cardinality(names) IS DISTINCT FROM cardinality(scopes) OR cardinality(names) IS DISTINCT FROM cardinality(ats)
     OR cardinality(names) IS DISTINCT FROM cardinality(counts)
     OR array_position(names, NULL) IS NOT NULL OR array_position(scopes, NULL) IS NOT NULL
     OR EXISTS (SELECT 1 FROM unnest(counts) AS n WHERE n IS NULL OR n < 1 OR n > 1000000) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = 'take_many needs arrays of equal length, with no null name or scope, and counts from 1 to 1000000';
  END IF;
  SELECT n INTO missing FROM unnest(names) AS n
    WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.sequences AS d WHERE d.name = n AND d.kind = 'gapless') LIMIT 1;
  IF FOUND THEN
    -- The caller serves each request on its own, which names the exact error.
    RAISE EXCEPTION USING ERRCODE = 'OX001', MESSAGE = format('The sequence %L does not exist or is not gapless', missing);
  END IF;
  PERFORM set_config('lock_timeout', '50ms', true);

  RETURN QUERY
  WITH input AS (
    SELECT u.i::integer AS request, u.name, u.scope, u.how_many::bigint AS how_many, d AS def,
           d.start, d.increment, d.max_value, d.reset, d.format, d.year_start,
           coalesce(u.at, now()) AT TIME ZONE d.time_zone AS local_at
    FROM unnest(names, scopes, ats, counts) WITH ORDINALITY AS u(name, scope, at, how_many, i)
    JOIN {{schema}}.sequences AS d ON d.name = u.name
  ), keyed AS (
    SELECT i.*, {{schema}}.period_start(i.reset, i.year_start, i.local_at) AS p
    FROM input AS i
  ), placed AS (
    -- How many values earlier requests on the same row take before this one.
    SELECT k.*, (sum(k.how_many) OVER (PARTITION BY k.name, k.scope, k.p ORDER BY k.request) - k.how_many)::bigint AS before
    FROM keyed AS k
  ), grouped AS (
    SELECT k.name, k.scope, k.p, (array_agg(k.def))[1] AS def, min(k.start) AS start, min(k.max_value) AS max_value,
           -- NULL when it would overflow: comparisons with it fail and value_after() decides.
           CASE WHEN min(k.increment) <= 9007199254740991 / sum(k.how_many) THEN min(k.increment) * sum(k.how_many) END::bigint AS step,
           min(k.increment) AS increment, sum(k.how_many)::bigint AS total
    FROM keyed AS k GROUP BY k.name, k.scope, k.p
  ), upserted AS (
    INSERT INTO {{schema}}.counters AS c (sequence, scope, period, value, previous)
    SELECT g.name, g.scope, g.p,
           CASE WHEN g.start <= g.max_value - (g.step - g.increment) THEN g.start + (g.step - g.increment)
                ELSE {{schema}}.value_after(g.def, NULL, g.total) END,
           NULL
    FROM grouped AS g
    ORDER BY g.name, g.scope, g.p
    ON CONFLICT (sequence, scope, period) DO UPDATE
      SET previous = c.value,
          value = (SELECT CASE WHEN c.value <= g.max_value - g.step THEN c.value + g.step
                               ELSE {{schema}}.value_after(g.def, c.value, g.total) END
                   FROM grouped AS g WHERE g.name = c.sequence AND g.scope = c.scope AND g.p = c.period),
          updated_at = now()
    RETURNING c.sequence, c.scope, c.period, c.previous
  )
  SELECT pl.request, v.v,
         CASE WHEN pl.format IS NULL THEN v.v::text
              ELSE {{schema}}.render(pl.format, v.v, pl.scope, pl.local_at, pl.year_start) END,
         CASE WHEN pl.reset = 'never' THEN NULL ELSE to_char(pl.p, 'YYYY-MM-DD') END
  FROM placed AS pl
  JOIN upserted AS up ON up.sequence = pl.name AND up.scope = pl.scope AND up.period = pl.p
  CROSS JOIN LATERAL (
    -- The (before + j)-th value after `previous`: arithmetic when it cannot wrap, else value_after().
    SELECT j,
           CASE
             WHEN pl.increment > 9007199254740991 / (pl.before + j) THEN {{schema}}.value_after(pl.def, up.previous, pl.before + j)
             WHEN up.previous IS NULL AND pl.start <= pl.max_value - (pl.before + j - 1) * pl.increment
               THEN pl.start + (pl.before + j - 1) * pl.increment
             WHEN up.previous IS NOT NULL AND up.previous <= pl.max_value - (pl.before + j) * pl.increment
               THEN up.previous + (pl.before + j) * pl.increment
             ELSE {{schema}}.value_after(pl.def, up.previous, pl.before + j)
           END AS v
    FROM generate_series(1, pl.how_many) AS j
  ) AS v
  ORDER BY pl.request, v.j;
  -- A caller's own transaction keeps its own setting.
  PERFORM set_config('lock_timeout', caller_lock_timeout, true);
END $$;

-- define_sequence() of 0007 with the month the year starts in (1: January). A year starting
-- elsewhere needs a gapless sequence that resets every year.
CREATE FUNCTION {{schema}}.define_sequence(
  seq_name text, seq_kind text, seq_start bigint, seq_increment bigint, seq_min bigint, seq_max bigint,
  seq_cycle boolean, seq_batch integer, seq_timeout_ms bigint, seq_reset text, seq_time_zone text,
  seq_format text, mode text, seq_year_start integer)
RETURNS TABLE (outcome text, definition {{schema}}.sequences)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  r record;
  result {{schema}}.sequences;
BEGIN
  IF seq_year_start IS NULL OR seq_year_start NOT BETWEEN 1 AND 12 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = format('yearStart must be a month from 1 (January) to 12 (got %s)', coalesce(seq_year_start::text, 'null'));
  END IF;
  IF seq_year_start <> 1 AND (seq_kind <> 'gapless' OR seq_reset <> 'year') THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = 'yearStart applies to gapless sequences with reset ''year'' only';
  END IF;
  SELECT * INTO r FROM {{schema}}.define_sequence(seq_name, seq_kind, seq_start, seq_increment, seq_min, seq_max,
    seq_cycle, seq_batch, seq_timeout_ms, seq_reset, seq_time_zone, seq_format, mode) AS d;
  result := r.definition;
  IF r.outcome <> 'exists' AND result.year_start <> seq_year_start THEN
    UPDATE {{schema}}.sequences AS d SET year_start = seq_year_start WHERE d.name = seq_name RETURNING d.* INTO result;
  END IF;
  RETURN QUERY SELECT r.outcome, result;
END $$;

-- The arguments of a trigger, as CREATE TRIGGER was given them (pg_trigger keeps them as
-- NUL-terminated bytes, which no text can hold).
CREATE FUNCTION {{schema}}.trigger_args(args bytea) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT AS $$
  SELECT coalesce(array_agg(convert_from(substring(args FROM z.prev + 1 FOR z.i - z.prev - 1), 'UTF8') ORDER BY z.i), '{}')
  FROM (SELECT i, coalesce(lag(i) OVER (ORDER BY i), 0) AS prev
          FROM generate_series(1, length(args)) AS i WHERE get_byte(args, i - 1) = 0) AS z
$$;

-- The instant whose period numbers a committing transaction: the database clock when the
-- commit numbers its first row, the same for every row of that commit. SET LOCAL
-- ordo.commit_at = '…' in the transaction numbers it as of another instant (an import of last
-- year's invoices).
CREATE FUNCTION {{schema}}.commit_instant() RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  given text := current_setting('ordo.commit_at', true);
  at timestamptz;
BEGIN
  IF given IS NOT NULL AND given <> '' THEN
    BEGIN
      RETURN given::timestamptz;
    EXCEPTION WHEN data_exception THEN
      RAISE EXCEPTION USING ERRCODE = 'OX003',
        MESSAGE = format('ordo.commit_at must be a timestamp with a time zone, such as ''2026-12-31 23:59:59+01'' (got %L)', given);
    END;
  END IF;
  at := clock_timestamp();
  PERFORM set_config('ordo.commit_at', at::text, true);
  RETURN at;
END $$;

-- The deferred trigger: runs as the transaction commits, once per inserted (or updated) row
-- whose column was still null, in the order the rows were written. The row is found by the
-- ctid the event recorded: a row deleted since, or updated since (its later event numbers it),
-- is not there any more, and take() is never called for it, so nothing is consumed.
-- TG_RELID is the partition for a row of a partitioned table, where ctids are unique.
-- Arguments: sequence, column, scope column ('' for none), text column ('' for none).
CREATE FUNCTION {{schema}}.number_at_commit() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF coalesce(current_setting('ordo.counters_locked', true), '') = '' THEN
    PERFORM {{schema}}.lock_pending_counters();
  END IF;
  EXECUTE format(
    'UPDATE %s AS r SET (%s) = (SELECT %s FROM {{schema}}.take($1, %s, $2, 1) AS t) WHERE r.ctid = $3 AND r.%I IS NULL',
    TG_RELID::regclass,
    CASE WHEN TG_ARGV[3] = '' THEN quote_ident(TG_ARGV[1]) ELSE quote_ident(TG_ARGV[1]) || ', ' || quote_ident(TG_ARGV[3]) END,
    CASE WHEN TG_ARGV[3] = '' THEN 't.value' ELSE 't.value, t.text' END,
    CASE WHEN TG_ARGV[2] = '' THEN '''''' ELSE format('coalesce(r.%I::text, '''')', TG_ARGV[2]) END,
    TG_ARGV[1])
  USING TG_ARGV[0], {{schema}}.commit_instant(), NEW.ctid;
  RETURN NULL;
END $$;

-- Two committing transactions that each number rows of several counters (scopes, periods or
-- sequences) would lock them in the order of their rows, and could deadlock. So each statement
-- writing an attached table notes the counters its rows need (a statement-level trigger with a
-- transition table, set-based), and the first row numbered at commit takes one advisory lock
-- per noted counter, all in one order (the hash's), before any counter's row lock: of the
-- committing transactions, only the one holding a counter's advisory lock takes its row lock.
-- Noted as 'sequence<US>scope', separated by <RS>, in ordo.pending_counters, a
-- transaction-local setting.
CREATE FUNCTION {{schema}}.note_pending_counters() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  pending text := coalesce(current_setting('ordo.pending_counters', true), '');
  added text;
BEGIN
  IF TG_ARGV[2] = '' THEN
    -- No scope column: one counter per sequence, known without reading the rows.
    added := TG_ARGV[0] || chr(31);
  ELSE
    EXECUTE format('SELECT string_agg(DISTINCT %L || chr(31) || coalesce(%I::text, ''''), chr(30)) FROM added WHERE %I IS NULL',
                   TG_ARGV[0], TG_ARGV[2], TG_ARGV[1])
      INTO added;
  END IF;
  IF added IS NOT NULL THEN
    SELECT string_agg(k, chr(30)) INTO added FROM unnest(string_to_array(added, chr(30))) AS k
     WHERE strpos(chr(30) || pending || chr(30), chr(30) || k || chr(30)) = 0;
    IF added IS NOT NULL THEN
      PERFORM set_config('ordo.pending_counters', CASE WHEN pending = '' THEN added ELSE pending || chr(30) || added END, true);
    END IF;
  END IF;
  RETURN NULL;
END $$;

-- At the first row numbered by a commit: the advisory locks of every noted counter, in the
-- order of their keys' hashes (a collision only makes two counters share a lock). A commit
-- that needs one counter takes none: holding a single lock and waiting for nothing after it,
-- it cannot close a cycle, and its commit stays as short as the counter's row lock allows
-- (the advisory lock would be held from before the row's update, which costs throughput).
CREATE FUNCTION {{schema}}.lock_pending_counters() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  pending text[] := string_to_array(nullif(current_setting('ordo.pending_counters', true), ''), chr(30));
  at timestamptz;
BEGIN
  IF coalesce(cardinality(pending), 0) > 1 THEN
    at := {{schema}}.commit_instant();
    PERFORM pg_advisory_xact_lock(h.key)
      FROM (SELECT DISTINCT hashtextextended(format('ordo.counter:%s/%s/%s', d.name, split_part(k, chr(31), 2),
                     {{schema}}.period_start(d.reset, d.year_start, at AT TIME ZONE d.time_zone)), 0) AS key
              FROM unnest(pending) AS k
              JOIN {{schema}}.sequences AS d ON d.name = split_part(k, chr(31), 1)) AS h
     ORDER BY h.key;
  END IF;
  PERFORM set_config('ordo.counters_locked', 'yes', true);
END $$;

-- Every column numbered at commit: one row per attach_sequence() (a partitioned table once).
CREATE VIEW {{schema}}.attachments AS
  SELECT a[1] AS sequence, t.tgrelid::regclass AS table_name, a[2] AS column_name,
         nullif(a[3], '') AS scope_column, nullif(a[4], '') AS text_column, t.tgname AS trigger_name
  FROM pg_trigger AS t CROSS JOIN LATERAL (SELECT {{schema}}.trigger_args(t.tgargs) AS a) AS x
  WHERE t.tgfoid = '{{schema}}.number_at_commit'::regproc AND t.tgparentid = 0;

-- The name of one of an attachment's triggers: the prefix and the column, within 63 bytes.
CREATE FUNCTION {{schema}}.attachment_trigger(prefix text, column_name text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN octet_length(prefix || column_name) <= 63 THEN prefix || column_name ELSE prefix || md5(column_name) END
$$;

-- The table named by a caller, or invalid_argument saying what to write instead.
CREATE FUNCTION {{schema}}.attachable_table(table_name text) RETURNS regclass
LANGUAGE plpgsql STABLE AS $$
DECLARE
  rel regclass;
  kind "char";
BEGIN
  BEGIN
    rel := to_regclass(table_name);
  EXCEPTION WHEN OTHERS THEN
    rel := NULL;
  END;
  IF rel IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The table %s does not exist: give its name as schema.table (quoted as in SQL when it needs quotes), or create it first',
      coalesce(quote_literal(table_name), 'null'));
  END IF;
  SELECT relkind INTO kind FROM pg_class WHERE oid = rel;
  IF kind NOT IN ('r', 'p') THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = format('%s is not a table (a view, a sequence or a foreign table cannot be numbered)', rel);
  END IF;
  RETURN rel;
END $$;

-- A column of rel that the trigger may write, or invalid_argument saying why not.
CREATE FUNCTION {{schema}}.attachable_column(rel regclass, col text, role text, category "char") RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
  att pg_attribute;
  cat "char";
BEGIN
  SELECT * INTO att FROM pg_attribute AS a WHERE a.attrelid = rel AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = format('The table %s has no column %s (the %s)', rel, coalesce(quote_literal(col), 'null'), role);
  END IF;
  IF category IS NULL THEN
    RETURN;
  END IF;
  SELECT typcategory INTO cat FROM pg_type WHERE oid = att.atttypid;
  IF cat <> category OR (category = 'N' AND att.atttypid NOT IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype, 'numeric'::regtype)) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('The column %I of %s (the %s) is %s: it must be %s',
      col, rel, role, format_type(att.atttypid, att.atttypmod),
      CASE WHEN category = 'N' THEN 'bigint, integer, smallint or numeric' ELSE 'text or varchar' END);
  END IF;
  IF att.atthasdef OR att.attidentity <> '' OR att.attgenerated <> '' THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The column %I of %s (the %s) has a default, identity or generation: rows would never reach the trigger with it null; drop it (ALTER TABLE %s ALTER COLUMN %I DROP DEFAULT / DROP IDENTITY / DROP EXPRESSION)',
      col, rel, role, rel, col);
  END IF;
  IF att.attnotnull THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The column %I of %s (the %s) is NOT NULL, but it is written as the transaction commits, after the insert: ALTER TABLE %s ALTER COLUMN %I DROP NOT NULL (after commit it is never null)',
      col, rel, role, rel, col);
  END IF;
END $$;

-- From now on every row inserted into table_name whose column_name is null gets the next
-- value of seq_name as its transaction commits (scope from scope_column, text in text_column).
-- Returns false when exactly this attachment exists already. Waits for transactions writing
-- the table (CREATE TRIGGER's lock); rows they inserted keep their null.
CREATE FUNCTION {{schema}}.attach_sequence(seq_name text, table_name text, column_name text,
                                           scope_column text DEFAULT NULL, text_column text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  s {{schema}}.sequences;
  rel regclass := {{schema}}.attachable_table(table_name);
  existing {{schema}}.attachments;
  trigger_name text;
BEGIN
  SELECT * INTO s FROM {{schema}}.sequences AS d WHERE d.name = seq_name FOR KEY SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX001', MESSAGE = format('The sequence %L does not exist', seq_name);
  END IF;
  IF s.kind <> 'gapless' THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The sequence %L is batched: only a gapless sequence can number rows at commit', seq_name);
  END IF;
  PERFORM {{schema}}.attachable_column(rel, column_name, 'numbered column', 'N');
  IF scope_column IS NOT NULL THEN
    PERFORM {{schema}}.attachable_column(rel, scope_column, 'scope column', NULL);
  END IF;
  IF text_column IS NOT NULL THEN
    PERFORM {{schema}}.attachable_column(rel, text_column, 'text column', 'S');
    IF text_column = column_name THEN
      RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = 'the text column must be another column than the numbered one';
    END IF;
  END IF;
  -- One lock for every attach and detach of this table, so two cannot race past the check below.
  PERFORM pg_advisory_xact_lock(hashtextextended('ordo.attach:' || rel::oid, 0));
  SELECT * INTO existing FROM {{schema}}.attachments AS a
   WHERE a.table_name = rel AND a.column_name = attach_sequence.column_name;
  IF FOUND THEN
    IF existing.sequence = seq_name AND existing.scope_column IS NOT DISTINCT FROM attach_sequence.scope_column
       AND existing.text_column IS NOT DISTINCT FROM attach_sequence.text_column THEN
      RETURN false;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The column %I of %s is numbered by the sequence %L already (scope column %s, text column %s): detach it first',
      column_name, rel, existing.sequence, coalesce(existing.scope_column, 'none'), coalesce(existing.text_column, 'none'));
  END IF;
  IF EXISTS (SELECT 1 FROM pg_inherits AS i JOIN {{schema}}.attachments AS a ON a.table_name = i.inhparent
              WHERE i.inhrelid = rel AND a.column_name = attach_sequence.column_name) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The column %I of %s is numbered already through the partitioned table it belongs to', column_name, rel);
  END IF;
  trigger_name := {{schema}}.attachment_trigger('ordo_number_', column_name);
  EXECUTE format(
    'CREATE CONSTRAINT TRIGGER %I AFTER INSERT OR UPDATE ON %s DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.%I IS NULL) EXECUTE FUNCTION {{schema}}.number_at_commit(%L, %L, %L, %L)',
    trigger_name, rel, column_name, seq_name, column_name, coalesce(scope_column, ''), coalesce(text_column, ''));
  EXECUTE format(
    'CREATE TRIGGER %I AFTER INSERT ON %s %s FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.note_pending_counters(%L, %L, %L)',
    {{schema}}.attachment_trigger('ordo_note_i_', column_name), rel,
    CASE WHEN scope_column IS NULL THEN '' ELSE 'REFERENCING NEW TABLE AS added' END,
    seq_name, column_name, coalesce(scope_column, ''));
  EXECUTE format(
    'CREATE TRIGGER %I AFTER UPDATE ON %s %s FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.note_pending_counters(%L, %L, %L)',
    {{schema}}.attachment_trigger('ordo_note_u_', column_name), rel,
    CASE WHEN scope_column IS NULL THEN '' ELSE 'REFERENCING NEW TABLE AS added' END,
    seq_name, column_name, coalesce(scope_column, ''));
  RETURN true;
END $$;

-- Stops numbering column_name of table_name. Waits for the transactions writing the table:
-- they commit with the trigger in place, so every row they inserted is numbered. Returns false
-- when the column was not numbered by seq_name.
CREATE FUNCTION {{schema}}.detach_sequence(seq_name text, table_name text, column_name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  rel regclass := {{schema}}.attachable_table(table_name);
  existing {{schema}}.attachments;
BEGIN
  PERFORM pg_advisory_xact_lock(hashtextextended('ordo.attach:' || rel::oid, 0));
  SELECT * INTO existing FROM {{schema}}.attachments AS a
   WHERE a.table_name = rel AND a.column_name = detach_sequence.column_name;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  IF existing.sequence <> seq_name THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The column %I of %s is numbered by the sequence %L, not %L', column_name, rel, existing.sequence, seq_name);
  END IF;
  EXECUTE format('DROP TRIGGER %I ON %s', existing.trigger_name, rel);
  EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', {{schema}}.attachment_trigger('ordo_note_i_', column_name), rel);
  EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', {{schema}}.attachment_trigger('ordo_note_u_', column_name), rel);
  RETURN true;
END $$;

-- As in 0002, but a sequence that numbers a table at commit is not removed under it (its
-- writers' commits would fail).
CREATE OR REPLACE FUNCTION {{schema}}.remove_sequence(seq_name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  old {{schema}}.sequences;
  used text;
BEGIN
  SELECT string_agg(format('%s(%I)', a.table_name, a.column_name), ', ') INTO used
    FROM {{schema}}.attachments AS a WHERE a.sequence = seq_name;
  IF used IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The sequence %L numbers %s at commit: detach it first (ordo.sequences.detach)', seq_name, used);
  END IF;
  DELETE FROM {{schema}}.sequences AS d WHERE d.name = seq_name RETURNING d.* INTO old;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  IF old.storage IS NOT NULL THEN
    EXECUTE format('DROP SEQUENCE IF EXISTS %s', old.storage);
  END IF;
  PERFORM pg_notify('ordo_sequences.{{schema_name}}', seq_name);
  RETURN true;
END $$;

-- Who holds each locked counter of a sequence: a transaction that took a number in the
-- transaction and has not ended. Its update left its xid as xmax on the row version others
-- see; the xid's lock (a subtransaction's too) names the backend, or the prepared transaction.
-- Waiting: the transactions queued on that xid or on the row. A counter created by the open
-- transaction (its period's first number) is invisible to others and not listed.
CREATE FUNCTION {{schema}}.sequence_holders(seq_name text)
RETURNS TABLE (scope text, period text, pid integer, prepared_gid text, xact_start timestamptz, state text,
               application_name text, waiting bigint, now timestamptz)
LANGUAGE sql VOLATILE AS $$
  SELECT c.scope, to_char(nullif(c.period, '-infinity'), 'YYYY-MM-DD'), l.pid, px.gid,
         coalesce(act.xact_start, px.prepared), act.state, act.application_name,
         (SELECT count(*) FROM pg_locks AS w
           WHERE NOT w.granted
             AND ((w.locktype = 'transactionid' AND w.transactionid = c.xmax)
               OR (w.locktype = 'tuple' AND w.database = l.database AND w.relation = '{{schema}}.counters'::regclass
                   AND w.page = (c.ctid::text::point)[0] AND w.tuple = (c.ctid::text::point)[1]))),
         clock_timestamp()
  FROM {{schema}}.counters AS c
  JOIN pg_locks AS l ON l.locktype = 'transactionid' AND l.transactionid = c.xmax AND l.granted
                    AND l.mode = 'ExclusiveLock'
  LEFT JOIN pg_stat_activity AS act ON act.pid = l.pid
  LEFT JOIN pg_prepared_xacts AS px ON l.pid IS NULL AND px.transaction = c.xmax
  WHERE c.sequence = seq_name AND c.xmax <> '0'::xid
  ORDER BY c.scope, c.period
$$;
