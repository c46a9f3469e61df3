// A message's instant is read as date_part('epoch', created_at), the float8 PostgreSQL computes
// as (float8) microseconds / 1000000.0; instant() must give the Date of the exact microseconds
// cut to the millisecond (as Date cuts the exact milliseconds), never one off at an edge.
import { describe, expect, it } from 'vitest';
import { instant } from '../src/outbox/messages.js';

/** What PostgreSQL sends for `micros` after the epoch: float8out's shortest text, read back. */
const sent = (micros: bigint) => Number(String(Number(micros) / 1e6));
/** The Date of the exact instant: milliseconds cut toward zero, as new Date(exact ms) does. */
const exact = (micros: bigint) => new Date(Number(micros / 1000n));

describe('instant', () => {
  it('is exact at the edges of every millisecond, from 1970 to the year 2200', () => {
    const year = 31_556_952_000_000n;
    let checked = 0;
    for (let y = 0n; y <= 230n; y += 1n) {
      for (const edge of [0n, 1n, 999n, 1000n, 123_456n, 999_999n]) {
        // A pseudo-random second of the year, then the microseconds around a millisecond edge.
        const second = ((y * 7919n + edge * 104_729n) % 31_556_952n) * 1_000_000n;
        const micros = y * year + second + edge;
        expect(instant(sent(micros)).getTime(), `${micros} µs`).toBe(exact(micros).getTime());
        checked++;
      }
    }
    expect(checked).toBe(231 * 6);
  });

  it('is exact for a million random microseconds of this century', () => {
    let seed = 42;
    const random = () => {
      seed = (seed * 1103515245 + 12345) % 2 ** 31;
      return seed;
    };
    const from = 946_684_800_000_000n; // 2000-01-01
    for (let i = 0; i < 1_000_000; i++) {
      const micros = from + BigInt(random()) * 1_468_923n + BigInt(random() % 1_000_000);
      const got = instant(sent(micros)).getTime();
      if (got !== exact(micros).getTime()) expect(got, `${micros} µs`).toBe(exact(micros).getTime());
    }
  });

  it('before 1970, and infinity, as new Date() of the exact milliseconds gives them', () => {
    for (const micros of [-1n, -999n, -1000n, -1001n, -86_400_000_000n - 123_456n]) {
      expect(instant(sent(micros)).getTime(), `${micros} µs`).toBe(exact(micros).getTime());
    }
    expect(Number.isNaN(instant(Infinity).getTime())).toBe(true);
    expect(Number.isNaN(instant(-Infinity).getTime())).toBe(true);
  });
});
