-- Whether each line of (names[i], keys[i]) has a live waiter that a request not waiting must let go
-- first: a lane whose first live waiter has not been decided yet, or was last refused by this very
-- limit. A lane refused by another of its limits waits for that one, and this limit's free slot
-- goes to whoever can take it: a poller of tenant b is not refused a free slot of the global limit
-- while a waiter of tenant a is blocked by a's own cap, which nobody in line could use. (When a's
-- cap frees, the permit's end marks that waiter undecided again and has its line served:
-- throttle_freed_by.)
CREATE OR REPLACE FUNCTION {{schema}}.throttle_queued(names text[], keys text[]) RETURNS boolean[]
LANGUAGE sql STABLE AS $$
  SELECT array_agg(EXISTS (
           SELECT 1
             FROM (SELECT DISTINCT ON (w.lane) w.last_reason, w.last_name, w.last_key
                     FROM {{schema}}.throttle_waiter_items AS i
                     JOIN {{schema}}.throttle_waiters AS w ON w.id = i.waiter
                    WHERE i.name = x.n AND i.key = x.k AND w.permit_id IS NULL
                      AND w.alive_until >= clock_timestamp()
                    ORDER BY w.lane, w.seq) AS head
            WHERE head.last_reason IS NULL OR (head.last_name = x.n AND head.last_key = x.k))
         ORDER BY x.i)
    FROM unnest(names, keys) WITH ORDINALITY AS x(n, k, i)
$$;
