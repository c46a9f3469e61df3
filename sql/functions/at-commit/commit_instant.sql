-- The instant whose period numbers a committing transaction: the database clock when the commit
-- numbers its first row, the same for every row of that commit, or ordo.commit_at when the
-- transaction set it (SET LOCAL ordo.commit_at = '…' numbers as of another instant, e.g. an
-- import of last year's invoices; invalid_argument, OX003, when it is not a timestamp). Kept in
-- that setting as ISO 8601 in UTC, which reads back as the same instant whatever DateStyle and
-- TimeZone say.
CREATE OR REPLACE FUNCTION {{schema}}.commit_instant() RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  given text := current_setting('ordo.commit_at', true);
  at timestamptz;
BEGIN
  IF given IS NOT NULL AND given <> '' THEN
    BEGIN
      RETURN given::timestamptz;
    EXCEPTION WHEN data_exception THEN
      RAISE EXCEPTION USING ERRCODE = 'OX003',
        MESSAGE = format('ordo.commit_at must be a timestamp with a time zone, such as ''2026-12-31 23:59:59+01'' (got %L)', given);
    END;
  END IF;
  at := clock_timestamp();
  PERFORM set_config('ordo.commit_at', to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), true);
  RETURN at;
END $$;
