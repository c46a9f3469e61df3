// Throttles through the library API on a real PostgreSQL: definitions, every policy and
// their combinations, refunds, leases that expire or are extended, run(), the SQL functions
// other languages call, and every error a caller can cause. Times are compared with the
// database's own timestamps (acquiredAt, expiresAt, endedAt), never with this process's clock.
import { setTimeout as sleep } from 'node:timers/promises';
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo, OrdoError, type OrdoErrorCode } from '../src/index.js';
import { MAX_DURATION_MS, MAX_LIMIT } from '../src/throttles/definitions.js';
import type { AcquireResult, Permit, Refusal } from '../src/throttles/permit.js';
import type { AcquireOptions } from '../src/throttles/throttles.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { granted } from './support/permits.js';

let db: TestDatabase;
let ordo: Ordo;
let raw: pg.Pool;

beforeAll(async () => {
  db = await freshDatabase();
  ordo = await createOrdo({ databaseUrl: db.url, poolSize: 4 });
  raw = db.pool(2);
});
afterAll(async () => {
  await ordo?.close();
  await db?.drop();
});

function refused(r: AcquireResult, reason?: Refusal['reason']): Refusal {
  expect(r.granted, JSON.stringify(r)).toBe(false);
  const refusal = r as Refusal;
  expect(Number.isInteger(refusal.retryAfterMs)).toBe(true);
  expect(refusal.retryAfterMs).toBeGreaterThan(0);
  if (reason) expect(refusal.reason).toBe(reason);
  return refusal;
}

/** Acquires, sleeping each refusal's retryAfterMs, until granted; returns the permit and the refusals seen. */
async function untilGranted(
  name: string,
  options: AcquireOptions = {},
  attempts = 100,
): Promise<{ permit: Permit; refusals: Refusal[] }> {
  const refusals: Refusal[] = [];
  for (let i = 0; i < attempts; i++) {
    const r = await ordo.throttles.acquire(name, options);
    if (r.granted) return { permit: r, refusals };
    refusals.push(r);
    await sleep(r.retryAfterMs);
  }
  throw new Error(`no grant of ${name} in ${attempts} attempts`);
}

async function expectCode(action: () => unknown, code: OrdoErrorCode, fragment?: string | RegExp) {
  let thrown: unknown;
  try {
    await action();
  } catch (e) {
    thrown = e;
  }
  expect(thrown, `expected ${code}`).toBeInstanceOf(OrdoError);
  expect((thrown as OrdoError).code, (thrown as Error).message).toBe(code);
  if (fragment) expect((thrown as Error).message).toMatch(fragment);
  return thrown as OrdoError;
}

const ms = (a: Date, b: Date) => b.getTime() - a.getTime();

