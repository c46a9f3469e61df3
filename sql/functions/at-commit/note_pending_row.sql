-- The counters a transaction will number at commit, noted as its rows are written, by a row
-- trigger BEFORE INSERT or UPDATE (create_note_trigger(); a row trigger is copied to every
-- partition, those attached later too). Arguments: sequence, column, scope column ('' for none).
-- The counter noted last is in ordo.pending_last, and the INSERT trigger's WHEN clause skips
-- rows of that counter, so a run of rows of one counter calls this once. From the second counter
-- on, the commit needs its stripes locked (lock_pending_counters()): the stripes of all of them,
-- the first one's too, are noted in ordo.pending_stripes, read as ',3,17,' (every stripe between
-- commas, so that a search for ',17,' finds exactly that one), and ordo.pending_many = 'yes'.
-- The first counter costs one setting. Idempotent: a row of a counter noted already notes
-- nothing new.
CREATE OR REPLACE FUNCTION {{schema}}.note_pending_row() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  last text := coalesce(current_setting('ordo.pending_last', true), '');
  scope text := '';
  counter text;
  pending text;
  stripe text;
BEGIN
  IF TG_ARGV[2] <> '' THEN
    EXECUTE format('SELECT coalesce(($1).%I::text, '''')', TG_ARGV[2]) INTO scope USING NEW;
  END IF;
  counter := TG_ARGV[0] || chr(31) || scope;
  IF counter = last THEN
    RETURN NEW;
  END IF;
  IF last <> '' THEN
    -- Another counter than the last noted: this commit numbers two or more, and locks the
    -- stripes of all of them, the first one's too.
    pending := coalesce(current_setting('ordo.pending_stripes', true), '');
    IF pending = '' THEN
      pending := ',' || {{schema}}.counter_stripe(split_part(last, chr(31), 1), split_part(last, chr(31), 2)) || ',';
    END IF;
    stripe := {{schema}}.counter_stripe(TG_ARGV[0], scope)::text;
    IF strpos(pending, ',' || stripe || ',') = 0 THEN
      pending := pending || stripe || ',';
    END IF;
    PERFORM set_config('ordo.pending_stripes', pending, true);
    PERFORM set_config('ordo.pending_many', 'yes', true);
  END IF;
  PERFORM set_config('ordo.pending_last', counter, true);
  RETURN NEW;
END $$;
