-- Returns tz, or raises invalid_argument (OX003) unless tz is a zone name of PostgreSQL's IANA
-- database (which has legacy fixed-offset zones such as 'EST' too). POSIX offsets ('UTC+3', whose
-- sign is inverted from what most people expect) and abbreviations outside that list are refused.
CREATE OR REPLACE FUNCTION {{schema}}.check_time_zone(tz text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
  IF tz IS NULL OR NOT EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = tz) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = format('Unknown time zone %L: use an IANA name such as ''Europe/Paris'' or ''UTC''', tz);
  END IF;
  RETURN tz;
END $$;
