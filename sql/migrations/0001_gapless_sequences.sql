-- ordo 0001: sequence definitions and gapless counters.
-- {{schema}} is replaced by the quoted schema name before this file runs.
-- Custom SQLSTATEs (mapped to OrdoError codes in src/errors.ts):
--   OX001 sequence_not_found   OX002 sequence_exhausted   OX003 invalid_argument
--   OX004 the sequence is of the other kind (a caller with a stale definition refreshes it)

CREATE TABLE {{schema}}.sequences (
  name        text PRIMARY KEY CHECK (name ~ '^[A-Za-z_][A-Za-z0-9_]{0,62}$'),
  kind        text NOT NULL DEFAULT 'gapless' CHECK (kind IN ('gapless', 'batched')),
  start       bigint NOT NULL DEFAULT 1,
  increment   bigint NOT NULL DEFAULT 1 CHECK (increment > 0),
  min_value   bigint NOT NULL DEFAULT 1,
  max_value   bigint NOT NULL DEFAULT 9007199254740991,
  cycle       boolean NOT NULL DEFAULT false,
  batch       integer CHECK (batch > 0),
  timeout_ms  bigint CHECK (timeout_ms >= 0),
  reset       text NOT NULL DEFAULT 'never' CHECK (reset IN ('never', 'day', 'week', 'month', 'year')),
  time_zone   text NOT NULL DEFAULT 'UTC',
  format      text CHECK (format ~ '\{n(:[0-9]+)?\}'),
  high_water  bigint,
  epoch       integer NOT NULL DEFAULT 1,
  created_at  timestamptz NOT NULL DEFAULT now(),
  updated_at  timestamptz NOT NULL DEFAULT now(),
  -- Values stay within ±(2^53 - 1) so that JavaScript numbers never round them.
  CHECK (min_value >= -9007199254740991 AND max_value <= 9007199254740991),
  CHECK (min_value <= start AND start <= max_value)
);

-- One row per (sequence, scope, period). `period` is the local start of the reset period
-- ('-infinity' when the sequence never resets). `previous` is the value before the last
-- statement that touched the row, so one statement can hand out several values in order.
CREATE TABLE {{schema}}.counters (
  sequence    text NOT NULL REFERENCES {{schema}}.sequences (name) ON DELETE CASCADE,
  scope       text NOT NULL,
  period      date NOT NULL,
  value       bigint NOT NULL,
  previous    bigint,
  updated_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (sequence, scope, period)
);

-- Raises invalid_argument unless tz is a zone name of PostgreSQL's IANA database (which has
-- legacy fixed-offset zones such as 'EST' too). POSIX offsets ('UTC+3', whose sign is inverted
-- from what most people expect) and abbreviations outside that list are refused.
CREATE FUNCTION {{schema}}.check_time_zone(tz text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
  IF tz IS NULL OR NOT EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = tz) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = format('Unknown time zone %L: use an IANA name such as ''Europe/Paris'' or ''UTC''', tz);
  END IF;
  RETURN tz;
END $$;

-- The i-th value after `prev` (prev NULL: nothing issued yet in this period, so the first
-- value is `start`). Closed form, so one statement can take any number of values.
CREATE FUNCTION {{schema}}.value_after(s {{schema}}.sequences, prev bigint, i bigint) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  room bigint;
BEGIN
  IF prev IS NULL THEN
    IF i = 1 THEN
      RETURN s.start;
    END IF;
    prev := s.start;
    i := i - 1;
  END IF;
  room := greatest(0, (s.max_value - prev) / s.increment);
  IF i <= room THEN
    RETURN prev + i * s.increment;
  END IF;
  IF NOT s.cycle THEN
    RAISE EXCEPTION USING ERRCODE = 'OX002',
      MESSAGE = format('The sequence %L is exhausted: it cannot go past its maximum value %s', s.name, s.max_value),
      HINT = 'Raise maxValue, or define the sequence with cycle: true to wrap around.';
  END IF;
  RETURN s.min_value + ((i - room - 1) % ((s.max_value - s.min_value) / s.increment + 1)) * s.increment;
END $$;

-- Renders a format such as 'INV-{YYYY}-{n:6}'. Date tokens show the local date of the call
-- in the sequence's time zone; {IYYY} is the ISO week-numbering year that goes with {WW}.
-- {scope} is replaced last so that a scope containing braces is never expanded.
CREATE FUNCTION {{schema}}.render(fmt text, v bigint, scope text, local_at timestamp) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  r text;
  m text[];
  width int;
  digits text;