describe('definitions', () => {
  it('defines, gets, lists, redefines and removes', async () => {
    const d = await ordo.throttles.define({ name: 'defs', every: '2s', concurrency: 1 });
    expect(d).toMatchObject({
      name: 'defs',
      everyMs: 2000,
      limit: null,
      perMs: null,
      concurrency: 1,
      leaseMs: 300_000,
      refundOnFailure: false,
    });
    expect(d.createdAt).toBeInstanceOf(Date);
    expect(await ordo.throttles.get('defs')).toEqual(d);
    expect((await ordo.throttles.list()).map((t) => t.name)).toContain('defs');
    await expectCode(
      () => ordo.throttles.define({ name: 'defs', every: '1s' }),
      'throttle_exists',
      "The throttle 'defs' already exists",
    );
    // ifNotExists answers the definition in place, unchanged.
    expect(await ordo.throttles.define({ name: 'defs', every: '1s', ifNotExists: true })).toEqual(d);
    const o = await ordo.throttles.define({
      name: 'defs',
      limit: 5,
      per: '1m',
      lease: 1500,
      refundOnFailure: true,
      overwrite: true,
    });
    expect(o).toMatchObject({ everyMs: null, limit: 5, perMs: 60_000, concurrency: null, leaseMs: 1500 });
    expect(o.refundOnFailure).toBe(true);
    expect(await ordo.throttles.remove('defs')).toBe(true);
    expect(await ordo.throttles.get('defs')).toBeNull();
    expect(await ordo.throttles.remove('defs', { ifExists: true })).toBe(false);
    await expectCode(() => ordo.throttles.remove('defs'), 'throttle_not_found', "'defs' does not exist");
  });

  it('refuses what a person can get wrong, with messages that say what to change', async () => {
    const bad: [unknown, RegExp][] = [
      [{ name: '9lives', every: '1s' }, /name must be an identifier/],
      [{ name: 'a-b', every: '1s' }, /name must be an identifier/],
      [{ name: 'x', every: '1s', burst: 3 }, /has no option 'burst'/],
      [{ name: 'x' }, /needs at least one policy/],
      [{ name: 'x', lease: '1m' }, /needs at least one policy/],
      [{ name: 'x', limit: 3 }, /limit needs per/],
      [{ name: 'x', per: '1s' }, /per needs limit/],
      [{ name: 'x', every: '2 s' }, /every must be a duration/],
      [{ name: 'x', every: '0s' }, /every must be a duration from 1ms/],
      [{ name: 'x', every: 0 }, /every must be a duration/],
      [{ name: 'x', every: -5 }, /every must be a duration/],
      [{ name: 'x', every: 1.5 }, /every must be a duration/],
      [{ name: 'x', every: '400d' }, /every must be a duration from 1ms to 1y/],
      [{ name: 'x', every: '1s', lease: 'soon' }, /lease must be a duration/],
      [{ name: 'x', limit: 0, per: '1s' }, /limit must be a whole number from 1/],
      [{ name: 'x', limit: 2.5, per: '1s' }, /limit must be a whole number/],
      [{ name: 'x', concurrency: 0 }, /concurrency must be a whole number from 1/],
      [{ name: 'x', concurrency: '3' }, /concurrency must be a whole number/],
      [{ name: 'x', every: '1s', refundOnFailure: 'yes' }, /refundOnFailure must be true or false/],
      [{ name: 'x', every: '1s', ifNotExists: true, overwrite: true }, /not both/],
      [null, /throttle definition must be an object/],
    ];
    for (const [options, message] of bad) {
      await expectCode(() => ordo.throttles.define(options as never), 'invalid_argument', message);
    }
    expect(await ordo.throttles.get('x')).toBeNull();

    await ordo.throttles.define({ name: 'valid', every: '1s' });
    await expectCode(
      () => ordo.throttles.acquire('valid', { key: 'k'.repeat(201) }),
      'invalid_argument',
      /key must be a text of at most 200/,
    );
    await expectCode(
      () => ordo.throttles.acquire('valid', { key: 'a\u0000b' }),
      'invalid_argument',
      /without NUL/,
    );
    await expectCode(
      () => ordo.throttles.acquire('valid', { holder: '' }),
      'invalid_argument',
      /holder must be a text of 1 to 200/,
    );
    await expectCode(
      () => ordo.throttles.acquire('valid', { waitFor: '1s' } as never),
      'invalid_argument',
      /has no option 'waitFor'/,
    );
    await expectCode(
      () => ordo.throttles.acquire('valid', { wait: true } as never),
      'invalid_argument',
      /wait must be a duration/,
    );
    await expectCode(
      () => ordo.throttles.acquire('valid', { tx: {} as never }),
      'invalid_argument',
      /tx must be/,
    );
    await expectCode(
      () => ordo.throttles.acquire('no such'),
      'invalid_argument',
      /name must be an identifier/,
    );
    await expectCode(() => ordo.throttles.complete('42'), 'invalid_argument', /permit id is a UUID/);
    await expectCode(() => ordo.throttles.extend(42 as never), 'invalid_argument', /permit id is a UUID/);
    await expectCode(
      () => ordo.throttles.fail('7f8c3a39-2f7e-4f27-9a4a-0d3b8f0d1f00', { refund: 'yes' as never }),
      'invalid_argument',
      /refund must be true or false/,
    );
    await expectCode(
      () => ordo.throttles.run('valid', 'work' as never),
      'invalid_argument',
      /fn must be a function/,
    );
    await expectCode(
      () => ordo.throttles.run('valid', async () => 1, { tx: raw } as never),
      'invalid_argument',
      /has no option 'tx'/,
    );
    await expectCode(
      () => ordo.throttles.remove('valid', { force: true } as never),
      'invalid_argument',
      /has no option 'force'/,
    );
    await expectCode(() => ordo.throttles.state('valid', 'k'.repeat(201)), 'invalid_argument', /key must be/);
  });

  it('names a throttle that does not exist', async () => {
    await expectCode(
      () => ordo.throttles.acquire('ghost'),
      'throttle_not_found',
      "The throttle 'ghost' does not exist",
    );
    await expectCode(() => ordo.throttles.state('ghost'), 'throttle_not_found', "'ghost' does not exist");
    await expectCode(() => ordo.throttles.run('ghost', () => 1), 'throttle_not_found');
    expect(await ordo.throttles.get('ghost')).toBeNull();
  });
});

