-- Many standalone requests in one statement: request i asks for counts[i] values of names[i] for
-- scopes[i] at ats[i] (NULL: now()). Returns each request's values in order, tagged with i.
-- Requests that land on the same counter row share one update, in request order.
--
-- Every lock is taken within a short local lock_timeout (50 ms), so that a batch gives way to a
-- transaction holding one of its locks (the caller then serves those requests one statement
-- each) and can never be what makes a caller's own transaction fail. The sequences' kind locks
-- are taken shared, in one order, before the definitions are read (see take()): a batch gives
-- way to a change of kind as to a held counter. Rows are locked in (sequence, scope, period)
-- order, so two batches never deadlock. The counters' queue is not used: a batch waits on the
-- rows alone. A name that is not a gapless sequence fails the whole batch with OX001, and the
-- caller serves each request alone, which names the exact error; malformed arrays are
-- invalid_argument (OX003).
CREATE OR REPLACE FUNCTION {{schema}}.take_many(names text[], scopes text[], ats timestamptz[], counts integer[])
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
  PERFORM set_config('lock_timeout', '50ms', true);
  PERFORM pg_advisory_xact_lock_shared(hashtext('{{schema_name}}.sequence_kind'), k.key)
    FROM (SELECT DISTINCT hashtext(n) AS key FROM unnest(names) AS n) AS k
   ORDER BY k.key;
  SELECT n INTO missing FROM unnest(names) AS n
    WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.sequences AS d WHERE d.name = n AND d.kind = 'gapless') LIMIT 1;
  IF FOUND THEN
    -- The caller serves each request on its own, which names the exact error.
    RAISE EXCEPTION USING ERRCODE = 'OX001', MESSAGE = format('The sequence %L does not exist or is not gapless', missing);
  END IF;

  RETURN QUERY
  WITH input AS (
    SELECT u.i::integer AS request, u.name, u.scope, u.how_many::bigint AS how_many, d AS def,
           d.start, d.increment, d.max_value, d.reset, d.format, d.year_start,
           coalesce(u.at, now()) AT TIME ZONE d.time_zone AS local_at
    FROM unnest(names, scopes, ats, counts) WITH ORDINALITY AS u(name, scope, at, how_many, i)
    JOIN {{schema}}.sequences AS d ON d.name = u.name
  ), keyed AS (
    -- The text's template (all but the number) is rendered here, before the rows are locked.
    SELECT i.*, {{schema}}.period_start(i.reset, i.year_start, i.local_at) AS p,
           CASE WHEN i.format IS NOT NULL THEN {{schema}}.render_template(i.format, i.scope, i.local_at, i.year_start) END AS template
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
         CASE WHEN pl.template IS NULL THEN v.v::text ELSE {{schema}}.render_fill(pl.template, v.v) END,
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
