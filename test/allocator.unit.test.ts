// The batched-sequence Allocator and its back-off, against an in-memory `reserve` that behaves
// like the storage sequence (one counter stepping by batch × increment): no database.
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep, setImmediate as tick } from 'node:timers/promises';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { OrdoError } from '../src/errors.js';
import { BACKOFF_BASE_MS, BACKOFF_CAP_MS, backoffDelay } from '../src/db/backoff.js';
import { retryDelay } from '../src/outbox/consumer.js';
import {
  Allocator,
  MAX_RANGES_PER_RESERVATION,
  type Reservation,
  type Reserve,
  TIMEOUT_MESSAGE,
} from '../src/sequences/batched.js';

interface StorageOptions {
  batch: number;
  increment?: number;
  start?: number;
  /** The definition's epoch seen by the n-th reservation (1-based). */
  epoch?: (n: number) => number;
  timeoutMs?: number | null;
  /** Awaited before the range is taken from the counter (a round trip). */
  latency?: () => Promise<unknown>;
}

/** A fake storage sequence: each reservation takes the next blocks, as many as asked, from one counter. */
function storage(o: StorageOptions) {
  const increment = o.increment ?? 1;
  const s = {
    position: o.start ?? 0,
    calls: 0,
    inFlight: 0,
    maxInFlight: 0,
    waits: [] as (number | null)[],
    /** The ranges each reservation asked for. */
    asked: [] as number[],
    handed: [] as Reservation[],
    reserve: (async (_name, waitMs, ranges) => {
      s.calls++;
      s.waits.push(waitMs);
      s.asked.push(ranges);
      s.inFlight++;
      s.maxInFlight = Math.max(s.maxInFlight, s.inFlight);
      try {
        await (o.latency ?? tick)();
        const epoch = o.epoch?.(s.calls) ?? 1;
        return Array.from({ length: ranges }, () => {
          const first = s.position;
          s.position += o.batch * increment;
          const r: Reservation = {
            first,
            last: first + (o.batch - 1) * increment,
            increment,
            epoch,
            timeoutMs: o.timeoutMs === undefined ? null : o.timeoutMs,
          };
          s.handed.push(r);
          return r;
        });
      } finally {
        s.inFlight--;
      }
    }) as Reserve,
  };
  return s;
}

