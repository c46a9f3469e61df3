-- The base a subscription starts from, or is moved to: everything before `first_position` is passed
-- over, and everything from it on is delivered, committed or still to commit (null: from what is
-- appended next). The current cluster is recorded first (current_cluster).
--
-- A base is a position, a snapshot and a bound: the messages it has delivered are those at or below
-- the position whose transaction the snapshot sees committed. The bound is a transaction id taken
-- after the position was read; every message gets its position after its transaction has an id
-- (append_answer), so every message at or below the position has an id below the bound: the
-- transactions the base saw running are those of its xip and the short range from its xmax to its
-- bound. A transaction that had an id already cannot take a later one: its bound is null (every id
-- from the xmax up).
CREATE OR REPLACE FUNCTION {{schema}}.start_base(first_position bigint,
  OUT base_position bigint, OUT base_snapshot pg_snapshot, OUT base_bound xid8)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  had_id boolean := pg_current_xact_id_if_assigned() IS NOT NULL;
BEGIN
  PERFORM {{schema}}.current_cluster();
  base_position := coalesce(first_position - 1, {{schema}}.last_position());
  IF base_position <= 0 THEN
    base_position := 0; base_snapshot := '1:1:'; base_bound := '0';
    RETURN;
  END IF;
  base_bound := CASE WHEN had_id THEN NULL ELSE pg_current_xact_id() END;
  base_snapshot := pg_current_snapshot();
END $$;
