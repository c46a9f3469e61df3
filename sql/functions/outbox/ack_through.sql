-- Moves the partition past the first `handled` messages of the batch received at `at_version`, the
-- last of them at `through_position`, and leaves the rest of the round to the next receive: what a
-- relay sends when a broker confirmed a prefix of a batch and then failed, so that only what it did
-- not confirm is published again. The prefix never ends the round (the rest of the batch is in it).
-- Null, and nothing written, when the caller no longer holds the partition at that version or the
-- prefix is not shorter than the batch (ack() moves past a whole one).
--
-- OX003 invalid_argument: handled below 1.
CREATE OR REPLACE FUNCTION {{schema}}.ack_through(sub_name text, part integer, sub_owner text, at_version bigint,
                                                  through_position bigint, handled integer, lease_ms bigint)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF handled IS NULL OR handled < 1 THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = format('ack_through needs at least one message handled (got %s)', coalesce(handled::text, 'null'));
  END IF;
  UPDATE {{schema}}.subscription_partitions
     SET batch_last = through_position, batch_count = handled, batch_done = false
   WHERE subscription = sub_name AND partition = part AND owner = sub_owner AND version = at_version
     AND batch_last > through_position AND batch_count > handled;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  RETURN {{schema}}.ack(sub_name, part, sub_owner, at_version, lease_ms, false, false);
END $$;
