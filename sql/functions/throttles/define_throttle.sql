-- Creates, or with mode 'overwrite' redefines, a throttle. Returns the definition and what
-- happened: 'created', 'exists' (left as it was; the client turns it into OX006 throttle_exists
-- under mode 'create') or 'overwritten'. A redefinition keeps each key's state and its live
-- permits; the new policy applies from the next decision. keep_permits false defines a throttle
-- without permits (lease_ms null): a plain rate limiter, of `every` and limit with per only, whose
-- grants store nothing.
-- OX003 invalid_argument: a bad mode, name or policy; values out of range fail the table's CHECKs
-- (23514, which the client reports as invalid_argument).
CREATE OR REPLACE FUNCTION {{schema}}.define_throttle(
  throttle_name text, new_every_ms bigint, new_rate_limit integer, new_per_ms bigint,
  new_concurrency integer, new_lease_ms bigint, new_refund_on_failure boolean, mode text,
  keep_permits boolean DEFAULT true)
RETURNS TABLE (outcome text, definition {{schema}}.throttles)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  result {{schema}}.throttles;
  lease bigint := CASE WHEN keep_permits IS NOT false THEN coalesce(new_lease_ms, 300000) END;
BEGIN
  IF mode IS NULL OR mode NOT IN ('create', 'if_not_exists', 'overwrite') THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format('unknown define mode %L', mode);
  END IF;
  IF throttle_name IS NULL OR throttle_name !~ '^[A-Za-z_][A-Za-z0-9_]{0,62}$' THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = format('A throttle name must be an identifier (a letter or underscore, then letters, digits or underscores, at most 63 characters), not %L', throttle_name);
  END IF;
  IF new_every_ms IS NULL AND new_rate_limit IS NULL AND new_concurrency IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = 'A throttle needs at least one policy: every, limit with per, or concurrency';
  END IF;
  IF (new_rate_limit IS NULL) <> (new_per_ms IS NULL) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = 'limit and per go together: give both or neither';
  END IF;
  IF keep_permits IS false AND (new_concurrency IS NOT NULL OR new_lease_ms IS NOT NULL OR new_refund_on_failure) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The throttle %L grants no permits (permits: false): it takes every and limit with per only, not %s (they need a permit that lives until it ends)',
      throttle_name, CASE WHEN new_concurrency IS NOT NULL THEN 'concurrency'
                          WHEN new_lease_ms IS NOT NULL THEN 'a lease' ELSE 'refundOnFailure' END);
  END IF;
  -- Out of range values fail the table's CHECKs (invalid_argument).
  LOOP
    INSERT INTO {{schema}}.throttles AS d
      (name, every_ms, rate_limit, per_ms, concurrency, lease_ms, refund_on_failure)
    VALUES (throttle_name, new_every_ms, new_rate_limit, new_per_ms, new_concurrency,
            lease, coalesce(new_refund_on_failure, false))
    ON CONFLICT (name) DO NOTHING
    RETURNING d.* INTO result;
    IF FOUND THEN
      RETURN QUERY SELECT 'created'::text, result;
      RETURN;
    END IF;
    IF mode = 'overwrite' THEN
      -- A key's own concurrency needs permits: a throttle that drops them drops that too.
      UPDATE {{schema}}.throttles AS d
         SET every_ms = new_every_ms, rate_limit = new_rate_limit, per_ms = new_per_ms,
             concurrency = new_concurrency, lease_ms = lease,
             refund_on_failure = coalesce(new_refund_on_failure, false), updated_at = now()
       WHERE d.name = throttle_name
      RETURNING d.* INTO result;
      IF FOUND THEN
        IF lease IS NULL THEN
          UPDATE {{schema}}.throttle_state AS st SET own_concurrency = NULL
           WHERE st.name = throttle_name AND st.own_concurrency IS NOT NULL;
        END IF;
        RETURN QUERY SELECT 'overwritten'::text, result;
        RETURN;
      END IF;
    ELSE
      SELECT * INTO result FROM {{schema}}.throttles AS d WHERE d.name = throttle_name;
      IF FOUND THEN
        RETURN QUERY SELECT 'exists'::text, result;
        RETURN;
      END IF;
    END IF;
    -- Removed between the two statements: try again.
  END LOOP;
END $$;
