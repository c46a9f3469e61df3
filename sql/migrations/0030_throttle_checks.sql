-- ordo 0030: throttle state without the table CHECKs its writers already make.
--
-- A table's CHECK constraints are read from the catalog as node text (stringToNode) and built
-- into expressions each time a statement first writes a row of it: every statement of a
-- decision that inserts or updates throttle_state or permits paid for all of that table's
-- checks, and a decision runs several such statements. callgrind (bench/instructions.ts)
-- put ExecConstraints at 9.4% of a decision's instructions, most of it reading the
-- constraints' text. Merging each table's checks into one changed nothing (the cost follows
-- the size of the expressions, not their number); domains kept most of the gain but changed
-- the columns' types, which every function returning them would have had to cast.
--
-- Each of these columns has one writer that checks what it writes, with a message that names
-- the argument:
-- * permits.cost: acquire_all's argument checks (0029), before anything is written;
-- * permits.outcome and throttle_state.last_outcome: the functions that end and fold permits,
--   which write 'completed', 'failed' or 'expired' as constants (last_outcome is copied from
--   permits.outcome);
-- * throttle_state.own_*: set_key_limits, which left its ranges to the table's CHECKs and now
--   checks them itself (below); a decision writes back what it read.
-- These tables are written through ordo's functions only: an UPDATE of them by hand is not
-- checked any more (an own_rate_limit of 0 would fail every later decision on its key).
-- permits' one rule between two columns (ended_at and outcome are set together) stays a CHECK:
-- it guards the logic of several functions, not an argument.
--
-- One acquire and its complete: 3.62 -> 3.28 million instructions; 16 of each: 11.46 -> 11.08
-- million.
--
-- Custom SQLSTATEs: none new.

ALTER TABLE {{schema}}.throttle_state
  DROP CONSTRAINT throttle_state_last_outcome_check,
  DROP CONSTRAINT throttle_state_own_every_ms_check,
  DROP CONSTRAINT throttle_state_own_rate_limit_check,
  DROP CONSTRAINT throttle_state_own_per_ms_check,
  DROP CONSTRAINT throttle_state_own_concurrency_check;

ALTER TABLE {{schema}}.permits
  DROP CONSTRAINT permits_outcome_check,
  DROP CONSTRAINT permits_cost_check;

-- As in 0010, with its own range checks (it left them to the table's CHECKs).
CREATE OR REPLACE FUNCTION {{schema}}.set_key_limits(throttle_name text, throttle_key text, new_every_ms bigint,
                                                     new_rate_limit integer, new_per_ms bigint, new_concurrency integer)
RETURNS TABLE (every_ms bigint, rate_limit integer, per_ms bigint, concurrency integer)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  d {{schema}}.throttles;
BEGIN
  SELECT * INTO d FROM {{schema}}.throttles AS t WHERE t.name = throttle_name FOR KEY SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX005', MESSAGE = format('The throttle %L does not exist', throttle_name);
  END IF;
  IF throttle_key IS NULL OR length(throttle_key) > 200 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = 'A key is a text of at most 200 characters';
  END IF;
  IF new_every_ms NOT BETWEEN 1 AND 31536000000 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'every is 1 ms to 365 days (31536000000 ms), or null for the throttle''s (got %s ms)', new_every_ms);
  END IF;
  IF new_per_ms NOT BETWEEN 1 AND 31536000000 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'per is 1 ms to 365 days (31536000000 ms), or null for the throttle''s (got %s ms)', new_per_ms);
  END IF;
  IF new_rate_limit NOT BETWEEN 1 AND 1000000 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'limit is 1 to 1000000, or null for the throttle''s (got %s)', new_rate_limit);
  END IF;
  IF new_concurrency NOT BETWEEN 1 AND 1000000 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'concurrency is 1 to 1000000, or null for the throttle''s (got %s)', new_concurrency);
  END IF;
  IF (coalesce(new_rate_limit, d.rate_limit) IS NULL) <> (coalesce(new_per_ms, d.per_ms) IS NULL) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = format('limit and per go together: the throttle %L has no rate limit, so give both', throttle_name);
  END IF;
  INSERT INTO {{schema}}.throttle_state AS st
    (name, key, incarnation, own_every_ms, own_rate_limit, own_per_ms, own_concurrency)
  VALUES (throttle_name, throttle_key, d.incarnation, new_every_ms, new_rate_limit, new_per_ms, new_concurrency)
  ON CONFLICT (name, key) DO UPDATE
    SET own_every_ms = EXCLUDED.own_every_ms, own_rate_limit = EXCLUDED.own_rate_limit,
        own_per_ms = EXCLUDED.own_per_ms, own_concurrency = EXCLUDED.own_concurrency;
  PERFORM {{schema}}.throttle_freed(ARRAY[throttle_name]);
  RETURN QUERY SELECT coalesce(new_every_ms, d.every_ms), coalesce(new_rate_limit, d.rate_limit),
                      coalesce(new_per_ms, d.per_ms), coalesce(new_concurrency, d.concurrency);
END $$;
