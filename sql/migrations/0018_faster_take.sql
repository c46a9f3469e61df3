-- ordo 0018: one gapless value in a statement that costs about what a hand-written upsert costs.
--
-- next({ tx }) sent `SELECT value, text, period FROM take($1, $2, $3, 1) CROSS JOIN (SELECT
-- set_config(…))`: BEGIN, that, COMMIT cost the server 433,000 instructions, against 219,000
-- with a bare INSERT … ON CONFLICT DO UPDATE … RETURNING (callgrind, PostgreSQL 15). The
-- statement around a set-returning function and a join is parsed, analysed and planned anew
-- every call (150,000); the function then compiles a dozen plpgsql expressions again in every
-- transaction and passes its row through a tuplestore. take_value() is the same decision for
-- one value as a plain function: `SELECT take_value($1, $2, $3)` plans in a fraction of that,
-- and the function runs two statements whose plans it keeps (the definition, the upsert) and
-- returns one array: 245,000 in all. take() is unchanged.

-- The next value of a gapless sequence for a scope, in the period that contains `at` (null: the
-- transaction's now()), as {value, text, period} (period null when the sequence never resets),
-- exactly as `take(seq_name, seq_scope, at, 1)` gives it. The commit of the calling transaction
-- is made durable (synchronous_commit on): a number handed out must not be handed out again
-- after a crash. Only the common case is decided here: a value that would pass the maximum
-- (exhaustion, or a cycle), a sequence that does not exist or is batched, and a null scope go
-- to take(), which decides them and raises its errors.
CREATE FUNCTION {{schema}}.take_value(seq_name text, seq_scope text DEFAULT '', at timestamptz DEFAULT NULL)
RETURNS text[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  seq_kind text;
  seq_start bigint;
  seq_increment bigint;
  -- The last value the next one may follow without passing the maximum; null when the
  -- increment alone would overflow the arithmetic (take() decides then).
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
  SELECT d.kind, d.start, d.increment,
         CASE WHEN d.increment <= 9007199254740991 THEN d.max_value - d.increment END,
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
    RETURNING ARRAY[c.value::text,
      CASE WHEN seq_format IS NULL THEN c.value::text
           ELSE {{schema}}.render(seq_format, c.value, seq_scope, local_at, seq_year_start) END,
      CASE WHEN seq_reset = 'never' THEN NULL ELSE to_char(c.period, 'YYYY-MM-DD') END]
    INTO issued;
  END IF;
  IF issued IS NULL THEN
    SELECT ARRAY[t.value::text, t.text, t.period] INTO issued
      FROM {{schema}}.take(seq_name, seq_scope, coalesce(at, now()), 1) AS t;
  END IF;
  RETURN issued;
END $$;
