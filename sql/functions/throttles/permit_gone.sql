-- Raises why a permit cannot be ended or extended at clock c: it expired (OX008 permit_expired), or
-- it is unknown or already ended (OX007 permit_not_found). A permit of another incarnation of its
-- throttle (removed, maybe defined again) counts as unknown.
CREATE OR REPLACE FUNCTION {{schema}}.permit_gone(gone_id uuid, c timestamptz) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
  p {{schema}}.permits;
BEGIN
  SELECT * INTO p FROM {{schema}}.permits AS x
   WHERE x.id = gone_id
     AND EXISTS (SELECT 1 FROM {{schema}}.throttles AS d WHERE d.name = x.name AND d.incarnation = x.incarnation);
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'OX007',
      MESSAGE = format('The permit %s does not exist, or it has ended and was cleared', gone_id);
  END IF;
  IF p.outcome = 'expired' OR (p.outcome IS NULL AND p.expires_at <= c) THEN
    RAISE EXCEPTION USING ERRCODE = 'OX008',
      MESSAGE = format('The permit %s expired at %s: its lease ran out before it was completed, failed or extended',
                       gone_id, to_char(p.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'));
  END IF;
  RAISE EXCEPTION USING ERRCODE = 'OX007',
    MESSAGE = format('The permit %s has already ended: it %s at %s', gone_id, p.outcome,
                     to_char(p.ended_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'));
END $$;