function deferred<T>() {
  let resolve!: (value: T) => void;
  let reject!: (reason: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/** A reserve whose calls wait until the test answers them, one by one (with one range, or several). */
function manual() {
  const pending: {
    waitMs: number | null;
    ranges: number;
    answer: ReturnType<typeof deferred<Reservation | Reservation[]>>;
  }[] = [];
  const reserve: Reserve = (_name, waitMs, ranges) => {
    const answer = deferred<Reservation | Reservation[]>();
    pending.push({ waitMs, ranges, answer });
    return answer.promise.then((r) => (Array.isArray(r) ? r : [r]));
  };
  return { reserve, pending };
}

const range = (first: number, last: number, epoch = 1): Reservation => ({
  first,
  last,
  increment: 1,
  epoch,
  timeoutMs: null,
});

/** Lets every pending microtask and one macrotask run. */
const flush = async () => {
  for (let i = 0; i < 3; i++) await tick();
};

const open = () => false;

/** Settles like `p`, or rejects when `p` is still pending after `ms`: a hang fails fast. */
function within<T>(p: Promise<T>, ms: number): Promise<T> {
  return Promise.race([
    p,
    sleep(ms).then(() => {
      throw new Error(`still pending after ${ms} ms`);
    }),
  ]);
}

/** All the values of the reservations, in order, as the allocator should hand them out. */
function valuesOf(reservations: Reservation[]): number[] {
  const out: number[] = [];
  for (const r of reservations) for (let v = r.first; v <= r.last; v += r.increment) out.push(v);
  return out;
}

function strictlyIncreasing(xs: number[]): boolean {
  return xs.every((x, i) => i === 0 || x > xs[i - 1]!);
}

describe('backoffDelay', () => {
  const cap = (attempt: number) => Math.min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2 ** attempt);

  it('is the injected random fraction of min(1000, 10·2^attempt)', () => {
    expect([BACKOFF_BASE_MS, BACKOFF_CAP_MS]).toEqual([10, 1000]);
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 200 }),
        fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true }),
        (attempt, r) => {
          const d = backoffDelay(attempt, () => r);
          expect(d).toBeGreaterThanOrEqual(0);
          expect(d).toBeLessThanOrEqual(cap(attempt));
          expect(d).toBeCloseTo(r * cap(attempt), 9);
        },
      ),
    );
    // The bound doubles from 10 ms and stops at 1 s.
    expect([0, 1, 2, 6, 7, 30].map((a) => backoffDelay(a, () => 0.999999))).toEqual(
      [10, 20, 40, 640, 1000, 1000].map((c) => c * 0.999999),
    );
  });

  it('stays within [0, min(1000, 10·2^attempt)] with Math.random', () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 200 }), (attempt) => {
        const d = backoffDelay(attempt);
        return d >= 0 && d <= cap(attempt) && Number.isFinite(d);
      }),
      { numRuns: 2000 },
    );
  });

  it('takes other bounds: an outbox retry (retryDelay 100 ms, maxRetryDelay 30 s) doubles from 100 ms to 30 s', () => {
    const top = (attempt: number) => retryDelay(attempt, 100, 30_000);
    const fixed = (attempt: number) => backoffDelay(attempt - 1, () => 0.5, { base: 100, cap: 30_000 });
    expect([1, 2, 3, 9, 10, 40].map(fixed)).toEqual([50, 100, 200, 12_800, 15_000, 15_000]);
    for (const attempt of [1, 5, 12]) {
      const samples = Array.from({ length: 500 }, () => top(attempt));
      const ceiling = Math.min(30_000, 100 * 2 ** (attempt - 1));
      expect(Math.max(...samples)).toBeLessThanOrEqual(ceiling);
      expect(Math.min(...samples)).toBeGreaterThanOrEqual(0);
      expect(Math.max(...samples)).toBeGreaterThan(ceiling * 0.9);
    }
  });

  it('is jittered over the whole interval (full jitter), not a fixed step', () => {
    for (const attempt of [3, 12]) {
      const samples = Array.from({ length: 1000 }, () => backoffDelay(attempt));
      const c = cap(attempt);
      expect(new Set(samples).size).toBeGreaterThan(990);
      expect(Math.min(...samples)).toBeLessThan(c * 0.05);
      expect(Math.max(...samples)).toBeGreaterThan(c * 0.95);
      const mean = samples.reduce((a, b) => a + b, 0) / samples.length;
      expect(mean).toBeGreaterThan(c * 0.4);
      expect(mean).toBeLessThan(c * 0.6);
    }
  });
});

