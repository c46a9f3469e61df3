-- Whether one item of `cost` may start on key k as it stands (reason null), else how long to wait
-- and why:
-- * refused from a snapshot (throttle_glance): that answer;
-- * a cost above the key's limits: OX003 invalid_argument for a request that does not wait
--   (line_first); otherwise a wait of a second: a waiter whose key's limit was lowered below its
--   cost since it came waits on rather than failing everyone else's line, and a look from a
--   snapshot (throttle_glance) leaves the error to the decision under the lock;
-- * a pause, `every`, the bucket and the concurrency limit each give a wait, and the longest names
--   the reason; a concurrency refusal cannot know when a permit will end, so its wait is the first
--   lease to run out, at most 100 ms;
-- * free, but others wait in its line (queued): 'queued', so that the line is served first.
--
-- Grants only tighten a key (a pause does not move, `every` counts from the last start, the
-- bucket's arrival time and the live units only grow): acquire_all and throttle_glance rely on it.
CREATE OR REPLACE FUNCTION {{schema}}.throttle_item(k {{schema}}.throttle_key, cost integer, queued boolean,
                                         line_first boolean, OUT wait interval, OUT reason text)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  w interval;
BEGIN
  IF k.reason IS NOT NULL THEN
    wait := k.wait; reason := k.reason;
  ELSIF cost > least(k.concurrency, k.rate_limit) AND line_first THEN
    RAISE EXCEPTION USING ERRCODE = 'OX003',
      MESSAGE = format('A cost of %s can never be granted by the throttle %L for the key %L: its limit is %s',
                       cost, k.name, k.key, least(k.concurrency, k.rate_limit));
  ELSIF cost > least(k.concurrency, k.rate_limit) THEN
    wait := interval '1 second'; reason := CASE WHEN cost > k.concurrency THEN 'concurrency' ELSE 'rate' END;
  ELSE
    wait := interval '0';
    w := greatest(k.paused_until, k.throttle_paused) - k.c;
    IF w > wait THEN
      wait := w; reason := 'paused';
    END IF;
    IF k.every_ms IS NOT NULL AND k.every_from IS NOT NULL THEN
      w := k.every_from + k.every_ms * interval '1 millisecond' - k.c;
      IF w > wait THEN
        wait := w; reason := 'every';
      END IF;
    END IF;
    IF k.unit IS NOT NULL THEN
      w := greatest(k.tat, k.c) + k.unit * cost - k.unit * k.rate_limit - k.c;
      IF w > wait THEN
        wait := w; reason := 'rate';
      END IF;
    END IF;
    IF k.concurrency IS NOT NULL AND k.live + cost > k.concurrency THEN
      w := least(k.earliest - k.c, interval '100 milliseconds');
      IF reason IS NULL OR w > wait THEN
        wait := greatest(w, wait); reason := 'concurrency';
      END IF;
    END IF;
    IF reason IS NULL AND queued THEN
      wait := interval '50 milliseconds'; reason := 'queued';
    END IF;
  END IF;
END $$;
