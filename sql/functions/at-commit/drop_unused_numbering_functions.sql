-- Trigger functions of attachments whose table was dropped (or whose trigger was dropped by
-- hand): no trigger calls them. One another role made stays, for an attach of that role (only
-- its owner may drop it).
CREATE OR REPLACE FUNCTION {{schema}}.drop_unused_numbering_functions() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  f regprocedure;
BEGIN
  FOR f IN SELECT p.oid::regprocedure FROM pg_proc AS p
            WHERE p.pronamespace = '{{schema}}'::regnamespace AND p.proname LIKE 'number\_at\_commit\_%'
              AND NOT EXISTS (SELECT 1 FROM pg_trigger AS t WHERE t.tgfoid = p.oid)
              AND pg_has_role(p.proowner, 'USAGE') LOOP
    EXECUTE format('DROP FUNCTION IF EXISTS %s', f);
  END LOOP;
END $$;
