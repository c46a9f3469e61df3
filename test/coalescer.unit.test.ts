import { describe, expect, it } from 'vitest';
import { OrdoError } from '../src/errors.js';
import { Coalescer, type Issued } from '../src/sequences/coalescer.js';

interface Call {
  name: string;
  scope: string;
  at: string | null;
  count: number;
}

interface Gate {
  call: Call;
  open(): void;
  fail(error: unknown): void;
}

/**
 * An in-memory gapless counter with the same contract as the SQL `take`: `count` consecutive
 * values per (name, scope, at), all or nothing, and sequence_exhausted past `max`. When
 * `gated`, every statement waits until the test opens (or fails) it, so the test decides what
 * is "in flight".
 */
class Counter {
  readonly calls: Call[] = [];
  readonly gates: Gate[] = [];
  private readonly last = new Map<string, number>();

  constructor(private readonly options: { max?: number; gated?: boolean } = {}) {}

  readonly takeMany = async (name: string, scope: string, at: string | null, count: number) => {
    const call = { name, scope, at, count };
    this.calls.push(call);
    if (this.options.gated) {
      await new Promise<void>((open, fail) => this.gates.push({ call, open, fail }));
    }
    const key = `${name}|${scope}|${at}`;
    const last = this.last.get(key) ?? 0;
    const max = this.options.max ?? Number.MAX_SAFE_INTEGER;
    if (last + count > max) {
      throw new OrdoError('sequence_exhausted', `The sequence '${name}' is exhausted at ${max}`);
    }
    this.last.set(key, last + count);
    return Array.from(
      { length: count },
      (_, i): Issued => ({ value: last + i + 1, text: `${name}-${last + i + 1}`, period: null, scope }),
    );
  };

  /** Opens the oldest gate still closed. */
  openNext(): Call {
    const gate = this.gates.shift();
    if (!gate) throw new Error('no statement is waiting');
    gate.open();
    return gate.call;
  }

  failNext(error: unknown): Call {
    const gate = this.gates.shift();
    if (!gate) throw new Error('no statement is waiting');
    gate.fail(error);
    return gate.call;
  }
}

/** Lets every pending promise callback and I/O callback run. */
const settle = () => new Promise<void>((resolve) => setImmediate(resolve));

/** Records how each promise settled, in the order they settled. */
function track<T>(promises: Promise<T>[]) {
  const order: number[] = [];
  const outcomes: ({ ok: true; value: T } | { ok: false; error: unknown } | undefined)[] = promises.map(
    () => undefined,
  );
  promises.forEach((p, i) => {
    p.then(
      (value) => {
        outcomes[i] = { ok: true, value };
        order.push(i);
      },
      (error: unknown) => {
        outcomes[i] = { ok: false, error };
        order.push(i);
      },
    );
  });
  return { order, outcomes };
}

const values = (issued: Issued[]) => issued.map((i) => i.value);

