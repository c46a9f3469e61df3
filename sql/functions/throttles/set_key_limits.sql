-- A key's own limits (null: the throttle's), for tiers such as a premium tenant. Returns the limits
-- the key now has; decisions on the key use them from the next one on, and the throttle's waiters
-- are woken. The ranges are checked here (throttle_state has no CHECKs: each column has one writer
-- that checks what it writes). The state row is written under a FOR KEY SHARE lock of the
-- throttle's row, so the throttle cannot be removed meanwhile. A key of a throttle without permits
-- cannot have a concurrency limit (nothing counts its live starts).
--
-- OX005 throttle_not_found. OX003 invalid_argument: a key over 200 characters, a limit out of
-- range, a concurrency on a throttle without permits, or a limit without its per (or the reverse)
-- where the throttle has no rate limit.
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
  IF new_concurrency IS NOT NULL AND d.lease_ms IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The throttle %L grants no permits (permits: false), so a key of it cannot have a concurrency limit: define it with permits to count live starts', throttle_name);
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