describe('every + concurrency (the FOO story, one process)', () => {
  it('a task longer than its interval blocks the next start until it completes', async () => {
    await ordo.throttles.define({ name: 'foo', every: '1s', concurrency: 1 });
    const first = granted(await ordo.throttles.acquire('foo'));
    // Within the interval: 'every' refuses, for at most the interval.
    const early = refused(await ordo.throttles.acquire('foo'), 'every');
    expect(early.retryAfterMs).toBeLessThanOrEqual(1000);
    // Past the interval, still running: 'concurrency' refuses, with a short poll hint.
    await sleep(early.retryAfterMs + 50);
    const running = refused(await ordo.throttles.acquire('foo'), 'concurrency');
    expect(running.retryAfterMs).toBeLessThanOrEqual(100);
    const end = await first.complete();
    expect(end).toMatchObject({ id: first.id, name: 'foo', key: '', outcome: 'completed', refunded: false });
    // Completed after the interval: the next start is granted at once.
    const second = granted(await ordo.throttles.acquire('foo'));
    expect(ms(end.endedAt, second.acquiredAt)).toBeGreaterThanOrEqual(0);
    expect(ms(first.acquiredAt, second.acquiredAt)).toBeGreaterThanOrEqual(1000);
    await second.complete();
  });

  it('a task shorter than its interval: the next start comes one interval later; retryAfterMs is enough to sleep on', async () => {
    await ordo.throttles.define({ name: 'short', every: '1s', concurrency: 1 });
    const a = granted(await ordo.throttles.acquire('short'));
    await a.complete();
    const { permit: b, refusals } = await untilGranted('short');
    // One sleep of retryAfterMs was enough: sleeping the hint never falls short.
    expect(refusals.map((r) => r.reason)).toEqual(['every']);
    expect(ms(a.acquiredAt, b.acquiredAt)).toBeGreaterThanOrEqual(1000);
    // (An upper bound only says it was not much later: a loaded machine wakes timers late.)
    expect(ms(a.acquiredAt, b.acquiredAt)).toBeLessThan(1000 + 1000);
    await b.complete();
  });

  it('keys are independent', async () => {
    await ordo.throttles.define({ name: 'perkey', every: '10s', concurrency: 1 });
    const a = granted(await ordo.throttles.acquire('perkey', { key: 'tenant-a' }));
    refused(await ordo.throttles.acquire('perkey', { key: 'tenant-a' }), 'every');
    const b = granted(await ordo.throttles.acquire('perkey', { key: 'tenant-b' }));
    const empty = granted(await ordo.throttles.acquire('perkey'));
    expect([a.key, b.key, empty.key]).toEqual(['tenant-a', 'tenant-b', '']);
    const state = await ordo.throttles.state('perkey', 'tenant-b');
    expect(state.running.map((p) => p.id)).toEqual([b.id]);
    await Promise.all([a.complete(), b.complete(), empty.complete()]);
  });
});

