-- ordo 0019: a consumer's acknowledgement does not wait for the WAL flush when the handler
-- wrote nothing in its transaction.
--
-- A consumer of this library acknowledges each batch in the transaction it hands the handler,
-- so that what the handler writes through it and the move past the batch commit together (the
-- transaction begins with the handler's first statement; a handler that sends none leaves the
-- acknowledgement to commit by itself). When the handler wrote nothing there (it sent the
-- messages on, called a service, wrote elsewhere), that commit holds nothing but the
-- acknowledgement, and it waited for the WAL flush all the same: 1.3 to 4.5 ms of a
-- 1,000-message batch's 12 to 17 here, on a shared disk. It now does not wait, as receive()'s
-- does not: lost in a crash, the partition is as before the acknowledgement and the batch is
-- delivered again (at least once, as for any handler whose effects are not in the
-- transaction), and any later commit that waits flushes it first. A transaction the handler
-- wrote in has an id before the acknowledgement runs (any write, row lock or temporary table
-- takes one) and commits as the caller's settings say. (A NOTIFY is not a write: it is sent at
-- commit, and after a crash may be sent again with the batch.)
--
-- Custom SQLSTATEs: none new.

-- ack() of 0008 (never strict, never releasing the lease), in the transaction given to the
-- handler; see above.
CREATE FUNCTION {{schema}}.ack_handled(sub_name text, part integer, sub_owner text, at_version bigint,
                                       lease_ms bigint)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF pg_current_xact_id_if_assigned() IS NULL THEN
    PERFORM set_config('synchronous_commit', 'off', true);
  END IF;
  RETURN {{schema}}.ack(sub_name, part, sub_owner, at_version, lease_ms, false, false);
END $$;