describe('Coalescer', () => {
  it('sends a lone call as a statement of one', async () => {
    const counter = new Counter();
    const coalescer = new Coalescer(counter.takeMany);
    const issued = await coalescer.take('inv', 'acme', null);
    expect(issued).toEqual({ value: 1, text: 'inv-1', period: null, scope: 'acme' });
    expect(counter.calls).toEqual([{ name: 'inv', scope: 'acme', at: null, count: 1 }]);
  });

  it('passes name, scope and at through', async () => {
    const counter = new Counter();
    const coalescer = new Coalescer(counter.takeMany);
    await coalescer.take('inv', 'tenant-7', '2026-03-01T10:00:00.000Z');
    expect(counter.calls).toEqual([
      { name: 'inv', scope: 'tenant-7', at: '2026-03-01T10:00:00.000Z', count: 1 },
    ]);
  });

  it('batches the calls that arrive while a statement is in flight into one statement', async () => {
    const counter = new Counter({ gated: true });
    const coalescer = new Coalescer(counter.takeMany);
    const first = coalescer.take('inv', '', null);
    await settle();
    expect(counter.calls.map((c) => c.count)).toEqual([1]);

    const waiting = [1, 2, 3, 4, 5].map(() => coalescer.take('inv', '', null));
    await settle();
    // Still one statement: the five callers wait for the first to come back.
    expect(counter.calls.map((c) => c.count)).toEqual([1]);

    counter.openNext();
    expect((await first).value).toBe(1);
    await settle();
    expect(counter.calls.map((c) => c.count)).toEqual([1, 5]);

    counter.openNext();
    expect(values(await Promise.all(waiting))).toEqual([2, 3, 4, 5, 6]);
    expect(counter.calls).toHaveLength(2);
  });

  it('answers callers in arrival order, each with its own value, none skipped', async () => {
    const counter = new Counter({ gated: true });
    const coalescer = new Coalescer(counter.takeMany);
    const calls = Array.from({ length: 8 }, () => coalescer.take('inv', '', null));
    const { order } = track(calls);
    await settle();
    counter.openNext(); // the statement of 1
    await settle();
    counter.openNext(); // the statement of 7
    const issued = await Promise.all(calls);
    expect(values(issued)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    expect(issued.map((i) => i.text)).toEqual(values(issued).map((v) => `inv-${v}`));
    expect(order).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
  });

  it('keeps (name, scope, at) apart: different keys never share a statement', async () => {
    const counter = new Counter({ gated: true });
    const coalescer = new Coalescer(counter.takeMany);
    const a1 = coalescer.take('a', '', null);
    const b1 = coalescer.take('b', '', null);
    const a2 = coalescer.take('a', 'x', null);
    const a3 = coalescer.take('a', '', '2026-01-01T00:00:00.000Z');
    const a4 = coalescer.take('a', '', null);
    await settle();
    // Four keys, so four statements in flight at once; a4 waits behind a1.
    expect(counter.calls).toEqual([
      { name: 'a', scope: '', at: null, count: 1 },
      { name: 'b', scope: '', at: null, count: 1 },
      { name: 'a', scope: 'x', at: null, count: 1 },
      { name: 'a', scope: '', at: '2026-01-01T00:00:00.000Z', count: 1 },
    ]);
    while (counter.gates.length > 0) {
      counter.openNext();
      await settle();
    }
    const all = await Promise.all([a1, b1, a2, a3, a4]);
    expect(values(all)).toEqual([1, 1, 1, 1, 2]);
    expect(all.map((i) => i.scope)).toEqual(['', '', 'x', '', '']);
    expect(counter.calls).toHaveLength(5);
  });

  it('splits a long queue into statements of at most maxBatch', async () => {
    const counter = new Counter({ gated: true });
    const coalescer = new Coalescer(counter.takeMany, 3);
    const first = coalescer.take('inv', '', null);
    await settle();
    const rest = Array.from({ length: 7 }, () => coalescer.take('inv', '', null));
    while (counter.gates.length > 0) {
      counter.openNext();
      await settle();
    }
    expect(values(await Promise.all([first, ...rest]))).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    expect(counter.calls.map((c) => c.count)).toEqual([1, 3, 3, 1]);
  });

  it('a call that arrives after the queue drained starts a new statement', async () => {
    const counter = new Counter();
    const coalescer = new Coalescer(counter.takeMany);
    expect((await coalescer.take('inv', '', null)).value).toBe(1);
    await coalescer.idle();
    expect((await coalescer.take('inv', '', null)).value).toBe(2);
    expect(counter.calls.map((c) => c.count)).toEqual([1, 1]);
  });

  describe('errors', () => {
    it('rejects every caller of a failed batch with the same error, without retrying', async () => {
      const counter = new Counter({ gated: true });
      const coalescer = new Coalescer(counter.takeMany);
      const first = coalescer.take('inv', '', null);
      await settle();
      const batch = [1, 2, 3].map(() => coalescer.take('inv', '', null));
      const { outcomes } = track(batch);
      counter.openNext();
      await first;
      await settle();
      const timeout = new OrdoError('timeout', 'canceling statement due to lock timeout');
      expect(counter.failNext(timeout).count).toBe(3);
      await settle();
      expect(outcomes).toEqual([
        { ok: false, error: timeout },
        { ok: false, error: timeout },
        { ok: false, error: timeout },
      ]);
      for (const o of outcomes) expect(o?.ok === false && o.error).toBe(timeout);
      expect(counter.calls.map((c) => c.count)).toEqual([1, 3]);
    });

    it('propagates errors that are not OrdoErrors as they are', async () => {
      const counter = new Counter({ gated: true });
      const coalescer = new Coalescer(counter.takeMany);
      const calls = [1, 2].map(() => coalescer.take('inv', '', null));
      const { outcomes } = track(calls);
      await settle();
      const boom = new Error('boom');
      counter.failNext(boom);
      await settle();
      expect(outcomes[0]).toEqual({ ok: false, error: boom });
      expect(outcomes[1]).toBeUndefined();
      counter.failNext(boom);
      await settle();
      expect(outcomes[1]).toEqual({ ok: false, error: boom });
      expect(counter.calls.map((c) => c.count)).toEqual([1, 1]);
    });

    it('keeps serving the callers queued behind a failed statement', async () => {
      const counter = new Counter({ gated: true });
      const coalescer = new Coalescer(counter.takeMany);
      const failing = coalescer.take('inv', '', null);
      const { outcomes } = track([failing]);
      await settle();
      const later = [1, 2].map(() => coalescer.take('inv', '', null));
      counter.failNext(new OrdoError('database_unavailable', 'Connection terminated'));
      await settle();
      expect(outcomes[0]?.ok).toBe(false);
      counter.openNext();
      expect(values(await Promise.all(later))).toEqual([1, 2]);
      expect(counter.calls.map((c) => c.count)).toEqual([1, 2]);
    });

    it('a sequence_exhausted batch falls back to one by one: what is left is served, the rest refused', async () => {
      const counter = new Counter({ max: 4 });
      const coalescer = new Coalescer(counter.takeMany);
      // The first call takes 1; the six callers that queue behind it ask for 6 when 3 are left.
      const calls = Array.from({ length: 7 }, () => coalescer.take('inv', '', null));
      const results = await Promise.allSettled(calls);
      const served = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value.value] : []));
      const refused = results.flatMap((r) => (r.status === 'rejected' ? [r.reason] : []));
      expect(served).toEqual([1, 2, 3, 4]);
      // Arrival order is kept: the first four callers get the values, the last three are refused.
      expect(results.map((r) => r.status)).toEqual([
        'fulfilled',
        'fulfilled',
        'fulfilled',
        'fulfilled',
        'rejected',
        'rejected',
        'rejected',
      ]);
      expect(refused).toHaveLength(3);
      for (const e of refused) {
        expect(e).toBeInstanceOf(OrdoError);
        expect((e as OrdoError).code).toBe('sequence_exhausted');
      }
      expect(counter.calls.map((c) => c.count)).toEqual([1, 6, 1, 1, 1, 1, 1, 1]);
    });

    it('a sequence_exhausted batch with nothing left refuses everyone', async () => {
      const counter = new Counter({ max: 1 });
      const coalescer = new Coalescer(counter.takeMany);
      const results = await Promise.allSettled(
        Array.from({ length: 4 }, () => coalescer.take('x', '', null)),
      );
      expect(results.map((r) => r.status)).toEqual(['fulfilled', 'rejected', 'rejected', 'rejected']);
      for (const r of results.slice(1)) {
        expect(r.status === 'rejected' && (r.reason as OrdoError).code).toBe('sequence_exhausted');
      }
    });

    it('a sequence_exhausted statement of one is refused at once, with no retry', async () => {
      const counter = new Counter({ max: 0 });
      const coalescer = new Coalescer(counter.takeMany);
      const error = await coalescer.take('x', '', null).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(OrdoError);
      expect((error as OrdoError).code).toBe('sequence_exhausted');
      expect(counter.calls.map((c) => c.count)).toEqual([1]);
    });

    it('only sequence_exhausted triggers the one-by-one fallback', async () => {
      const counter = new Counter({ gated: true });
      const coalescer = new Coalescer(counter.takeMany);
      const first = coalescer.take('x', '', null);
      await settle();
      const batch = [1, 2].map(() => coalescer.take('x', '', null));
      const { outcomes } = track(batch);
      counter.openNext();
      await first;
      await settle();
      // An error that merely says "exhausted" but is not an OrdoError with that code.
      counter.failNext(Object.assign(new Error('exhausted'), { code: 'sequence_exhausted' }));
      await settle();
      expect(outcomes.map((o) => o?.ok)).toEqual([false, false]);
      expect(counter.calls.map((c) => c.count)).toEqual([1, 2]);
    });

    it('in the fallback, each caller gets its own outcome, in order, and later callers still queue', async () => {
      const counter = new Counter({ gated: true, max: 3 });
      const coalescer = new Coalescer(counter.takeMany);
      const first = coalescer.take('x', '', null);
      await settle();
      const batch = [1, 2, 3].map(() => coalescer.take('x', '', null));
      const { outcomes } = track(batch);
      counter.openNext(); // 1 → value 1
      await first;
      await settle();
      counter.openNext(); // batch of 3 → only 2 left → exhausted
      await settle();
      expect(counter.calls.map((c) => c.count)).toEqual([1, 3, 1]);
      const late = coalescer.take('x', '', null);
      const lateOutcome = track([late]).outcomes;
      counter.openNext(); // one by one: value 2
      await settle();
      expect(outcomes.map((o) => o?.ok)).toEqual([true, undefined, undefined]);
      counter.openNext(); // value 3
      await settle();
      counter.openNext(); // exhausted
      await settle();
      expect(outcomes.map((o) => (o?.ok ? o.value.value : o && (o.error as OrdoError).code))).toEqual([
        2,
        3,
        'sequence_exhausted',
      ]);
      // The late caller was not part of the failed batch: it goes in a statement of its own.
      expect(lateOutcome[0]).toBeUndefined();
      counter.openNext();
      await settle();
      expect(lateOutcome[0]?.ok).toBe(false);
      expect(counter.calls.map((c) => c.count)).toEqual([1, 3, 1, 1, 1, 1]);
    });
  });

  describe('idle()', () => {
    it('resolves at once when nothing is in flight', async () => {
      const coalescer = new Coalescer(new Counter().takeMany);
      await expect(coalescer.idle()).resolves.toBeUndefined();
    });

    it('waits until every queued caller has been answered, across statements and keys', async () => {
      const counter = new Counter({ gated: true });
      const coalescer = new Coalescer(counter.takeMany);
      const a = coalescer.take('a', '', null);
      const b = coalescer.take('b', '', null);
      await settle();
      const queued = [1, 2].map(() => coalescer.take('a', '', null));
      const { outcomes } = track([a, b, ...queued]);
      let idle = false;
      const waiting = coalescer.idle().then(() => {
        idle = true;
      });

      counter.openNext(); // a's first statement
      await settle();
      expect(idle).toBe(false);
      counter.openNext(); // b
      await settle();
      expect(idle).toBe(false);
      expect(outcomes.map((o) => o?.ok)).toEqual([true, true, undefined, undefined]);
      counter.openNext(); // a's statement of 2
      await waiting;
      expect(idle).toBe(true);
      expect(outcomes.map((o) => (o?.ok ? o.value.value : undefined))).toEqual([1, 1, 2, 3]);
    });

    it('waits for a batch that is failing and falling back', async () => {
      const counter = new Counter({ gated: true, max: 2 });
      const coalescer = new Coalescer(counter.takeMany);
      const calls = Array.from({ length: 4 }, () => coalescer.take('x', '', null));
      const { outcomes } = track(calls);
      let idle = false;
      // What the callers had been told at the moment idle() resolved.
      const seen = coalescer.idle().then(() => {
        idle = true;
        return outcomes.map((o) => o?.ok);
      });
      for (let step = 0; step < 20 && !idle; step++) {
        if (counter.gates.length > 0) counter.openNext();
        await settle();
      }
      expect(await seen).toEqual([true, true, false, false]);
      // 1, then 3 (exhausted), then one by one: 1, 1 (exhausted), 1 (exhausted).
      expect(counter.calls.map((c) => c.count)).toEqual([1, 3, 1, 1, 1]);
    });

    it('resolves when the calls fail too, and never rejects', async () => {
      const counter = new Counter({ gated: true });
      const coalescer = new Coalescer(counter.takeMany);
      const call = coalescer.take('x', '', null).catch((e: unknown) => e);
      const waiting = coalescer.idle();
      await settle();
      counter.failNext(new Error('boom'));
      await expect(waiting).resolves.toBeUndefined();
      expect(await call).toEqual(new Error('boom'));
    });
  });
});
