-- An end wakes the lines it may unblock. A lane whose first waiter was last refused by one of its
-- own limits (a tenant's cap) does not hold the line for the others (throttle_queued): pollers may
-- take their free slots, which nobody in line could use. Once a permit of that very limit ends, the
-- waiter may be servable, and until its line is served (at the NOTIFY this end sends) a poller
-- could take the shared slot it needs. So the end marks such a first waiter undecided again (its
-- reason only: its own retry timing stays), and pollers are refused 'queued' until the line has
-- been served. A waiter being served at that moment is skipped (SKIP LOCKED): its service records
-- its own answer, and waiting for it could deadlock with a decision folding this end. Nothing at
-- all is read when no one waits.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_freed_by(permit_ids uuid[]) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM {{schema}}.throttle_waiter_items) THEN
    UPDATE {{schema}}.throttle_waiters AS w SET last_reason = NULL
     WHERE w.id IN (
       SELECT h.id
         FROM (SELECT DISTINCT ON (x.lane) x.id, x.last_name, x.last_key
                 FROM {{schema}}.permits AS p
                 JOIN {{schema}}.throttle_waiter_items AS i ON i.name = p.name AND i.key = p.key
                 JOIN {{schema}}.throttle_waiters AS x ON x.id = i.waiter
                WHERE p.id = ANY (permit_ids) AND x.permit_id IS NULL AND x.alive_until >= clock_timestamp()
                ORDER BY x.lane, x.seq) AS h
         JOIN {{schema}}.permits AS p ON p.id = ANY (permit_ids) AND p.name = h.last_name AND p.key = h.last_key)
       AND w.id IN (SELECT y.id FROM {{schema}}.throttle_waiters AS y WHERE y.id = w.id FOR UPDATE SKIP LOCKED);
    PERFORM {{schema}}.throttle_freed(ARRAY(SELECT DISTINCT p.name FROM {{schema}}.permits AS p WHERE p.id = ANY (permit_ids)));
  END IF;
END $$;
