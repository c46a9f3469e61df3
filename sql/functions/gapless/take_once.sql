-- take(), once per (sequence, key): a client that retries a call with the same key gets the
-- same numbers, so a number committed while its answer was lost still reaches the client that
-- asked for it (records are kept a day: maintain()). The key's row is claimed first: a
-- concurrent call with the same key waits on it, then finds the numbers the first one committed
-- (or, if that one rolled back, claims the key itself). Numbers and record commit or roll back
-- together, in the caller's transaction when there is one. Raises invalid_argument (OX003) for
-- a key that is not 1 to 200 characters, or that was used for another scope or count.
CREATE OR REPLACE FUNCTION {{schema}}.take_once(seq_name text, seq_scope text, at timestamptz, how_many integer, key text)
RETURNS TABLE (value bigint, text text, period text, replayed boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  prior {{schema}}.issued;
  claimed integer;
BEGIN
  IF key IS NULL OR length(key) NOT BETWEEN 1 AND 200 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = 'an idempotency key must be a text of 1 to 200 characters';
  END IF;
  INSERT INTO {{schema}}.issued (sequence, idempotency_key, scope, how_many)
  VALUES (seq_name, key, seq_scope, how_many)
  ON CONFLICT DO NOTHING;
  GET DIAGNOSTICS claimed = ROW_COUNT;
  IF claimed = 0 THEN
    SELECT * INTO prior FROM {{schema}}.issued AS i WHERE i.sequence = seq_name AND i.idempotency_key = key;
    IF prior.scope IS DISTINCT FROM seq_scope OR prior.how_many IS DISTINCT FROM how_many THEN
      RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
        'The idempotency key %L was already used on %L for %s value(s) in scope %L: use a new key for another call',
        key, seq_name, prior.how_many, prior.scope);
    END IF;
    RETURN QUERY SELECT u.v, u.t, prior.period, true
      FROM unnest(prior.issued_values, prior.texts) WITH ORDINALITY AS u(v, t, n) ORDER BY u.n;
    RETURN;
  END IF;
  -- Claimed: a sequence that does not exist or is batched fails here, and the claim rolls back.
  UPDATE {{schema}}.issued AS i
     SET issued_values = t.vs, texts = t.ts, period = t.p
    FROM (SELECT array_agg(x.value ORDER BY x.n) AS vs, array_agg(x.text ORDER BY x.n) AS ts, min(x.period) AS p
            FROM {{schema}}.take(seq_name, seq_scope, at, how_many) WITH ORDINALITY AS x(value, text, period, n)) AS t
   WHERE i.sequence = seq_name AND i.idempotency_key = key
  RETURNING i.* INTO prior;
  RETURN QUERY SELECT u.v, u.t, prior.period, false
    FROM unnest(prior.issued_values, prior.texts) WITH ORDINALITY AS u(v, t, n) ORDER BY u.n;
END $$;
