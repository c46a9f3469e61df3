-- The i-th value after `prev` (prev NULL: nothing issued yet in this period, so the first value
-- is `start`). Closed form, so one statement can take any number of values. Past the maximum, a
-- cycling sequence wraps to min_value; any other is exhausted (OX002).
CREATE OR REPLACE FUNCTION {{schema}}.value_after(s {{schema}}.sequences, prev bigint, i bigint) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  room bigint;
BEGIN
  IF prev IS NULL THEN
    IF i = 1 THEN
      RETURN s.start;
    END IF;
    prev := s.start;
    i := i - 1;
  END IF;
  room := greatest(0, (s.max_value - prev) / s.increment);
  IF i <= room THEN
    RETURN prev + i * s.increment;
  END IF;
  IF NOT s.cycle THEN
    RAISE EXCEPTION USING ERRCODE = 'OX002',
      MESSAGE = format('The sequence %L is exhausted: it cannot go past its maximum value %s', s.name, s.max_value),
      HINT = 'Raise maxValue, or define the sequence with cycle: true to wrap around.';
  END IF;
  RETURN s.min_value + ((i - room - 1) % ((s.max_value - s.min_value) / s.increment + 1)) * s.increment;
END $$;
