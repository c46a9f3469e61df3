/**
 * Rates from running totals (values taken, messages delivered, refusals): the database and the
 * client count totals, and a rate is the difference between two readings over the time between
 * them. The dashboard records a reading each time it is read (at most once per `minGapMs`), so
 * nothing is read while nobody looks, and a page opened later still sees the last minutes.
 */
export class RateHistory {
  private readonly samples: { at: number; totals: ReadonlyMap<string, number> }[] = [];

  constructor(
    /** How far back readings are kept: the span of a sparkline. */
    readonly windowMs: number,
    /** Readings closer together than this are not kept (several viewers read at once). */
    private readonly minGapMs = 1_000,
  ) {}

  /** Keeps a reading taken at `at` (ms) of every total by key, and forgets what left the window. */
  record(at: number, totals: ReadonlyMap<string, number>): void {
    const last = this.samples.at(-1);
    if (last && at - last.at < this.minGapMs) return;
    this.samples.push({ at, totals });
    while (this.samples.length > 0 && this.samples[0]!.at < at - this.windowMs) this.samples.shift();
  }

  /**
   * Per second over about the last `overMs`: from the oldest reading within it to the latest.
   * Null without two readings of the key, or when its total went down (removed and made again).
   */
  rate(key: string, overMs: number): number | null {
    const last = this.samples.at(-1);
    if (!last) return null;
    const first = this.samples.find((s) => s.at >= last.at - overMs && s !== last);
    return first ? perSecond(first, last, key) : null;
  }

  /**
   * `points` rates evenly spaced over the window, the last ending at the latest reading: each
   * one from the last reading at or before its start to the last at or before its end. Null
   * where no reading was taken (nobody was looking) or the key was not there.
   */
  series(key: string, points: number): (number | null)[] {
    const out: (number | null)[] = [];
    const last = this.samples.at(-1);
    if (!last) return Array.from({ length: points }, () => null);
    const step = this.windowMs / points;
    const start = last.at - this.windowMs;
    let i = -1; // index of the last reading at or before the current boundary
    const upTo = (t: number) => {
      while (i + 1 < this.samples.length && this.samples[i + 1]!.at <= t) i++;
      return i < 0 ? undefined : this.samples[i];
    };
    let before = upTo(start);
    for (let p = 1; p <= points; p++) {
      // The last boundary is the latest reading itself (a sum of steps may fall just short of it).
      const end = upTo(p === points ? last.at : start + p * step);
      out.push(before && end && end !== before ? perSecond(before, end, key) : null);
      before = end;
    }
    return out;
  }
}

function perSecond(
  from: { at: number; totals: ReadonlyMap<string, number> },
  to: { at: number; totals: ReadonlyMap<string, number> },
  key: string,
): number | null {
  const a = from.totals.get(key);
  const b = to.totals.get(key);
  if (a === undefined || b === undefined || b < a || to.at <= from.at) return null;
  return ((b - a) * 1000) / (to.at - from.at);
}
