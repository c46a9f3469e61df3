-- The locks of transactions that appended to a topic and are still open (append_answer() takes the
-- topic's shared advisory lock ordo_outbox_open until its transaction ends): their messages are the
-- only ones the topic waits for. An advisory lock on two int4 keys shows in pg_locks as classid and
-- objid (the keys read as unsigned) with objsubid 2.
CREATE OR REPLACE FUNCTION {{schema}}.appender_locks(msg_topic text) RETURNS SETOF pg_locks
LANGUAGE sql STABLE AS $$
  SELECT l.* FROM pg_locks l
   WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
     AND l.classid = ((hashtext('ordo_outbox_open.{{schema_name}}')::bigint + 4294967296) % 4294967296)::oid
     AND l.objid = ((hashtext(msg_topic)::bigint + 4294967296) % 4294967296)::oid
$$;
