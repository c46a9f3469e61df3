-- ordo 0031: take_value() without the parts of its statements it does not need.
--
-- A plpgsql function keeps its statements' plans, but the executor builds each statement's
-- expressions again every time it runs, and looks up every function they name, in branches
-- not taken as in those taken. callgrind (bench/instructions.ts take, PostgreSQL 18 single
-- user) counted take_value() at 273,000 instructions against the upsert's 230,000, of which:
-- * about 24,000 in period_start(), inlined into the upsert: three branches, two of them
--   with make_interval() of seven arguments. It is now one expression for every reset but
--   'never': move back by the months the year is shifted by, truncate, move forward again.
--   That months count is year_start - 1, which is 0 for every reset but 'year': a year start
--   other than 1 is refused unless the reset is 'year' (define_sequence, 0009), and this
--   migration checks that no definition has one.
-- * about 7,000 in render(), named in the upsert's RETURNING for sequences with a format. It is
--   now its own statement, run only for a sequence with a format.
-- * about 4,000 in a CASE that kept the maximum's arithmetic from overflowing, which it cannot.
-- take_value(): 273,000 -> 256,000 instructions.
--
-- Custom SQLSTATEs: none new.

DO $$
DECLARE
  odd text;
BEGIN
  SELECT string_agg(format('%I (reset %s, year_start %s)', d.name, d.reset, d.year_start), ', ') INTO odd
    FROM {{schema}}.sequences AS d WHERE d.year_start <> 1 AND d.reset <> 'year';
  IF odd IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'ordo 0031: these sequences start their year in another month but do not reset every year, which ordo never writes: %s. Set their year_start to 1 (or their reset to ''year'') and migrate again',
      odd);
  END IF;
END $$;

-- As in 0009, with the year's shift in one expression (year_start - 1 months: none unless the
-- reset is 'year').
CREATE OR REPLACE FUNCTION {{schema}}.period_start(reset text, year_start integer, local_at timestamp) RETURNS date
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE
    WHEN reset = 'never' THEN '-infinity'::date
    ELSE (date_trunc(reset, local_at - (year_start - 1) * interval '1 month') + (year_start - 1) * interval '1 month')::date
  END
$$;

-- As in 0024; render() only for a sequence with a format.
CREATE OR REPLACE FUNCTION {{schema}}.take_value(seq_name text, seq_scope text DEFAULT '', at timestamptz DEFAULT NULL)
RETURNS text[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  seq_kind text;
  seq_start bigint;
  seq_increment bigint;
  -- The last value the next one may follow without passing the maximum. It cannot overflow
  -- (increment > 0, max_value <= 2^53 - 1), and the sum in SET is made only where the
  -- conflict's WHERE allowed it, so it cannot either.
  seq_before_max bigint;
  seq_reset text;
  seq_time_zone text;
  seq_year_start integer;
  seq_format text;
  local_at timestamp;
  issued text[];
  durable text;
BEGIN
  -- Read at commit, so set anywhere in the transaction: here, before the counter is locked
  -- (and only when needed: setting it costs more than looking).
  IF current_setting('synchronous_commit') <> 'on' THEN
    durable := set_config('synchronous_commit', 'on', true);
  END IF;
  IF pg_advisory_xact_lock_shared(hashtext('{{schema_name}}.sequence_kind'), hashtext(seq_name)) IS NULL THEN
    NULL; -- a null name: no lock, and no sequence (take() says so)
  END IF;
  SELECT d.kind, d.start, d.increment,
         d.max_value - d.increment,
         d.reset, d.time_zone, d.year_start, d.format
    INTO seq_kind, seq_start, seq_increment, seq_before_max, seq_reset, seq_time_zone, seq_year_start, seq_format
    FROM {{schema}}.sequences AS d WHERE d.name = seq_name;
  IF seq_kind = 'gapless' AND seq_scope IS NOT NULL THEN
    local_at := coalesce(at, now()) AT TIME ZONE seq_time_zone;
    -- As take() does for one value. When the next value would pass the maximum, the row is
    -- locked and left as it is (no row returned), and take() goes on from there.
    INSERT INTO {{schema}}.counters AS c (sequence, scope, period, value, previous)
    VALUES (seq_name, seq_scope, {{schema}}.period_start(seq_reset, seq_year_start, local_at), seq_start, NULL)
    ON CONFLICT (sequence, scope, period) DO UPDATE
      SET previous = c.value, value = c.value + seq_increment, updated_at = now()
      WHERE c.value <= seq_before_max
    RETURNING ARRAY[c.value::text, c.value::text,
      CASE WHEN seq_reset = 'never' THEN NULL ELSE to_char(c.period, 'YYYY-MM-DD') END]
    INTO issued;
  END IF;
  IF issued IS NULL THEN
    SELECT ARRAY[t.value::text, t.text, t.period] INTO issued
      FROM {{schema}}.take(seq_name, seq_scope, coalesce(at, now()), 1) AS t;
  ELSIF seq_format IS NOT NULL THEN
    issued[2] := {{schema}}.render(seq_format, issued[1]::bigint, seq_scope, local_at, seq_year_start);
  END IF;
  RETURN issued;
END $$;

