-- Before the first row a commit numbers, when it numbers two counters or more: the advisory locks
-- (class hashtext('<schema>.counters')) of their stripes, noted in ordo.pending_stripes, taken in
-- stripe order; then ordo.counters_locked, so that later rows skip it. Two commits that each
-- number several counters would otherwise lock the counters' rows in the order of their own
-- rows, and could deadlock. A commit of one counter takes none (counters_to_lock()): it waits
-- for nothing but that counter's row, so it closes no cycle of waits, and a lock taken before
-- its first row is numbered would lengthen the time the counter is held.
--
-- The IF asks settings only: plpgsql runs an IF whose condition holds a subquery as a query,
-- planned and started every time. Counters noted in ordo.pending_counters, by an earlier
-- schema's note trigger in a transaction in flight while the schema was upgraded, take the
-- locking path whatever their number: one stripe locked for one counter is harmless.
CREATE OR REPLACE FUNCTION {{schema}}.lock_pending_counters() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF current_setting('ordo.pending_many', true) = 'yes' OR current_setting('ordo.pending_counters', true) <> '' THEN
    PERFORM pg_advisory_xact_lock(hashtext('{{schema_name}}.counters'), s.stripe)
      FROM (SELECT x::integer AS stripe
              FROM unnest(string_to_array(trim(BOTH ',' FROM coalesce(current_setting('ordo.pending_stripes', true), '')), ',')) AS x
             WHERE x <> ''
            UNION
            SELECT {{schema}}.counter_stripe(split_part(k, chr(31), 1), split_part(k, chr(31), 2))
              FROM unnest(string_to_array(nullif(current_setting('ordo.pending_counters', true), ''), chr(30))) AS k) AS s
     ORDER BY s.stripe;
  END IF;
  PERFORM set_config('ordo.counters_locked', 'yes', true);
END $$;