BEGIN
  IF fmt IS NULL THEN
    RETURN v::text;
  END IF;
  r := replace(fmt, '{YYYY}', to_char(local_at, 'YYYY'));
  r := replace(r, '{YY}', to_char(local_at, 'YY'));
  r := replace(r, '{MM}', to_char(local_at, 'MM'));
  r := replace(r, '{DD}', to_char(local_at, 'DD'));
  r := replace(r, '{WW}', to_char(local_at, 'IW'));
  r := replace(r, '{IYYY}', to_char(local_at, 'IYYY'));
  r := replace(r, '{n}', v::text);
  FOR m IN SELECT regexp_matches(r, '\{n:([0-9]+)\}', 'g') LOOP
    width := m[1]::int;
    digits := abs(v)::text;
    IF length(digits) < width THEN
      digits := lpad(digits, width, '0');
    END IF;
    r := replace(r, '{n:' || m[1] || '}', CASE WHEN v < 0 THEN '-' ELSE '' END || digits);
  END LOOP;
  RETURN replace(r, '{scope}', scope);
END $$;

-- The one decision: take `how_many` consecutive values of a gapless sequence for a scope,
-- in the period that contains `at`. A single INSERT … ON CONFLICT DO UPDATE creates the
-- period's row or advances it; its row lock lasts until the caller's transaction ends, so
-- a rollback returns the numbers and concurrent first calls of a new period cannot race.
-- The common case (no wrap, no exhaustion) is plain arithmetic inside the upsert, so the row
-- lock is held for as little work as possible; value_after() handles the rest.
CREATE FUNCTION {{schema}}.take(seq_name text, seq_scope text, at timestamptz, how_many integer)
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
  p := CASE WHEN s.reset = 'never' THEN '-infinity'::date ELSE date_trunc(s.reset, local_at)::date END;
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
                 ELSE {{schema}}.render(s.format, last_value, seq_scope, local_at) END;
    RETURN NEXT;
    RETURN;
  END IF;
  RETURN QUERY
    SELECT v, CASE WHEN s.format IS NULL THEN v::text ELSE {{schema}}.render(s.format, v, seq_scope, local_at) END,
           period
    FROM (SELECT {{schema}}.value_after(s, prev, i) AS v FROM generate_series(1, how_many) AS i) AS issued;
END $$;

-- Many standalone requests in one statement: request i asks for counts[i] values of
-- names[i] for scopes[i] at ats[i] (NULL: now()). Returns each request's values in order,
-- tagged with i. Requests that land on the same counter row share one update, in request
-- order. Rows are locked in (sequence, scope, period) order, so two batches never deadlock;
-- a short local lock_timeout makes a batch give way to a transaction holding one of its rows
-- (the caller then serves those requests one statement each), so a batch can never be what
-- makes a caller's own transaction fail.
CREATE FUNCTION {{schema}}.take_many(names text[], scopes text[], ats timestamptz[], counts integer[])
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
           d.start, d.increment, d.max_value, d.reset, d.format,
           coalesce(u.at, now()) AT TIME ZONE d.time_zone AS local_at
    FROM unnest(names, scopes, ats, counts) WITH ORDINALITY AS u(name, scope, at, how_many, i)
    JOIN {{schema}}.sequences AS d ON d.name = u.name
  ), keyed AS (
    SELECT i.*, CASE WHEN i.reset = 'never' THEN '-infinity'::date ELSE date_trunc(i.reset, i.local_at)::date END AS p
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
         CASE WHEN pl.format IS NULL THEN v.v::text ELSE {{schema}}.render(pl.format, v.v, pl.scope, pl.local_at) END,
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

CREATE FUNCTION {{schema}}.nextval(seq_name text, seq_scope text DEFAULT '', at timestamptz DEFAULT now())
RETURNS bigint
LANGUAGE sql VOLATILE AS $$
  SELECT t.value FROM {{schema}}.take(seq_name, seq_scope, at, 1) AS t
$$;

CREATE FUNCTION {{schema}}.nextval_text(seq_name text, seq_scope text DEFAULT '', at timestamptz DEFAULT now())
RETURNS text
LANGUAGE sql VOLATILE AS $$
  SELECT t.text FROM {{schema}}.take(seq_name, seq_scope, at, 1) AS t
$$;