describe('failures and refunds', () => {
  it('a refunded failure lets a retry start at once; an unrefunded one keeps the slot', async () => {
    await ordo.throttles.define({ name: 'refund', every: '1m', concurrency: 1 });
    const a = granted(await ordo.throttles.acquire('refund'));
    const failedA = await a.fail(new TypeError('upstream said 503'), { refund: true });
    expect(failedA).toMatchObject({ outcome: 'failed', refunded: true });
    const b = granted(await ordo.throttles.acquire('refund'));
    const failedB = await b.fail('still down');
    expect(failedB.refunded).toBe(false);
    const kept = refused(await ordo.throttles.acquire('refund'), 'every');
    // The slot runs from b's start: about a minute.
    expect(kept.retryAfterMs).toBeGreaterThan(55_000);
    expect(kept.retryAfterMs).toBeLessThanOrEqual(60_000);
    const state = await ordo.throttles.state('refund');
    expect(state).toMatchObject({
      lastOutcome: 'failed',
      lastError: 'still down',
      lastPermitId: b.id,
      starts: 2,
      running: [],
    });
    expect(state.lastStartAt).toEqual(b.acquiredAt);
    expect(state.lastEndAt).toEqual(failedB.endedAt);
  });

  it('refundOnFailure is the default of fail(), and refund: false overrides it', async () => {
    await ordo.throttles.define({ name: 'autorefund', every: '1m', refundOnFailure: true });
    const a = granted(await ordo.throttles.acquire('autorefund'));
    expect((await a.fail()).refunded).toBe(true);
    const b = granted(await ordo.throttles.acquire('autorefund'));
    expect((await b.fail(new Error('no'), { refund: false })).refunded).toBe(false);
    refused(await ordo.throttles.acquire('autorefund'), 'every');
    expect((await ordo.throttles.state('autorefund')).lastError).toBe('no');
  });

  it('a refund restores the start before it, so the interval still runs from that one', async () => {
    await ordo.throttles.define({ name: 'unwind', every: '1s' });
    const a = granted(await ordo.throttles.acquire('unwind'));
    await a.complete();
    const { permit: b } = await untilGranted('unwind');
    await b.fail('boom', { refund: true });
    // a's start counts again: it is more than the interval ago, so a retry starts at once.
    const c = granted(await ordo.throttles.acquire('unwind'));
    // and the interval now runs from c.
    refused(await ordo.throttles.acquire('unwind'), 'every');
    await c.complete();
  });

  it('maintain() keeps an ended permit whose hold is still to come, a day on, and forgets it once the hold has passed', async () => {
    await ordo.throttles.define({ name: 'held_long', every: '1s' });
    const a = granted(await ordo.throttles.acquire('held_long', { key: 'k' }));
    await a.fail('429', { retryAfter: '2d' });
    // A day and more on, with nobody asking for the key since: the hold is not folded in yet.
    const aged = `UPDATE ordo.permits SET ended_at = ended_at - interval '25 hours' WHERE id = $1`;
    await raw.query(aged, [a.id]);
    const endedPermits = async () => (await ordo.maintain()).find((m) => m.what === 'ended permits')?.deleted;
    expect(await endedPermits()).toBe(0);
    refused(await ordo.throttles.acquire('held_long', { key: 'k' }), 'paused');
    // Another failure whose hold has passed by the time the clean-up runs: forgotten.
    const b = granted(await ordo.throttles.acquire('held_long', { key: 'other' }));
    await b.fail('429', { retryAfter: '2d' });
    await raw.query(
      `UPDATE ordo.permits SET ended_at = ended_at - interval '3 days', hold_until = hold_until - interval '3 days' WHERE id = $1`,
      [b.id],
    );
    expect(await endedPermits()).toBe(1);
  });

  it('a refund gives a token back to the bucket', async () => {
    await ordo.throttles.define({ name: 'tokens', limit: 2, per: '1m' });
    const a = granted(await ordo.throttles.acquire('tokens'));
    granted(await ordo.throttles.acquire('tokens'));
    const empty = refused(await ordo.throttles.acquire('tokens'), 'rate');
    // One token back every 30 s.
    expect(empty.retryAfterMs).toBeGreaterThan(25_000);
    expect(empty.retryAfterMs).toBeLessThanOrEqual(30_000);
    await a.fail('rejected', { refund: true });
    granted(await ordo.throttles.acquire('tokens'));
    refused(await ordo.throttles.acquire('tokens'), 'rate');
  });
});

describe('rate: a token bucket (GCRA) per key', () => {
  it('bursts up to limit, then one start per per/limit', async () => {
    await ordo.throttles.define({ name: 'bucket', limit: 3, per: '3s' });
    const burst = [];
    for (let i = 0; i < 3; i++) burst.push(granted(await ordo.throttles.acquire('bucket')));
    const r = refused(await ordo.throttles.acquire('bucket'), 'rate');
    expect(r.retryAfterMs).toBeLessThanOrEqual(1000);
    const { permit: next } = await untilGranted('bucket');
    // One token per second after the burst.
    expect(ms(burst[0]!.acquiredAt, next.acquiredAt)).toBeGreaterThanOrEqual(1000);
    for (const p of [...burst, next]) await p.complete();
  });

  it('combined policies: granted only when every one allows; the longest wait names the reason', async () => {
    await ordo.throttles.define({ name: 'combo', every: '1s', limit: 2, per: '20s', concurrency: 2 });
    const a = granted(await ordo.throttles.acquire('combo'));
    refused(await ordo.throttles.acquire('combo'), 'every');
    const { permit: b } = await untilGranted('combo');
    expect(ms(a.acquiredAt, b.acquiredAt)).toBeGreaterThanOrEqual(1000);
    // Two tokens spent: the bucket waits about 9 s, longer than the interval, so it is the reason.
    const r = refused(await ordo.throttles.acquire('combo'), 'rate');
    expect(r.retryAfterMs).toBeGreaterThan(5000);
    await a.complete();
    await b.complete();
  });
});

