-- Completes permits and decides requests in one call (one round trip and one commit for a client's
-- queued calls of both kinds); the ends come first, so the decisions see them. Rows with a request
-- number answer a decision (acquire_all); rows without one are the permits completed
-- (complete_permits). Like every shared statement (take_many too; see src/db/batcher.ts), it waits
-- at most 50 ms for a row lock and then fails with 55P03 lock_not_available: the client serves its
-- calls alone instead, so that a key held by a caller's transaction does not hold up the others.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_batch(complete_ids uuid[], req integer[], names text[], keys text[],
                                          costs integer[], holders text[])
RETURNS TABLE (request integer, permit_id uuid, granted boolean, holder text, acquired_at timestamptz,
               expires_at timestamptz, retry_after_ms bigint, reason text, limit_name text, limit_key text,
               name text, key text, ended_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET lock_timeout = '50ms'
AS $$
BEGIN
  IF cardinality(complete_ids) > 0 THEN
    RETURN QUERY
      SELECT NULL::integer, e.id, NULL::boolean, NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::bigint,
             NULL::text, NULL::text, NULL::text, e.name, e.key, e.ended_at
        FROM {{schema}}.complete_permits(complete_ids) AS e;
  END IF;
  IF cardinality(req) > 0 THEN
    RETURN QUERY
      SELECT a.request, a.permit_id, a.granted, a.holder, a.acquired_at, a.expires_at, a.retry_after_ms, a.reason,
             a.limit_name, a.limit_key, NULL::text, NULL::text, NULL::timestamptz
        FROM {{schema}}.acquire_all(req, names, keys, costs, holders) AS a;
  END IF;
END $$;
