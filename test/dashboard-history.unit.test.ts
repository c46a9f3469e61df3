// The dashboard's rates: per second from readings of running totals, and a sparkline's series.
import { describe, expect, it } from 'vitest';
import { RateHistory } from '../src/server/dashboard-history.js';

const totals = (entries: Record<string, number>) => new Map(Object.entries(entries));

describe('RateHistory', () => {
  it('a rate needs two readings; it is the difference over the time between them', () => {
    const h = new RateHistory(60_000);
    expect(h.rate('a', 10_000)).toBeNull();
    h.record(1_000, totals({ a: 10 }));
    expect(h.rate('a', 10_000)).toBeNull();
    h.record(3_000, totals({ a: 30 }));
    expect(h.rate('a', 10_000)).toBe(10);
    h.record(5_000, totals({ a: 30 }));
    // Over the last 10 s: from the first reading (20 in 4 s); over the last 2 s: none taken.
    expect(h.rate('a', 10_000)).toBe(5);
    expect(h.rate('a', 2_000)).toBe(0);
  });

  it('readings closer than minGapMs are not kept; those older than the window are forgotten', () => {
    const h = new RateHistory(10_000, 1_000);
    h.record(0, totals({ a: 0 }));
    h.record(500, totals({ a: 1_000 }));
    h.record(1_000, totals({ a: 10 }));
    expect(h.rate('a', 60_000)).toBe(10);
    h.record(20_000, totals({ a: 200 }));
    // Both earlier readings left the window: one reading, no rate.
    expect(h.rate('a', 60_000)).toBeNull();
  });

  it('an unknown key, a key that appeared, and a total that went down have no rate', () => {
    const h = new RateHistory(60_000);
    h.record(0, totals({ a: 5 }));
    h.record(1_000, totals({ a: 2, b: 7 }));
    expect(h.rate('a', 10_000)).toBeNull();
    expect(h.rate('b', 10_000)).toBeNull();
    expect(h.rate('c', 10_000)).toBeNull();
  });

  it('series: evenly spaced rates over the window, null where nobody read', () => {
    const h = new RateHistory(10_000);
    expect(h.series('a', 5)).toEqual([null, null, null, null, null]);
    // Readings every second from 0 to 10 s, +2 a second, but none between 4 and 8 s.
    for (const t of [0, 1, 2, 3, 4, 8, 9, 10]) h.record(t * 1_000, totals({ a: t * 2 }));
    // Five buckets of 2 s ending at 10 s: [0,2] [2,4] [4,6] [6,8] [8,10].
    expect(h.series('a', 5)).toEqual([2, 2, null, 2, 2]);
    expect(h.series('b', 2)).toEqual([null, null]);
  });
});