describe('concurrency and leases', () => {
  it('at most N live permits; an expired permit stops counting at once and its end is recorded as expired', async () => {
    // Long enough that b, c and d end within their leases on a loaded machine; a's runs out.
    await ordo.throttles.define({ name: 'pool', concurrency: 2, lease: '2s' });
    const a = granted(await ordo.throttles.acquire('pool', { holder: 'worker-a' }));
    const b = granted(await ordo.throttles.acquire('pool', { holder: 'worker-b' }));
    expect(ms(a.acquiredAt, a.expiresAt!)).toBe(2000);
    const full = refused(await ordo.throttles.acquire('pool'), 'concurrency');
    // The hint: until the earliest lease runs out, at most 100 ms.
    expect(full.retryAfterMs).toBeLessThanOrEqual(100);
    await b.complete();
    // c takes b's place and is kept alive by run(); a is never completed nor extended.
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    let c: Permit | undefined;
    const holding = ordo.throttles.run('pool', async ({ permit }) => {
      c = permit;
      await released;
    });
    await sleep(50);
    expect(c).toBeDefined();
    // a's lease runs out, and the next start follows.
    const { permit: d } = await untilGranted('pool');
    expect(d.acquiredAt.getTime()).toBeGreaterThanOrEqual(a.expiresAt!.getTime());
    expect(ms(a.expiresAt!, d.acquiredAt)).toBeLessThan(500);
    const state = await ordo.throttles.state('pool');
    expect(state.running.map((p) => p.id).sort()).toEqual([c!.id, d.id].sort());
    // b completed earlier, a's end (its expiry) is the latest end.
    expect(state).toMatchObject({ lastOutcome: 'expired', lastPermitId: a.id, lastError: null, starts: 4 });
    expect(state.lastEndAt).toEqual(a.expiresAt);
    // Its holder learns it on its next call.
    await expectCode(() => a.complete(), 'permit_expired', /expired at .*lease ran out/);
    await expectCode(() => a.extend(), 'permit_expired');
    await expectCode(() => a.fail('late'), 'permit_expired');
    release();
    expect(await holding).toEqual({ ran: true, value: undefined });
    await d.complete();
  });

  it('an expiry is seen by state() before any decision records it', async () => {
    await ordo.throttles.define({ name: 'lazy', concurrency: 1, lease: '150ms' });
    const a = granted(await ordo.throttles.acquire('lazy', { key: 'k' }));
    await sleep(ms(a.acquiredAt, a.expiresAt!) + 100);
    const state = await ordo.throttles.state('lazy', 'k');
    expect(state).toMatchObject({ lastOutcome: 'expired', lastPermitId: a.id, running: [] });
    expect(state.lastEndAt).toEqual(a.expiresAt);
  });

  it('extend() renews the lease from the database clock; an extended permit keeps counting', async () => {
    await ordo.throttles.define({ name: 'extend', concurrency: 1, lease: '2s' });
    const a = granted(await ordo.throttles.acquire('extend'));
    const first = a.expiresAt!;
    await sleep(800);
    const until = await a.extend();
    expect(until.getTime()).toBeGreaterThan(first.getTime());
    expect(a.expiresAt).toEqual(until);
    await sleep(1400);
    // Past the first expiry, the extended permit still holds the slot.
    refused(await ordo.throttles.acquire('extend'), 'concurrency');
    expect(await ordo.throttles.extend(a.id)).toBeInstanceOf(Date);
    await a.complete();
    granted(await ordo.throttles.acquire('extend'));
  });

  it('complete, fail and extend of an unknown or ended permit: permit_not_found', async () => {
    await ordo.throttles.define({ name: 'ends', concurrency: 5 });
    const a = granted(await ordo.throttles.acquire('ends'));
    await a.complete();
    await expectCode(() => a.complete(), 'permit_not_found', /has already ended: it completed at/);
    await expectCode(() => a.extend(), 'permit_not_found');
    // Once a decision has folded it in, it is gone.
    granted(await ordo.throttles.acquire('ends'));
    await expectCode(() => a.fail('x'), 'permit_not_found', /does not exist/);
    await expectCode(
      () => ordo.throttles.complete('7f8c3a39-2f7e-4f27-9a4a-0d3b8f0d1f00'),
      'permit_not_found',
      /does not exist/,
    );
  });

  it('remove() waits for nothing it should not, and takes every state and permit with it', async () => {
    await ordo.throttles.define({ name: 'gone', concurrency: 1 });
    const a = granted(await ordo.throttles.acquire('gone'));
    await ordo.throttles.remove('gone');
    await expectCode(() => a.complete(), 'permit_not_found');
    await ordo.throttles.define({ name: 'gone', concurrency: 1 });
    // Defined afresh, nothing of the old permit counts.
    const b = granted(await ordo.throttles.acquire('gone'));
    expect((await ordo.throttles.state('gone')).starts).toBe(1);
    await b.complete();
  });

  it('rows a removed incarnation left behind (a decision racing with remove) never count', async () => {
    await ordo.throttles.define({ name: 'reborn', concurrency: 1 });
    granted(await ordo.throttles.acquire('reborn', { key: 'k' }));
    const states = (await raw.query(`SELECT * FROM ordo.throttle_state WHERE name = 'reborn'`)).rows;
    const permits = (await raw.query(`SELECT * FROM ordo.permits WHERE name = 'reborn'`)).rows;
    await ordo.throttles.remove('reborn');
    await ordo.throttles.define({ name: 'reborn', concurrency: 1 });
    // What a decision that read the old definition may leave behind after the removal.
    await raw.query(
      'INSERT INTO ordo.throttle_state SELECT * FROM json_populate_recordset(NULL::ordo.throttle_state, $1)',
      [JSON.stringify(states)],
    );
    await raw.query(
      'INSERT INTO ordo.permits SELECT * FROM json_populate_recordset(NULL::ordo.permits, $1)',
      [JSON.stringify(permits)],
    );
    expect(await ordo.throttles.running('reborn')).toEqual([]);
    expect(await ordo.throttles.state('reborn', 'k')).toMatchObject({
      starts: 0,
      running: [],
      lastStartAt: null,
    });
    await expectCode(() => ordo.throttles.extend(permits[0].id), 'permit_not_found');
    // The old permit does not hold the one slot, and the next decision clears it.
    const fresh = granted(await ordo.throttles.acquire('reborn', { key: 'k' }));
    expect((await ordo.throttles.state('reborn', 'k')).starts).toBe(1);
    const { rows } = await raw.query(`SELECT id FROM ordo.permits WHERE name = 'reborn'`);
    expect(rows.map((r) => r.id)).toEqual([fresh.id]);
    await fresh.complete();
  });

  it('running() lists live permits across throttles', async () => {
    await ordo.throttles.define({ name: 'listed', concurrency: 3 });
    const a = granted(await ordo.throttles.acquire('listed', { key: 'x', holder: 'me' }));
    const all = await ordo.throttles.running();
    expect(all.find((p) => p.id === a.id)).toEqual({
      id: a.id,
      name: 'listed',
      key: 'x',
      holder: 'me',
      acquiredAt: a.acquiredAt,
      expiresAt: a.expiresAt,
    });
    expect((await ordo.throttles.running('listed')).map((p) => p.id)).toEqual([a.id]);
    await a.complete();
    expect(await ordo.throttles.running('listed')).toEqual([]);
  });
});

