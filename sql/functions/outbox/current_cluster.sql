-- The cluster this database runs in now (cluster_id()), recorded first, with the first position
-- appended in it, if it is new. Transaction ids mean nothing across clusters: restored into a new
-- cluster, the messages keep their positions but carry ids of the old one. Messages below the first
-- position of a base's cluster were committed before it began, and are judged by position alone.
--
-- Recording takes a SHARE lock on messages, so that no append is in flight and every message below
-- the new first position is committed. While it waits for that lock, new appends queue behind it:
-- so only one session waits (the advisory lock ordo_cluster, tried, not waited for), and briefly
-- (lock_timeout 100 ms, for the LOCK only). The others, and a wait that times out, get
-- 55P03 lock_not_available at once and retry shortly.
CREATE OR REPLACE FUNCTION {{schema}}.current_cluster(OUT cluster bigint, OUT first_position bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
  here bigint := {{schema}}.cluster_id();
  lock_wait text;
BEGIN
  SELECT c.cluster, c.first_position INTO cluster, first_position FROM {{schema}}.clusters c WHERE c.cluster = here;
  IF FOUND THEN
    RETURN;
  END IF;
  IF NOT pg_try_advisory_xact_lock(hashtext('ordo_cluster.{{schema_name}}'), 0) THEN
    RAISE EXCEPTION USING ERRCODE = '55P03', MESSAGE =
      'ordo is recording the new PostgreSQL cluster this database runs in (after a restore or a failover) in another session; retry shortly';
  END IF;
  -- Recorded by the session that held the lock before.
  SELECT c.cluster, c.first_position INTO cluster, first_position FROM {{schema}}.clusters c WHERE c.cluster = here;
  IF FOUND THEN
    RETURN;
  END IF;
  lock_wait := current_setting('lock_timeout');
  PERFORM set_config('lock_timeout', '100ms', true);
  BEGIN
    LOCK TABLE {{schema}}.messages IN SHARE MODE;
  EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION USING ERRCODE = '55P03', MESSAGE =
      'ordo records the new PostgreSQL cluster this database runs in (after a restore or a failover) once no append is in flight, and a transaction that appended is still open; retry shortly';
  END;
  PERFORM set_config('lock_timeout', lock_wait, true);
  INSERT INTO {{schema}}.clusters AS c (cluster, first_position)
  VALUES (here, {{schema}}.last_position() + 1)
  ON CONFLICT (cluster) DO NOTHING;
  SELECT c.cluster, c.first_position INTO cluster, first_position FROM {{schema}}.clusters c WHERE c.cluster = here;
END $$;
