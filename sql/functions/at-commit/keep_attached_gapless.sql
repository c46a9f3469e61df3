-- The trigger keep_attached_gapless on the sequences table (a change of kind from gapless): a
-- sequence that numbers a table at commit stays gapless, as every commit writing the table would
-- fail otherwise. Raises invalid_argument (OX003). On the table, so that every way of redefining
-- it is covered; the row is locked by then (define_sequence() takes it FOR UPDATE first), after
-- any attach in flight.
CREATE OR REPLACE FUNCTION {{schema}}.keep_attached_gapless() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  used text;
BEGIN
  SELECT string_agg(format('%s(%I)', a.table_name, a.column_name), ', ') INTO used
    FROM {{schema}}.attachments AS a WHERE a.sequence = OLD.name;
  IF used IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003', MESSAGE = format(
      'The sequence %L numbers %s at commit: it cannot become %s; detach it first (ordo.sequences.detach)',
      OLD.name, used, NEW.kind);
  END IF;
  RETURN NEW;
END $$;