describe('run()', () => {
  it('acquires, runs, completes; refused, it answers at once', async () => {
    await ordo.throttles.define({ name: 'job', every: '1m', concurrency: 1 });
    const done = await ordo.throttles.run('job', async ({ permit, signal }) => {
      expect(permit.granted).toBe(true);
      expect(signal.aborted).toBe(false);
      return 42;
    });
    expect(done).toEqual({ ran: true, value: 42 });
    const again = await ordo.throttles.run('job', () => 'never');
    expect(again).toMatchObject({ ran: false, reason: 'every' });
    expect((again as { retryAfterMs: number }).retryAfterMs).toBeGreaterThan(50_000);
    expect((await ordo.throttles.state('job')).lastOutcome).toBe('completed');
  });

  it("fails the permit with fn's error and rethrows it", async () => {
    await ordo.throttles.define({ name: 'flaky', every: '1m', refundOnFailure: true });
    const boom = new RangeError('out of paper');
    await expect(ordo.throttles.run('flaky', async () => Promise.reject(boom), { key: 'p' })).rejects.toBe(
      boom,
    );
    const state = await ordo.throttles.state('flaky', 'p');
    expect(state).toMatchObject({ lastOutcome: 'failed', lastError: 'RangeError: out of paper' });
    // refundOnFailure: the retry starts at once.
    expect(await ordo.throttles.run('flaky', () => 'ok', { key: 'p' })).toEqual({ ran: true, value: 'ok' });
  });

  it('extends the lease while fn runs past it, so no other start slips in', async () => {
    await ordo.throttles.define({ name: 'long', concurrency: 1, lease: '450ms' });
    let blocked: AcquireResult | undefined;
    const result = await ordo.throttles.run('long', async ({ permit }) => {
      await sleep(1200);
      blocked = await ordo.throttles.acquire('long');
      return permit.expiresAt!.getTime() - permit.acquiredAt.getTime();
    });
    refused(blocked!, 'concurrency');
    // Extended several times: its expiry moved well past the first lease.
    expect(result.ran && result.value).toBeGreaterThan(1200);
    expect((await ordo.throttles.state('long')).lastOutcome).toBe('completed');
  });

  it('a lost lease aborts the signal, and run() reports it instead of a success', async () => {
    await ordo.throttles.define({ name: 'lost', concurrency: 1, lease: '150ms' });
    let aborted: unknown;
    const error = await expectCode(
      () =>
        ordo.throttles.run('lost', async ({ permit, signal }) => {
          // Someone else ends the permit: the next extension fails.
          await ordo.throttles.complete(permit.id);
          await new Promise((resolve) => signal.addEventListener('abort', resolve));
          aborted = signal.reason;
          return 'too late';
        }),
      'permit_not_found',
    );
    expect(aborted).toBeInstanceOf(OrdoError);
    expect(error.cause).toBe(aborted);
  });

  it('close() answers a run() in flight (renewing its lease meanwhile), then refuses new calls', async () => {
    const other = await createOrdo({ databaseUrl: db.url, poolSize: 2 });
    await other.throttles.define({ name: 'closing', concurrency: 1, lease: '450ms' });
    const running = other.throttles.run('closing', async () => {
      await sleep(1000);
      return 'finished';
    });
    await sleep(50);
    const closed = other.close();
    await expectCode(() => other.throttles.acquire('closing'), 'closed');
    expect(await running).toEqual({ ran: true, value: 'finished' });
    await closed;
    expect((await ordo.throttles.state('closing')).lastOutcome).toBe('completed');
  });
});

