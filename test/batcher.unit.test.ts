// The one batching mechanism (src/db/batcher.ts) as throttles use it: calls of one unit each,
// answers left undefined, failures served alone by key. The sequence layer over it (merging
// callers of one key into one request) is tested in coalescer.unit.test.ts.
import { describe, expect, it } from 'vitest';
import { Batcher, statementSlots } from '../src/db/batcher.js';

interface Call {
  key: string;
  n: number;
}

/** Statements as the batcher sent them, each held until the test releases it. */
function recorder(
  answer: (calls: Call[]) => (string | undefined)[] = (calls) => calls.map((c) => `${c.key}${c.n}`),
) {
  const log: string[] = [];
  const held: { release(fail?: unknown): void }[] = [];
  let open = 0;
  let maxOpen = 0;
  const statement = <T>(label: string, value: () => T) =>
    new Promise<T>((resolve, reject) => {
      log.push(label);
      open++;
      maxOpen = Math.max(maxOpen, open);
      held.push({
        release(fail?: unknown) {
          open--;
          if (fail !== undefined) reject(fail);
          else resolve(value());
        },
      });
    });
  return {
    log,
    held,
    maxOpen: () => maxOpen,
    one: (c: Call) => statement(`one ${c.key}${c.n}`, () => `${c.key}${c.n} alone`),
    many: (calls: Call[]) =>
      statement(`many ${calls.map((c) => `${c.key}${c.n}`).join(' ')}`, () => answer(calls)),
  };
}

/** An error as the server answers a failed statement (which it then rolled back). */
const refused = (sqlstate: string) =>
  Object.assign(new Error(sqlstate), { severity: 'ERROR', code: sqlstate });

/** A batcher over the recorder's statements, calls keyed by their key. */
const batcher = (
  r: ReturnType<typeof recorder>,
  options: { slots: number; maxBatch: number; units?: (c: Call) => number; spread?: boolean },
) => new Batcher<Call, string>({ one: r.one, many: r.many, keyOf: (c) => c.key, ...options });

const settle = () => new Promise<void>((resolve) => setImmediate(resolve));

async function releaseAll(r: ReturnType<typeof recorder>, fail?: unknown): Promise<void> {
  await settle();
  while (r.held.length > 0) {
    r.held.shift()!.release(fail);
    await settle();
  }
}

