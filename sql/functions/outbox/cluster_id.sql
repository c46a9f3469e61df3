-- This cluster, as its system identifier: the same on a physical replica, new after initdb.
CREATE OR REPLACE FUNCTION {{schema}}.cluster_id() RETURNS bigint
LANGUAGE sql STABLE AS $$ SELECT system_identifier FROM pg_control_system() $$;