describe('in a caller transaction', () => {
  it('the grant commits or rolls back with the transaction', async () => {
    await ordo.throttles.define({ name: 'txn', every: '1m' });
    await expect(
      ordo.transaction(async (tx) => {
        granted(await ordo.throttles.acquire('txn', { tx }));
        throw new Error('declined');
      }),
    ).rejects.toThrow('declined');
    // Rolled back: the start never happened.
    const kept = await ordo.transaction(async (tx) => {
      const p = granted(await ordo.throttles.acquire('txn', { tx }));
      await p.complete({ tx });
      return p;
    });
    expect((await ordo.throttles.state('txn')).lastPermitId).toBe(kept.id);
    refused(await ordo.throttles.acquire('txn'), 'every');
  });
});

describe('standalone calls share statements', () => {
  it('many concurrent calls: every one answered, none lost or doubled', async () => {
    await ordo.throttles.define({ name: 'crowd', limit: 50, per: '1m', concurrency: 30 });
    const results = await Promise.all(
      Array.from({ length: 80 }, (_, i) => ordo.throttles.acquire('crowd', { key: `k${i % 2}` })),
    );
    const permits = results.filter((r): r is Permit => r.granted);
    // Per key: a burst of 50 tokens, but at most 30 running.
    expect(permits.filter((p) => p.key === 'k0')).toHaveLength(30);
    expect(permits.filter((p) => p.key === 'k1')).toHaveLength(30);
    expect(new Set(permits.map((p) => p.id)).size).toBe(60);
    const ends = await Promise.all(permits.map((p) => p.complete()));
    expect(ends.every((e) => e.outcome === 'completed')).toBe(true);
    // Completions and decisions in the same statements: the next 20 of each key's bucket.
    const more = await Promise.all(
      Array.from({ length: 44 }, (_, i) => ordo.throttles.acquire('crowd', { key: `k${i % 2}` })),
    );
    expect(more.filter((r) => r.granted)).toHaveLength(40);
    expect(more.filter((r) => !r.granted).every((r) => (r as Refusal).reason === 'rate')).toBe(true);
    expect((await ordo.throttles.state('crowd', 'k0')).starts).toBe(50);
  });

  it("a caller's transaction holding a key holds up that key only", async () => {
    await ordo.throttles.define({ name: 'held', concurrency: 100 });
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let inside: Permit | undefined;
    const holding = ordo.transaction(async (tx) => {
      inside = granted(await ordo.throttles.acquire('held', { key: 'busy', tx }));
      await gate;
    });
    while (!inside) await sleep(10);
    const busy = ordo.throttles.acquire('held', { key: 'busy' });
    // Other keys are answered while the transaction still holds 'busy' (else this never resolves).
    const others = await Promise.race([
      Promise.all(Array.from({ length: 6 }, (_, i) => ordo.throttles.acquire('held', { key: `free${i}` }))),
      sleep(10_000).then(() => 'stuck' as const),
    ]);
    expect(others).not.toBe('stuck');
    for (const r of others as AcquireResult[]) granted(r);
    release();
    await holding;
    const late = granted(await busy);
    for (const r of others as Permit[])
      expect(r.acquiredAt.getTime()).toBeLessThanOrEqual(late.acquiredAt.getTime());
  });
});