describe('Allocator', () => {
  it('keeps one reservation in flight even with 1000 concurrent handOut() calls', async () => {
    const s = storage({ batch: 7, latency: () => sleep(1) });
    const a = new Allocator('ids', s.reserve, null, open);
    const resolved: number[] = [];
    await Promise.all(Array.from({ length: 1000 }, () => a.handOut().then((v) => resolved.push(v))));
    expect(s.maxInFlight).toBe(1);
    expect(resolved).toHaveLength(1000);
    expect(new Set(resolved).size).toBe(1000);
    // Nothing skipped: the first 1000 values of the ranges, in the order they were handed out.
    expect(resolved).toEqual(valuesOf(s.handed).slice(0, 1000));
    // ⌈1000 / 7⌉ = 143 ranges used. While callers wait, each reservation asks for twice as many
    // as the one before, from one (the cold start) up to the maximum.
    expect(s.asked).toEqual([1, 2, 4, 8, 16, 32, 64, 64, 64].slice(0, s.asked.length));
    expect(s.handed.length).toBeGreaterThanOrEqual(143);
    expect(s.handed.length - 143).toBeLessThan(s.asked.at(-1)!);
  });

  it('property: values are unique, increasing, and exactly the ranges in order, whatever the batch, increment and concurrency', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 1, max: 20 }),
        fc.integer({ min: 1, max: 5 }),
        fc.integer({ min: -50, max: 50 }),
        fc.array(fc.integer({ min: 1, max: 30 }), { minLength: 1, maxLength: 12 }),
        fc.boolean(),
        async (batch, increment, start, groups, slow) => {
          const s = storage({ batch, increment, start, latency: slow ? () => sleep(0) : undefined });
          const a = new Allocator('ids', s.reserve, null, open);
          const resolved: number[] = [];
          for (const size of groups) {
            // `size` callers at once, as ordo.nextval() does: memory first, then wait.
            await Promise.all(
              Array.from({ length: size }, async () => {
                resolved.push(a.handOutNow() ?? (await a.handOut()));
              }),
            );
          }
          const total = groups.reduce((x, y) => x + y, 0);
          expect(s.maxInFlight).toBeLessThanOrEqual(1);
          expect(strictlyIncreasing(resolved)).toBe(true);
          expect(resolved).toEqual(valuesOf(s.handed).slice(0, total));
          // Never more ranges ahead of what is used than the last two reservations brought.
          const ahead = s.handed.length - Math.ceil(total / batch);
          expect(ahead).toBeLessThanOrEqual(s.asked.slice(-2).reduce((x, y) => x + y, 0));
          for (const asked of s.asked) expect(asked).toBeLessThanOrEqual(MAX_RANGES_PER_RESERVATION);
        },
      ),
      { numRuns: 150 },
    );
  });

  it('requests the next range as soon as the current one is in use, before it runs out', async () => {
    const s = storage({ batch: 10 });
    const a = new Allocator('ids', s.reserve, null, open);
    expect(await a.handOut()).toBe(0);
    // Nine values still in memory, and the next range already asked for.
    expect(s.calls).toBe(2);
    await flush();
    // The rest of the first range and the whole second one come from memory, synchronously.
    const fromMemory = Array.from({ length: 19 }, () => a.handOutNow());
    expect(fromMemory).toEqual(Array.from({ length: 19 }, (_, i) => i + 1));
    // Starting on the second range asked for the third at once.
    expect(s.calls).toBe(3);
    await flush();
    expect(a.handOutNow()).toBe(20);
    expect(s.calls).toBe(4);
  });

  it('a node drawing steadily never waits for a round trip once started', async () => {
    const s = storage({ batch: 100, latency: () => sleep(1) });
    const a = new Allocator('ids', s.reserve, null, open);
    let waited = 0;
    const values: number[] = [];
    for (let i = 0; i < 1000; i++) {
      let v = a.handOutNow();
      if (v === undefined) {
        waited++;
        v = await a.handOut();
      }
      values.push(v);
      // Slower than the storage: a round trip per 100 values is well within 10 × 1 ms … pauses.
      if (i % 10 === 9) await sleep(2);
    }
    expect(values).toEqual(Array.from({ length: 1000 }, (_, i) => i));
    expect(waited).toBe(1);
  });

  it('a node using ranges faster than a round trip asks for more per reservation until it never waits, and for fewer when it slows', async () => {
    const m = manual();
    const a = new Allocator('ids', m.reserve, null, open);
    let position = 0;
    /** Answers the reservation in flight with the ranges of 10 values it asked for. */
    const answer = () => {
      const call = m.pending.at(-1)!;
      const ranges = Array.from({ length: call.ranges }, () => range(position, (position += 10) - 1));
      call.answer.resolve(ranges);
      return flush();
    };
    const first = a.handOut();
    await answer();
    expect(await first).toBe(0);
    /** Takes `n` values during one round trip; returns how many found nothing in memory. */
    const roundTrip = async (n: number) => {
      let missed = 0;
      for (let i = 0; i < n; i++) if (a.handOutNow() === undefined) missed++;
      const waiting = missed > 0 ? a.handOut() : undefined; // a caller that found nothing waits
      await answer();
      await waiting;
      return missed;
    };
    // 50 values per round trip: five ranges. The asks double while callers wait, then settle
    // at about twice what was used during a round trip, and nobody waits any more.
    const missed: number[] = [];
    for (let i = 0; i < 8; i++) missed.push(await roundTrip(50));
    expect(missed.slice(-3)).toEqual([0, 0, 0]);
    const settled = m.pending.slice(-3).map((p) => p.ranges);
    for (const ranges of settled) expect(ranges).toBeGreaterThanOrEqual(5);
    expect(Math.max(...m.pending.map((p) => p.ranges))).toBeLessThanOrEqual(16);
    // Slower than one range per round trip: back to one range at a time.
    for (let i = 0; i < 40; i++) await roundTrip(m.pending.at(-1) === undefined ? 0 : 5);
    expect(m.pending.at(-1)!.ranges).toBe(1);
  });

  it('never asks for more than MAX_RANGES_PER_RESERVATION, however fast the node', async () => {
    const s = storage({ batch: 1 });
    const a = new Allocator('ids', s.reserve, null, open);
    for (let i = 0; i < 5000; i++) if (a.handOutNow() === undefined) await a.handOut();
    expect(Math.max(...s.asked)).toBe(MAX_RANGES_PER_RESERVATION);
    expect(s.maxInFlight).toBe(1);
  });

  it('release() returns the unused values that end the last range: the ranges ahead that adjoin it and the rest of the one in use', async () => {
    const m = manual();
    const a = new Allocator('ids', m.reserve, null, open);
    const first = a.handOut();
    m.pending[0]!.answer.resolve(range(0, 9));
    expect(await first).toBe(0);
    // The prefetch comes back with three adjoining ranges, as a reservation of three would.
    m.pending[1]!.answer.resolve([range(10, 19), range(20, 29), range(30, 39)]);
    await flush();
    expect(a.held()).toEqual({
      current: { first: 0, next: 1, last: 9 },
      ahead: [
        { first: 10, last: 19 },
        { first: 20, last: 29 },
        { first: 30, last: 39 },
      ],
    });
    expect(a.release()).toEqual({ from: 1, lastFirst: 30, epoch: 1 });
    expect(a.held()).toEqual({ current: undefined, ahead: [] });
  });

  it('release() stops at a gap between ranges held: another node reserved between them', async () => {
    const m = manual();
    const a = new Allocator('ids', m.reserve, null, open);
    const first = a.handOut();
    m.pending[0]!.answer.resolve([range(0, 9), range(20, 29), range(30, 39)]);
    expect(await first).toBe(0);
    expect(a.release()).toEqual({ from: 20, lastFirst: 30, epoch: 1 });
  });

  it('release() after the range in use ran out, nothing ahead: nothing to give back', async () => {
    const m = manual();
    const a = new Allocator('ids', m.reserve, null, open);
    const first = a.handOut();
    m.pending[0]!.answer.resolve(range(0, 0));
    expect(await first).toBe(0);
    expect(a.release()).toBeUndefined();
  });

  it('drop() during a reservation discards that reservation’s range: a gap, never a reuse', async () => {
    const m = manual();
    const a = new Allocator('ids', m.reserve, null, open);
    const first = a.handOut();
    expect(m.pending).toHaveLength(1);
    a.drop();
    m.pending[0]!.answer.resolve(range(0, 9));
    await flush();
    // The caller still waits: the range reserved before drop() is not installed.
    expect(m.pending).toHaveLength(2);
    m.pending[1]!.answer.resolve(range(10, 19));
    expect(await first).toBe(10);
    const later = [a.handOutNow(), a.handOutNow(), a.handOutNow()];
    expect(later).toEqual([11, 12, 13]);
    for (let i = 0; i < 6; i++) expect(a.handOutNow()).toBeGreaterThanOrEqual(14);
  });

  it('retire(e): a reservation in flight that comes back from definition e is kept; one from before e is a gap', async () => {
    const m = manual();
    const a = new Allocator('ids', m.reserve, null, open);
    const first = a.handOut();
    m.pending[0]!.answer.resolve(range(0, 0, 1));
    expect(await first).toBe(0); // the prefetch is in flight
    // Redefined (epoch 2) while the prefetch waited behind the redefinition's lock: it took
    // the first range of the new definition, which must be served, not thrown away.
    a.retire(2, null);
    expect(a.heldEpoch).toBeUndefined();
    m.pending[1]!.answer.resolve(range(500, 500, 2));
    expect(await a.handOut()).toBe(500);
    // Epoch 3; the prefetch in flight comes back from epoch 2: a gap.
    a.retire(3, 250);
    m.pending[2]!.answer.resolve(range(501, 501, 2));
    const next = a.handOut();
    await flush();
    expect(m.pending).toHaveLength(4);
    expect(m.pending[3]!.waitMs).toBe(250); // the new definition's timeout
    m.pending[3]!.answer.resolve(range(900, 900, 3));
    expect(await next).toBe(900);
  });

  it('retire(e) with the epoch already held keeps the ranges (the echo of this node’s own redefinition)', async () => {
    const s = storage({ batch: 10, epoch: () => 4 });
    const a = new Allocator('ids', s.reserve, null, open);
    expect(await a.handOut()).toBe(0);
    a.retire(4, null);
    a.retire(3, null);
    expect([a.handOutNow(), a.handOutNow()]).toEqual([1, 2]);
    a.retire(5, null);
    expect(a.handOutNow()).toBeUndefined();
  });

  it('drop() discards the range in use and the spare: the next value comes from a new reservation', async () => {
    const s = storage({ batch: 10 });
    const a = new Allocator('ids', s.reserve, null, open);
    expect(await a.handOut()).toBe(0);
    await flush(); // spare [10..19] held
    expect(s.calls).toBe(2);
    a.drop();
    expect(a.handOutNow()).toBeUndefined();
    expect(a.heldEpoch).toBeUndefined();
    expect(await a.handOut()).toBe(20);
    expect(s.calls).toBe(4);
  });

  it('a reservation with another epoch discards the ranges held (redefined, notification not seen)', async () => {
    const m = manual();
    const a = new Allocator('ids', m.reserve, null, open);
    const first = a.handOut();
    m.pending[0]!.answer.resolve(range(0, 9, 1));
    expect(await first).toBe(0);
    expect(a.heldEpoch).toBe(1);
    // The prefetch comes back from a redefined sequence.
    expect(m.pending).toHaveLength(2);
    m.pending[1]!.answer.resolve(range(5000, 5009, 2));
    await flush();
    expect(a.heldEpoch).toBe(2);
    // 1..9 of the old epoch are never served.
    expect(a.handOutNow()).toBe(5000);
    expect(a.handOutNow()).toBe(5001);
  });

  it('after a newer epoch arrives, nothing of the older epoch is served, even the range in use', async () => {
    const m = manual();
    const a = new Allocator('ids', m.reserve, null, open);
    const first = a.handOut();
    m.pending[0]!.answer.resolve(range(0, 2, 1));
    expect(await first).toBe(0);
    m.pending[1]!.answer.resolve(range(3, 5, 1));
    await flush();
    expect([a.handOutNow(), a.handOutNow(), a.handOutNow()]).toEqual([1, 2, 3]);
    // Installing [3..5] asked for the next range, which comes back redefined.
    expect(m.pending).toHaveLength(3);
    m.pending[2]!.answer.resolve(range(900, 902, 2));
    await flush();
    expect(a.handOutNow()).toBe(900);
    expect(a.heldEpoch).toBe(2);
  });

  for (const code of ['timeout', 'database_unavailable', 'database_error'] as const) {
    it(`retries '${code}' until the timeout, then rejects with 'timeout' and the SurrealDB message`, async () => {
      let calls = 0;
      const waits: (number | null)[] = [];
      const last = { error: undefined as OrdoError | undefined };
      const reserve: Reserve = async (_name, waitMs) => {
        calls++;
        waits.push(waitMs);
        last.error = new OrdoError(code, `failure ${calls}`);
        throw last.error;
      };
      const a = new Allocator('ids', reserve, 150, open);
      const began = performance.now();
      const error = await within(a.handOut(), 2000).then(
        () => undefined,
        (e: unknown) => e,
      );
      const took = performance.now() - began;
      expect(error).toBeInstanceOf(OrdoError);
      // SurrealDB 3's message: the timeout follows it.
      expect(error).toMatchObject({ code: 'timeout', message: `${TIMEOUT_MESSAGE}: 150ms` });
      expect((error as OrdoError).cause).toBe(last.error);
      expect(TIMEOUT_MESSAGE).toBe('The query was not executed because it exceeded the timeout');
      expect(calls).toBeGreaterThan(1);
      expect(took).toBeGreaterThanOrEqual(145);
      expect(took).toBeLessThan(150 + 350);
      // Each attempt may wait only for what is left of the timeout.
      expect(waits[0]).toBeLessThanOrEqual(150);
      for (const w of waits) expect(w).toBeGreaterThan(0);
      for (let i = 1; i < waits.length; i++) expect(waits[i]!).toBeLessThanOrEqual(waits[i - 1]!);
    });
  }

  it('a retried reservation that succeeds in time serves its range', async () => {
    let calls = 0;
    const reserve: Reserve = async () => {
      calls++;
      if (calls <= 3) throw new OrdoError('database_unavailable', 'down');
      return [range(100, 109)];
    };
    const a = new Allocator('ids', reserve, 5000, open);
    expect(await within(a.handOut(), 2000)).toBe(100);
    expect(calls).toBeGreaterThanOrEqual(4);
  });

  it('with no timeout, waitMs is null and retries go on until success', async () => {
    const waits: (number | null)[] = [];
    const reserve: Reserve = async (_name, waitMs) => {
      waits.push(waitMs);
      if (waits.length <= 4) throw new OrdoError('timeout', 'lock');
      return [range(0, 9)];
    };
    const a = new Allocator('ids', reserve, null, open);
    expect(await a.handOut()).toBe(0);
    expect(waits.slice(0, 5)).toEqual([null, null, null, null, null]);
  });

  for (const [label, failure] of [
    ['sequence_not_found', new OrdoError('sequence_not_found', "The sequence 'ids' does not exist")],
    ['sequence_exhausted', new OrdoError('sequence_exhausted', 'exhausted')],
    ['invalid_argument', new OrdoError('invalid_argument', 'not batched')],
    ['a plain Error', new Error('boom')],
  ] as const) {
    it(`does not retry ${label}: every waiting caller rejects at once with it`, async () => {
      let calls = 0;
      const reserve: Reserve = async () => {
        calls++;
        await tick();
        throw failure;
      };
      const a = new Allocator('ids', reserve, null, open);
      const began = performance.now();
      const settled = await within(Promise.allSettled(Array.from({ length: 1000 }, () => a.handOut())), 2000);
      expect(performance.now() - began).toBeLessThan(200);
      expect(calls).toBe(1);
      for (const r of settled) {
        expect(r.status).toBe('rejected');
        expect((r as PromiseRejectedResult).reason).toBe(failure);
      }
    });
  }

  it('recovers after a failed reservation: the next handOut() reserves again', async () => {
    let calls = 0;
    const reserve: Reserve = async () => {
      calls++;
      if (calls === 1) throw new OrdoError('sequence_not_found', 'gone');
      return [range(0, 4)];
    };
    const a = new Allocator('ids', reserve, null, open);
    await expect(a.handOut()).rejects.toMatchObject({ code: 'sequence_not_found' });
    expect(await a.handOut()).toBe(0);
  });

  it('a failed prefetch is not an unhandled rejection, and the caller who needs it reserves again', async () => {
    let calls = 0;
    const reserve: Reserve = async () => {
      calls++;
      await tick();
      if (calls === 2) throw new OrdoError('sequence_exhausted', 'no more');
      return [range((calls - 1) * 5, (calls - 1) * 5 + 4)];
    };
    const a = new Allocator('ids', reserve, null, open);
    expect(await a.handOut()).toBe(0);
    await flush(); // the prefetch (call 2) failed
    expect(calls).toBe(2);
    for (let i = 1; i < 5; i++) expect(a.handOutNow()).toBe(i);
    // Taking from memory tried the prefetch again; either way the next range comes.
    expect(await a.handOut()).toBe(10);
    expect(calls).toBe(4);
  });

  it('timeout 0 rejects with timeout without calling reserve', async () => {
    let calls = 0;
    const reserve: Reserve = async () => {
      calls++;
      return [range(0, 9)];
    };
    const a = new Allocator('ids', reserve, 0, open);
    await expect(a.handOut()).rejects.toMatchObject({ code: 'timeout', message: `${TIMEOUT_MESSAGE}: 0ns` });
    await expect(a.handOut()).rejects.toMatchObject({ code: 'timeout' });
    expect(calls).toBe(0);
  });

  it('a TIMEOUT changed by a reservation (ALTER SEQUENCE … TIMEOUT) applies to the next reservation', async () => {
    const s = storage({ batch: 5, timeoutMs: 0 });
    const a = new Allocator('ids', s.reserve, null, open);
    expect(await a.handOut()).toBe(0);
    await flush();
    // The prefetch saw TIMEOUT 0: it fails at once without a round trip.
    expect(s.calls).toBe(1);
    for (let i = 1; i < 5; i++) expect(a.handOutNow()).toBe(i);
    await expect(a.handOut()).rejects.toMatchObject({ code: 'timeout', message: `${TIMEOUT_MESSAGE}: 0ns` });
    expect(s.calls).toBe(1);
  });

  it('stops retrying with closed once the client is closed', async () => {
    let calls = 0;
    let closed = false;
    const reserve: Reserve = async () => {
      calls++;
      if (calls === 3) closed = true;
      throw new OrdoError('database_unavailable', 'down');
    };
    const a = new Allocator('ids', reserve, null, () => closed);
    const began = performance.now();
    await expect(within(a.handOut(), 2000)).rejects.toMatchObject({ code: 'closed' });
    expect(calls).toBe(3);
    // Three back-offs of at most 10, 20 and 40 ms.
    expect(performance.now() - began).toBeLessThan(500);
  });

  it('a closed client never reserves', async () => {
    let calls = 0;
    const reserve: Reserve = async () => {
      calls++;
      return [range(0, 9)];
    };
    const a = new Allocator('ids', reserve, null, () => true);
    await expect(a.handOut()).rejects.toMatchObject({ code: 'closed' });
    expect(calls).toBe(0);
  });

  it('property: drops at random moments never make a value come out twice, and never reuse a dropped range', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 1, max: 8 }),
        fc.array(fc.oneof(fc.constant('drop' as const), fc.integer({ min: 1, max: 12 })), {
          minLength: 1,
          maxLength: 25,
        }),
        async (batch, steps) => {
          const s = storage({ batch, latency: () => sleep(0) });
          const a = new Allocator('ids', s.reserve, null, open);
          const seen: number[] = [];
          let dropsAt: number[] = [];
          const pending: Promise<void>[] = [];
          for (const step of steps) {
            if (step === 'drop') {
              a.drop();
              dropsAt = [...dropsAt, s.handed.length];
              continue;
            }
            for (let i = 0; i < step; i++) pending.push(a.handOut().then((v) => void seen.push(v)));
            if (step % 3 === 0) await Promise.all(pending.splice(0));
          }
          await Promise.all(pending);
          expect(new Set(seen).size).toBe(seen.length);
          expect(s.maxInFlight).toBeLessThanOrEqual(1);
          // Every value comes from a handed-out range.
          const all = new Set(valuesOf(s.handed));
          for (const v of seen) expect(all.has(v)).toBe(true);
        },
      ),
      { numRuns: 100 },
    );
  });
});
