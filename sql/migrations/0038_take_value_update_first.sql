-- ordo 0038: take_value() updates the counter it finds, and leaves every other case to take().
--
-- A number taken in the caller's transaction nearly always moves a counter that exists: the
-- first number of a scope in a period is one in thousands. 0031's take_value() wrote it with
-- INSERT … ON CONFLICT DO UPDATE, which costs more to start and run than an UPDATE of the row
-- by its key, and assigned the local time and the period in two plpgsql expressions of their
-- own, each built again in every transaction. It now runs one UPDATE, the period computed in
-- its WHERE; when that finds no row (a new counter, the maximum reached, a sequence that is not
-- gapless, a null scope or name, no such sequence), take() does what it did before in each case.
--
-- Counted by callgrind (npx tsx bench/instructions.ts take): 256,600 -> 242,300 instructions on
-- PostgreSQL 18, against 229,800 for the gapless bench's hand-written upsert; 227,000 -> 211,200
-- on 15, against 216,500.
--
-- The same number, the same row locked, the same errors: at READ COMMITTED an UPDATE that waits
-- for the row re-checks its WHERE on the version it then sees, as the upsert's conflict clause
-- did; at REPEATABLE READ both refuse a row changed since the snapshot (40001).
--
-- Custom SQLSTATEs: none new.

-- As in 0031, but the counter is updated in place when it exists.
CREATE OR REPLACE FUNCTION {{schema}}.take_value(seq_name text, seq_scope text DEFAULT '', at timestamptz DEFAULT NULL)
RETURNS text[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  seq_kind text;
  seq_increment bigint;
  -- As in 0031: the last value the next one may follow without passing the maximum.
  seq_before_max bigint;
  seq_reset text;
  seq_time_zone text;
  seq_year_start integer;
  seq_format text;
  issued text[];
  durable text;
BEGIN
  -- Read at commit, so set anywhere in the transaction (and only when needed: setting it costs
  -- more than looking).
  IF current_setting('synchronous_commit') <> 'on' THEN
    durable := set_config('synchronous_commit', 'on', true);
  END IF;
  -- Before the definition is read: a change of kind waits for this transaction, or this one
  -- reads the new definition. (Taken in the statement that reads it, the lock would come after
  -- that statement's snapshot.)
  IF pg_advisory_xact_lock_shared(hashtext('{{schema_name}}.sequence_kind'), hashtext(seq_name)) IS NULL THEN
    NULL; -- a null name: no lock, and no sequence (take() says so)
  END IF;
  SELECT d.kind, d.increment, d.max_value - d.increment, d.reset, d.time_zone, d.year_start, d.format
    INTO seq_kind, seq_increment, seq_before_max, seq_reset, seq_time_zone, seq_year_start, seq_format
    FROM {{schema}}.sequences AS d WHERE d.name = seq_name;
  UPDATE {{schema}}.counters AS c
     SET previous = c.value, value = c.value + seq_increment, updated_at = now()
   WHERE c.sequence = seq_name AND c.scope = seq_scope
     AND c.period = {{schema}}.period_start(seq_reset, seq_year_start, coalesce(at, now()) AT TIME ZONE seq_time_zone)
     AND c.value <= seq_before_max AND seq_kind = 'gapless'
  RETURNING ARRAY[c.value::text, c.value::text,
    CASE WHEN seq_reset = 'never' THEN NULL ELSE to_char(c.period, 'YYYY-MM-DD') END]
  INTO issued;
  IF issued IS NULL THEN
    SELECT ARRAY[t.value::text, t.text, t.period] INTO issued
      FROM {{schema}}.take(seq_name, seq_scope, coalesce(at, now()), 1) AS t;
  ELSIF seq_format IS NOT NULL THEN
    issued[2] := {{schema}}.render(seq_format, issued[1]::bigint, seq_scope,
      coalesce(at, now()) AT TIME ZONE seq_time_zone, seq_year_start);
  END IF;
  RETURN issued;
END $$;