describe('the SQL functions, as another language calls them', () => {
  it('try_acquire, complete_permit, fail_permit, extend_permit, throttle_status', async () => {
    await ordo.throttles.define({ name: 'sqlapi', every: '1m', concurrency: 1, lease: '1m' });
    const { rows } = await raw.query(`SELECT * FROM ordo.try_acquire('sqlapi', 'k')`);
    const got = rows[0];
    expect(got).toMatchObject({ granted: true, retry_after_ms: '0', reason: null });
    // The default holder names the session.
    expect(got.holder).toMatch(/:\d+$/);
    const { rows: again } = await raw.query(`SELECT * FROM ordo.try_acquire('sqlapi', 'k', 'php-worker-3')`);
    expect(again[0]).toMatchObject({ granted: false, permit_id: null, reason: 'every' });
    const { rows: ext } = await raw.query('SELECT ordo.extend_permit($1) AS until', [got.permit_id]);
    expect(ext[0].until.getTime()).toBeGreaterThanOrEqual(got.expires_at.getTime());
    const { rows: failed } = await raw.query(`SELECT * FROM ordo.fail_permit($1, 'disk full', true)`, [
      got.permit_id,
    ]);
    expect(failed[0]).toMatchObject({ outcome: 'failed', refunded: true });
    const { rows: retry } = await raw.query(`SELECT * FROM ordo.try_acquire('sqlapi', 'k')`);
    expect(retry[0].granted).toBe(true);
    await raw.query('SELECT * FROM ordo.complete_permit($1)', [retry[0].permit_id]);
    const { rows: status } = await raw.query(`SELECT * FROM ordo.throttle_status('sqlapi', 'k')`);
    expect(status[0]).toMatchObject({ starts: '2', last_outcome: 'completed', running: 0 });
    await expect(raw.query(`SELECT * FROM ordo.complete_permit($1)`, [got.permit_id])).rejects.toMatchObject({
      code: 'OX007',
    });
  });

  it('set_key_limits refuses a limit out of range with a message naming it, writing nothing', async () => {
    await ordo.throttles.define({ name: 'sqllimits', limit: 5, per: '1s', concurrency: 2 });
    // [every_ms, rate_limit, per_ms, concurrency]
    const call = (limits: readonly unknown[]) =>
      raw.query(`SELECT * FROM ordo.set_key_limits('sqllimits', 'k', $1, $2, $3, $4)`, [...limits]);
    // Each limit just past each of its bounds.
    const bad: [unknown[], RegExp][] = [];
    // The bounds the library checks definitions against.
    for (const [i, name, max] of [
      [0, 'every', MAX_DURATION_MS],
      [1, 'limit', MAX_LIMIT],
      [2, 'per', MAX_DURATION_MS],
      [3, 'concurrency', MAX_LIMIT],
    ] as const) {
      for (const value of [0, max + 1]) {
        const limits: unknown[] = [null, null, null, null];
        limits[i] = value;
        bad.push([limits, new RegExp(`^${name} is 1 .*\\(got ${value}( ms)?\\)$`)]);
      }
    }
    for (const [args, message] of bad) {
      await expect(call(args), JSON.stringify(args)).rejects.toMatchObject({
        code: 'OX003',
        message: expect.stringMatching(message),
      });
    }
    const stored = () => raw.query(`SELECT key FROM ordo.throttle_state WHERE name = 'sqllimits'`);
    expect((await stored()).rows).toEqual([]);
    // The bounds themselves are limits a key may have.
    const { rows } = await call([MAX_DURATION_MS, MAX_LIMIT, 1, 1]);
    expect(rows[0]).toMatchObject({
      every_ms: String(MAX_DURATION_MS),
      rate_limit: MAX_LIMIT,
      per_ms: '1',
      concurrency: 1,
    });
    expect((await stored()).rows).toEqual([{ key: 'k' }]);
  });
});
