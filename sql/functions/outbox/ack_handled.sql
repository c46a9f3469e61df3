-- ack() as this library's consumer sends it: in the transaction handed to the handler, never
-- strict, never releasing the lease. When the handler wrote nothing in that transaction (it has no
-- id yet: any write, row lock or temporary table would have given it one), its commit holds the
-- acknowledgement alone and does not wait for the WAL flush (synchronous_commit off, for this
-- transaction only). Lost in a crash, the partition is as before the acknowledgement and the batch
-- is delivered again: at least once, as for any handler whose effects are not in the transaction;
-- any later commit that waits flushes it first. A transaction the handler wrote in commits as the
-- caller's settings say.
CREATE OR REPLACE FUNCTION {{schema}}.ack_handled(sub_name text, part integer, sub_owner text, at_version bigint,
                                       lease_ms bigint)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF pg_current_xact_id_if_assigned() IS NULL THEN
    PERFORM set_config('synchronous_commit', 'off', true);
  END IF;
  RETURN {{schema}}.ack(sub_name, part, sub_owner, at_version, lease_ms, false, false);
END $$;