describe('Batcher', () => {
  it('sends a tick’s calls in one statement, and queues the rest while the slots are busy', async () => {
    const r = recorder();
    const b = batcher(r, { slots: 1, maxBatch: 256 });
    const first = [b.submit({ key: 'a', n: 1 }), b.submit({ key: 'b', n: 1 })];
    await settle();
    const later = [b.submit({ key: 'a', n: 2 }), b.submit({ key: 'c', n: 1 })];
    await settle();
    expect(r.log).toEqual(['many a1 b1']);
    await releaseAll(r);
    expect(await Promise.all([...first, ...later])).toEqual(['a1', 'b1', 'a2', 'c1']);
    expect(r.log).toEqual(['many a1 b1', 'many a2 c1']);
    expect(r.maxOpen()).toBe(1);
  });

  it('serves alone, by one, each call many answered with undefined', async () => {
    const r = recorder((calls) => calls.map((c) => (c.key === 'b' ? undefined : `${c.key}${c.n}`)));
    const b = batcher(r, { slots: 2, maxBatch: 256 });
    const calls = [b.submit({ key: 'a', n: 1 }), b.submit({ key: 'b', n: 1 }), b.submit({ key: 'b', n: 2 })];
    await releaseAll(r);
    expect(await Promise.all(calls)).toEqual(['a1', 'b1 alone', 'b2 alone']);
    expect(r.log).toEqual(['many a1 b1 b2', 'one b1', 'one b2']);
  });

  it('after a failed statement: keys side by side, one key in arrival order, outside the slots', async () => {
    const r = recorder();
    const b = batcher(r, { slots: 1, maxBatch: 256 });
    const calls = [b.submit({ key: 'a', n: 1 }), b.submit({ key: 'b', n: 1 }), b.submit({ key: 'a', n: 2 })];
    await settle();
    r.held.shift()!.release(refused('55P03'));
    await settle();
    // a2 waits for a1; b1 goes beside them; a new call does not wait for the fallback.
    expect(r.log).toEqual(['many a1 b1 a2', 'one a1', 'one b1']);
    const late = b.submit({ key: 'c', n: 1 });
    await settle();
    expect(r.log.at(-1)).toBe('one c1');
    await releaseAll(r);
    expect(await Promise.all([...calls, late])).toEqual(['a1 alone', 'b1 alone', 'a2 alone', 'c1 alone']);
    expect(r.log).toEqual(['many a1 b1 a2', 'one a1', 'one b1', 'one c1', 'one a2']);
  });

  it('a lone call goes out through one (not the shared statement and its short lock wait); its failure is its answer, with no retry', async () => {
    const r = recorder();
    const b = batcher(r, { slots: 1, maxBatch: 256 });
    const lone = b.submit({ key: 'a', n: 1 }).catch((e: unknown) => e);
    const failure = new Error('throttle_not_found');
    await releaseAll(r, failure);
    expect(await lone).toBe(failure);
    expect(r.log).toEqual(['one a1']);
  });

  it('a statement whose outcome is unknown (connection lost, client timeout) is every caller’s answer: serving them again could take twice', async () => {
    const r = recorder();
    const b = batcher(r, { slots: 1, maxBatch: 256 });
    const calls = ['a', 'b', 'a'].map((key, n) => b.submit({ key, n }).catch((e: unknown) => e));
    const lost = new Error('Connection terminated unexpectedly');
    await releaseAll(r, lost);
    expect(await Promise.all(calls)).toEqual([lost, lost, lost]);
    expect(r.log).toEqual(['many a0 b1 a2']);
  });

  it('maxBatch counts units, never splits a call, and keeps arrival order', async () => {
    const r = recorder();
    const b = batcher(r, { slots: 1, maxBatch: 5, units: (c) => c.n });
    const calls = [4, 3, 1, 9].map((n, i) => b.submit({ key: `k${i}`, n }));
    await releaseAll(r);
    await Promise.all(calls);
    expect(r.log).toEqual(['one k04', 'many k13 k21', 'one k39']);
  });

  it('with spread, a tick’s calls go out over the free slots, a share each, but a key is never split: on two cores two statements run at once', async () => {
    const r = recorder();
    const b = batcher(r, { slots: 2, maxBatch: 256, spread: true });
    const keys = ['a', 'b', 'a', 'c', 'd', 'a'];
    const calls = keys.map((key, i) => b.submit({ key, n: i }));
    await settle();
    // Half of six for the first statement, and every later call of a key it holds.
    expect(r.log).toEqual(['many a0 b1 a2 a5', 'many c3 d4']);
    expect(r.maxOpen()).toBe(2);
    await releaseAll(r);
    expect(await Promise.all(calls)).toEqual(['a0', 'b1', 'a2', 'c3', 'd4', 'a5']);
    // Without spread, one statement takes the whole queue.
    const whole = recorder();
    const one = batcher(whole, { slots: 2, maxBatch: 256 });
    const again = keys.map((key, i) => one.submit({ key, n: i }));
    await releaseAll(whole);
    await Promise.all(again);
    expect(whole.log).toEqual(['many a0 b1 a2 c3 d4 a5']);
  });

  it('a full statement leaves every later call, so that none overtakes an earlier call of its key', async () => {
    const r = recorder();
    const b = batcher(r, { slots: 1, maxBatch: 3, units: (c) => c.n });
    // a2 does not fit beside a2; a1 would, but it would go before a2.
    const calls = [2, 2, 1].map((n) => b.submit({ key: 'a', n }));
    await releaseAll(r);
    expect(await Promise.all(calls)).toEqual(['a2 alone', 'a2', 'a1']);
    expect(r.log).toEqual(['one a2', 'many a2 a1']);
  });

  it('idle() waits for every call, fallbacks included, and never rejects', async () => {
    const r = recorder();
    const b = batcher(r, { slots: 2, maxBatch: 256 });
    const calls = [b.submit({ key: 'a', n: 1 }), b.submit({ key: 'b', n: 1 })].map((p) =>
      p.catch((e: unknown) => e),
    );
    let idle = false;
    const waited = b.idle().then(() => (idle = true));
    await settle();
    r.held.shift()!.release(refused('40P01'));
    await settle();
    expect(idle).toBe(false);
    await releaseAll(r);
    await waited;
    expect(await Promise.all(calls)).toEqual(['a1 alone', 'b1 alone']);
  });

  it('statementSlots: two for most pools, one for a pool of two or three, never zero', () => {
    expect([undefined, 10, 4, 3, 2, 1].map(statementSlots)).toEqual([2, 2, 2, 1, 1, 1]);
  });
});
