-- The key after n more grants of `units` in all, at its clock: the last start and the `every`
-- interval's start move to the clock, the bucket's arrival time moves up by the units' emission
-- intervals, and the first lease to run out may come sooner. Live units count permits, so they grow
-- only on a throttle that keeps permits (a throttle redefined with permits later starts from the
-- units of its permits). With n = 0, the key as it is.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_after(k {{schema}}.throttle_key, n bigint, units bigint)
RETURNS {{schema}}.throttle_key
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF n > 0 THEN
    k.last_start := k.c;
    k.every_from := k.c;
    IF k.unit IS NOT NULL THEN
      k.tat := greatest(k.tat, k.c) + k.unit * units;
    END IF;
    k.starts := k.starts + n;
    IF k.lease_ms IS NOT NULL THEN
      k.live := k.live + units;
    END IF;
    k.earliest := least(k.earliest, k.c + k.lease_ms * interval '1 millisecond');
    k.changed := true;
  END IF;
  RETURN k;
END $$;
