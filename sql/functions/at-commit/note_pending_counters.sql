-- Does nothing. Statement triggers that attachments made by an earlier schema may still have
-- (ordo_note_i_…, ordo_note_u_…, dropped by detach_sequence()) call it; the rows of those
-- attachments are noted by their row trigger (note_pending_row()).
CREATE OR REPLACE FUNCTION {{schema}}.note_pending_counters() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  RETURN NULL;
END $$;
