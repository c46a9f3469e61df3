-- The next value of a gapless sequence for a scope, in the period that contains `at` (null: the
-- transaction's now()), as {value, text, period}, exactly as take(seq_name, seq_scope, at, 1)
-- gives it: the library's take in a caller's transaction, and numbering at commit's. Only the
-- common case is decided here, by one UPDATE of the counter found by its key: a number nearly
-- always moves a counter that exists, and an UPDATE costs less than take()'s upsert. When it
-- finds no row (a new counter, a value that would pass the maximum, a sequence that does not
-- exist or is batched, a null scope or name), take() decides and raises its errors. The same
-- number, row lock and errors as take(): at READ COMMITTED an UPDATE that waits for the row
-- re-checks its WHERE on the version it then sees, as the upsert's conflict clause does; at
-- REPEATABLE READ both refuse a row changed since the snapshot (40001).
--
-- A plain function returning an array, not a set: `SELECT take_value($1, $2, $3)` plans in a
-- fraction of what a statement around a set-returning function costs, and the function keeps
-- its statements' plans. The locks are take()'s, in its order: the kind lock before the
-- definition is read, the counter's queue before the row. The period, and the text's template
-- (render_template(): all of the format but the number), are computed in the statement that
-- reads the definition, before the queue, so the UPDATE finds the row by its key alone and only
-- fills the number into the text (render_fill()): a taker holds the counter until it commits,
-- and every other taker of a hot counter waits for what it does after the queue. The caller's
-- commit is made durable (synchronous_commit on): a number handed out must not be handed out
-- again after a crash.
CREATE OR REPLACE FUNCTION {{schema}}.take_value(seq_name text, seq_scope text DEFAULT '', at timestamptz DEFAULT NULL)
RETURNS text[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  seq_kind text;
  seq_increment bigint;
  -- The last value the next one may follow without passing the maximum.
  seq_before_max bigint;
  seq_reset text;
  seq_template text[];
  seq_period date;
  queued boolean;
  issued text[];
  durable text;
BEGIN
  -- Read at commit, so set anywhere in the transaction (and only when needed: setting it costs
  -- more than looking).
  IF current_setting('synchronous_commit') <> 'on' THEN
    durable := set_config('synchronous_commit', 'on', true);
  END IF;
  -- The kind lock, shared, before the definition is read (see take()).
  IF pg_advisory_xact_lock_shared(hashtext('{{schema_name}}.sequence_kind'), hashtext(seq_name)) IS NULL THEN
    NULL; -- a null name: no lock, and no sequence (take() says so)
  END IF;
  SELECT d.kind, d.increment, d.max_value - d.increment, d.reset,
         {{schema}}.period_start(d.reset, d.year_start, l.local_at),
         CASE WHEN d.format IS NOT NULL THEN {{schema}}.render_template(d.format, seq_scope, l.local_at, d.year_start) END
    INTO seq_kind, seq_increment, seq_before_max, seq_reset, seq_period, seq_template
    FROM {{schema}}.sequences AS d CROSS JOIN LATERAL (SELECT coalesce(at, now()) AT TIME ZONE d.time_zone AS local_at) AS l
   WHERE d.name = seq_name;
  IF seq_kind = 'gapless' THEN
    -- The counter's queue (above). A null scope: no lock, no row, and take() says why.
    queued := {{schema}}.queue_on_counter(seq_name, seq_scope, seq_period);
    IF seq_template IS NULL THEN
      UPDATE {{schema}}.counters AS c
         SET previous = c.value, value = c.value + seq_increment, updated_at = now()
       WHERE c.sequence = seq_name AND c.scope = seq_scope AND c.period = seq_period AND c.value <= seq_before_max
      RETURNING ARRAY[c.value::text, c.value::text,
        CASE WHEN seq_reset = 'never' THEN NULL ELSE to_char(c.period, 'YYYY-MM-DD') END]
      INTO issued;
    ELSE
      -- The same UPDATE, with the number filled into the text as it returns (render_fill(),
      -- inlined): an expression is prepared in every transaction that runs its statement, so the
      -- fill has a statement of its own, and numbers without a text do not prepare it.
      UPDATE {{schema}}.counters AS c
         SET previous = c.value, value = c.value + seq_increment, updated_at = now()
       WHERE c.sequence = seq_name AND c.scope = seq_scope AND c.period = seq_period AND c.value <= seq_before_max
      RETURNING ARRAY[c.value::text, {{schema}}.render_fill(seq_template, c.value),
        CASE WHEN seq_reset = 'never' THEN NULL ELSE to_char(c.period, 'YYYY-MM-DD') END]
      INTO issued;
    END IF;
  END IF;
  IF issued IS NULL THEN
    IF queued AND pg_current_xact_id_if_assigned() IS NOT NULL THEN
      -- Counted (queued with a transaction id, which the UPDATE that found no row did not change):
      -- take() counts this counter again, so its place goes back first.
      PERFORM set_config('ordo.counter_queues', substr(current_setting('ordo.counter_queues'), 2), true);
    END IF;
    SELECT ARRAY[t.value::text, t.text, t.period] INTO issued
      FROM {{schema}}.take(seq_name, seq_scope, coalesce(at, now()), 1) AS t;
  END IF;
  RETURN issued;
END $$;
