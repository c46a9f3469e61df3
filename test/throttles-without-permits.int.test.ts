// Throttles defined with `permits: false`: a grant is a start and nothing is stored for it. The
// limits hold as with permits (every, token buckets, key tiers, waiting in line, several limits
// in one request), no permit row is ever written, what only a permit can do is refused with a
// clear error, and redefining a throttle either way leaves its keys' counters right. Times are
// the database's (acquiredAt), never this process's clock.
import { setTimeout as sleep } from 'node:timers/promises';
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo, OrdoError } from '../src/index.js';
import type { Permit } from '../src/throttles/permit.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { granted } from './support/permits.js';

let db: TestDatabase;
let ordo: Ordo;
let raw: pg.Pool;

beforeAll(async () => {
  db = await freshDatabase();
  ordo = await createOrdo({ databaseUrl: db.url, poolSize: 8 });
  raw = db.pool(2);
});
afterAll(async () => {
  await ordo?.close();
  await db?.drop();
});

async function permitRows(name: string): Promise<number> {
  const { rows } = await raw.query('SELECT count(*)::int AS n FROM ordo.permits WHERE name = $1', [name]);
  return rows[0].n;
}

async function rejects(action: () => unknown, code: string, message: RegExp): Promise<void> {
  const error = await Promise.resolve()
    .then(action)
    .then(
      () => undefined,
      (e: unknown) => e,
    );
  expect(error).toBeInstanceOf(OrdoError);
  expect((error as OrdoError).code).toBe(code);
  expect((error as OrdoError).message).toMatch(message);
}

describe('definitions', () => {
  it('a throttle without permits has no lease, and says so', async () => {
    const d = await ordo.throttles.define({ name: 'plain', limit: 5, per: '1s', permits: false });
    expect(d).toMatchObject({ permits: false, leaseMs: null, refundOnFailure: false, limit: 5, perMs: 1000 });
    expect(await ordo.throttles.get('plain')).toMatchObject({ permits: false, leaseMs: null });
    const withPermits = await ordo.throttles.define({ name: 'leased', every: '1s' });
    expect(withPermits).toMatchObject({ permits: true, leaseMs: 300_000 });
  });

  it('refuses what needs a permit, and writes nothing', async () => {
    for (const [extra, what] of [
      [{ concurrency: 1 }, /not concurrency:/],
      [{ lease: '1m' }, /not lease:/],
      [{ refundOnFailure: true }, /not refundOnFailure:/],
      [{ concurrency: 2, lease: '1m' }, /not concurrency or lease:/],
    ] as const) {
      await rejects(
        () => ordo.throttles.define({ name: 'refused', every: '1s', permits: false, ...extra }),
        'invalid_argument',
        what,
      );
    }
    await rejects(
      () => ordo.throttles.define({ name: 'refused', every: '1s', permits: 'no' as never }),
      'invalid_argument',
      /permits/,
    );
    expect(await ordo.throttles.get('refused')).toBeNull();
    // From SQL the same, by the ninth argument of define_throttle.
    await expect(
      raw.query(
        `SELECT * FROM ordo.define_throttle('refused', NULL, NULL, NULL, 3, NULL, false, 'create', false)`,
      ),
    ).rejects.toMatchObject({
      code: 'OX003',
      message: expect.stringMatching(/grants no permits.*not concurrency/),
    });
    expect(await ordo.throttles.get('refused')).toBeNull();
  });

  it('a key of such a throttle may have its own rates but not a concurrency limit', async () => {
    await ordo.throttles.define({ name: 'tiers', limit: 1, per: '1m', permits: false });
    await rejects(
      () => ordo.throttles.setKeyLimits('tiers', 'premium', { concurrency: 2 }),
      'invalid_argument',
      /grants no permits.*cannot have a concurrency limit/,
    );
    expect(await ordo.throttles.setKeyLimits('tiers', 'premium', { limit: 3 })).toMatchObject({
      limit: 3,
      concurrency: null,
    });
    for (let i = 0; i < 3; i++) granted(await ordo.throttles.acquire('tiers', { key: 'premium' }));
    expect((await ordo.throttles.acquire('tiers', { key: 'premium' })).granted).toBe(false);
    granted(await ordo.throttles.acquire('tiers', { key: 'basic' }));
    expect(await ordo.throttles.acquire('tiers', { key: 'basic' })).toMatchObject({
      granted: false,
      reason: 'rate',
    });
    expect(await permitRows('tiers')).toBe(0);
  });
});

describe('a grant is a start only', () => {
  it('writes no permit, counts the start, and ends without a statement', async () => {
    await ordo.throttles.define({ name: 'starts', limit: 100, per: '1s', permits: false });
    const permits: Permit[] = [];
    for (let i = 0; i < 5; i++)
      permits.push(granted(await ordo.throttles.acquire('starts', { key: 'k', holder: 'w' })));
    for (const p of permits) {
      expect(p.expiresAt).toBeNull();
      expect(p.id).toMatch(/^[0-9a-f-]{36}$/);
    }
    expect(new Set(permits.map((p) => p.id)).size).toBe(5);
    expect(await permitRows('starts')).toBe(0);
    const state = await ordo.throttles.state('starts', 'k');
    expect(state).toMatchObject({ starts: 5, running: [], lastOutcome: null, lastPermitId: null });
    expect(state.lastStartAt).toEqual(permits.at(-1)!.acquiredAt);

    const end = await permits[0]!.complete();
    expect(end).toMatchObject({
      id: permits[0]!.id,
      name: 'starts',
      key: 'k',
      outcome: 'completed',
      refunded: false,
    });
    expect(end.endedAt.getTime()).toBeGreaterThanOrEqual(permits[0]!.acquiredAt.getTime());
    expect(await permits[1]!.fail(new Error('upstream down'))).toMatchObject({
      outcome: 'failed',
      refunded: false,
    });
    // Nothing was recorded: the key shows no outcome, and the id names no permit.
    expect(await ordo.throttles.state('starts', 'k')).toMatchObject({ starts: 5, lastOutcome: null });
    await rejects(
      () => ordo.throttles.complete(permits[2]!.id),
      'permit_not_found',
      /does not exist|not found/,
    );
    await rejects(
      () => permits[2]!.extend(),
      'invalid_argument',
      /is not a permit.*permits: false.*no lease/,
    );
    await rejects(
      () => permits[2]!.fail('x', { refund: true }),
      'invalid_argument',
      /is not a permit.*nothing|no record/,
    );
    await rejects(() => permits[2]!.complete({ bogus: 1 } as never), 'invalid_argument', /bogus/);
    const counted = ordo.throttles.counters.get('starts')!;
    expect(counted).toMatchObject({ granted: 5, completed: 1, failed: 1, refunded: 0 });
  });

  it('fail() with retryAfter holds the start’s keys, as a permit’s hold does, never shortening a pause', async () => {
    await ordo.throttles.define({ name: 'upstream', limit: 100, per: '1s', permits: false });
    await ordo.throttles.define({ name: 'upstream_tenant', limit: 100, per: '1s', permits: false });
    const both = granted(
      await ordo.throttles.acquireAll([
        { name: 'upstream', key: 'both' },
        { name: 'upstream_tenant', key: 'long' },
      ]),
    );
    expect(both.expiresAt).toBeNull();
    await ordo.throttles.pause('upstream_tenant', { key: 'long', until: '5s' });
    const longUntil = (await ordo.throttles.state('upstream_tenant', 'long')).pausedUntil!;
    await both.fail('429', { retryAfter: '100ms' });
    expect((await ordo.throttles.state('upstream_tenant', 'long')).pausedUntil).toEqual(longUntil);
    expect(await ordo.throttles.acquire('upstream', { key: 'both' })).toMatchObject({ reason: 'paused' });
    const p = granted(await ordo.throttles.acquire('upstream', { key: 'shop' }));
    await p.fail('429', { retryAfter: '400ms' });
    const refusal = await ordo.throttles.acquire('upstream', { key: 'shop' });
    expect(refusal).toMatchObject({ granted: false, reason: 'paused' });
    expect((await ordo.throttles.state('upstream', 'shop')).pausedUntil).not.toBeNull();
    granted(await ordo.throttles.acquire('upstream', { key: 'other' }));
    await sleep(450);
    granted(await ordo.throttles.acquire('upstream', { key: 'shop' }));
  });

  it('every: 16 callers at once never start closer than the interval', async () => {
    await ordo.throttles.define({ name: 'every', every: '100ms', permits: false });
    const starts: number[] = [];
    const until = Date.now() + 1200;
    await Promise.all(
      Array.from({ length: 16 }, async () => {
        while (Date.now() < until) {
          const r = await ordo.throttles.acquire('every');
          if (r.granted) {
            starts.push(r.acquiredAt.getTime());
            await r.complete();
          } else await sleep(Math.min(r.retryAfterMs, 50));
        }
      }),
    );
    starts.sort((a, b) => a - b);
    expect(starts.length).toBeGreaterThanOrEqual(5);
    for (let i = 1; i < starts.length; i++) expect(starts[i]! - starts[i - 1]!).toBeGreaterThanOrEqual(100);
    expect(await permitRows('every')).toBe(0);
  });

  it('run() runs the task with no lease to keep', async () => {
    await ordo.throttles.define({ name: 'runs', every: '1m', permits: false });
    const ran = await ordo.throttles.run('runs', async ({ permit, signal }) => {
      expect(permit.expiresAt).toBeNull();
      await sleep(50);
      return signal.aborted ? 'aborted' : 'done';
    });
    expect(ran).toEqual({ ran: true, value: 'done' });
    expect(await ordo.throttles.run('runs', () => 'again')).toMatchObject({ ran: false, reason: 'every' });
    await ordo.throttles.define({ name: 'runs_fail', every: '1ms', permits: false });
    await expect(
      ordo.throttles.run('runs_fail', () => {
        throw new Error('task failed');
      }),
    ).rejects.toThrow('task failed');
    expect(await permitRows('runs')).toBe(0);
  });

  it('waits in line like any throttle', async () => {
    await ordo.throttles.define({ name: 'line', every: '200ms', permits: false });
    const [a, b, c] = await Promise.all(
      ['a', 'b', 'c'].map((holder) => ordo.throttles.acquire('line', { holder, wait: '5s' })),
    );
    const times = [a, b, c].map((r) => granted(r!).acquiredAt.getTime()).sort((x, y) => x - y);
    expect(times[1]! - times[0]!).toBeGreaterThanOrEqual(200);
    expect(times[2]! - times[1]!).toBeGreaterThanOrEqual(200);
    expect(await permitRows('line')).toBe(0);
  });
});

describe('with throttles that keep permits', () => {
  it('acquireAll writes permit rows for the items that keep them, and ends those', async () => {
    await ordo.throttles.define({ name: 'global', concurrency: 1 });
    await ordo.throttles.define({ name: 'tenant', limit: 100, per: '1s', permits: false });
    const both = [
      { name: 'global', key: '' },
      { name: 'tenant', key: 't1' },
    ];
    const p = granted(await ordo.throttles.acquireAll(both));
    expect(p.expiresAt).not.toBeNull();
    expect(await permitRows('global')).toBe(1);
    expect(await permitRows('tenant')).toBe(0);
    expect(await ordo.throttles.acquireAll(both)).toMatchObject({ granted: false, reason: 'concurrency' });
    expect(await p.complete()).toMatchObject({ outcome: 'completed' });
    const again = granted(await ordo.throttles.acquireAll(both));
    await again.complete();
    expect((await ordo.throttles.state('tenant', 't1')).starts).toBe(2);
  });

  it('redefined either way, a key counts its live permits only', async () => {
    await ordo.throttles.define({ name: 'switch', concurrency: 1, lease: '1m' });
    const held = granted(await ordo.throttles.acquire('switch', { key: 'k' }));
    await ordo.throttles.setKeyLimits('switch', 'vip', { concurrency: 5 });
    await ordo.throttles.define({ name: 'switch', every: '1ms', permits: false, overwrite: true });
    // The vip key's own concurrency went with the permits.
    expect((await ordo.throttles.state('switch', 'vip')).ownLimits.concurrency).toBeNull();
    for (let i = 0; i < 5; i++) {
      granted(await ordo.throttles.acquire('switch', { key: 'k' }));
      await sleep(2);
    }
    // The starts added no live units: the key's counter still holds the one permit.
    const live = async () =>
      Number(
        (await raw.query(`SELECT live_units FROM ordo.throttle_state WHERE name = 'switch' AND key = 'k'`))
          .rows[0].live_units,
      );
    expect(await live()).toBe(1);
    // The permit granted before lives on and ends as a permit.
    expect(await held.complete()).toMatchObject({ outcome: 'completed' });
    await ordo.throttles.define({ name: 'switch', concurrency: 1, lease: '1m', overwrite: true });
    // The starts without permits left no live units behind: one slot, free.
    const first = granted(await ordo.throttles.acquire('switch', { key: 'k' }));
    expect(await ordo.throttles.acquire('switch', { key: 'k' })).toMatchObject({
      granted: false,
      reason: 'concurrency',
    });
    await first.complete();
    granted(await ordo.throttles.acquire('switch', { key: 'k' }));
    expect(await live()).toBe(1);
  });

  it('a key of a throttle that lost its permits has no concurrency, even if its own limits say so', async () => {
    // As if set_key_limits had raced with the redefinition.
    await ordo.throttles.define({ name: 'raced', every: '1ms', permits: false });
    await raw.query(
      `INSERT INTO ordo.throttle_state (name, key, incarnation, own_concurrency)
       SELECT name, 'k', incarnation, 1 FROM ordo.throttles WHERE name = 'raced'`,
    );
    for (let i = 0; i < 3; i++) {
      granted(await ordo.throttles.acquire('raced', { key: 'k', cost: 2 }));
      await sleep(2);
    }
  });
});

describe('a batch of starts', () => {
  // acquire_all answers a batch all granted without permit rows by a short statement of its
  // own, and any other batch item by item: both must answer alike and count alike.
  const DECIDE = `SELECT request, granted, permit_id, holder, acquired_at, expires_at, retry_after_ms, reason, limit_name
    FROM ordo.acquire_all($1::integer[], $2::text[], $3::text[], $4::integer[], $5::text[])`;
  const batch = (keys: string[], req = keys.map((_, i) => i + 1)) => [
    req,
    keys.map(() => 'batch'),
    keys,
    keys.map(() => 1),
    keys.map((_, i) => `h${i}`),
  ];
  const starts = async () => {
    const { rows } = await raw.query(
      `SELECT key, starts::int FROM ordo.throttle_state WHERE name = 'batch' ORDER BY key`,
    );
    return Object.fromEntries(rows.map((r) => [r.key, r.starts]));
  };

  it('all granted or some refused, each request gets its answer, a unique id and its start counted', async () => {
    await ordo.throttles.define({ name: 'batch', limit: 3, per: '1h', permits: false });
    // a three times, b and c once: all fit.
    const first = await raw.query(DECIDE, batch(['a', 'b', 'a', 'c', 'a']));
    expect(
      first.rows.map((r) => [r.request, r.granted, r.holder, r.expires_at, Number(r.retry_after_ms)]),
    ).toEqual([1, 2, 3, 4, 5].map((i) => [i, true, `h${i - 1}`, null, 0]));
    // A key's grants in one batch start at one instant, on the database's clock.
    const at = (i: number) => (first.rows[i].acquired_at as Date).getTime();
    expect(at(0)).toBe(at(2));
    expect(at(0)).toBe(at(4));
    expect(await starts()).toEqual({ a: 3, b: 1, c: 1 });
    // a is full now: its request is refused, the others granted, in the same batch.
    const second = await raw.query(DECIDE, batch(['b', 'a', 'c']));
    expect(second.rows.map((r) => [r.request, r.granted, r.reason, r.limit_name])).toEqual([
      [1, true, null, null],
      [2, false, 'rate', 'batch'],
      [3, true, null, null],
    ]);
    expect(second.rows[1].permit_id).toBeNull();
    expect(Number(second.rows[1].retry_after_ms)).toBeGreaterThan(0);
    expect(second.rows[0].expires_at).toBeNull();
    expect(await starts()).toEqual({ a: 3, b: 2, c: 2 });
    // Request numbers that do not rise item by item are numbered by their first items, as any.
    const third = await raw.query(DECIDE, batch(['d', 'e', 'd'], [7, 5, 9]));
    expect(third.rows.map((r) => [r.request, r.granted])).toEqual([
      [7, true],
      [5, true],
      [9, true],
    ]);
    expect(await starts()).toMatchObject({ d: 2, e: 1 });
    const ids = [...first.rows, ...second.rows, ...third.rows]
      .map((r) => r.permit_id)
      .filter((id) => id !== null);
    expect(ids).toHaveLength(10);
    for (const id of ids)
      expect(id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(new Set(ids).size).toBe(10);
    expect(await permitRows('batch')).toBe(0);
  });

  it('32 callers at once share statements and get 32 distinct starts', async () => {
    await ordo.throttles.define({ name: 'shared', limit: 1000, per: '1h', permits: false });
    const permits = await Promise.all(
      Array.from({ length: 32 }, (_, i) => ordo.throttles.acquire('shared', { key: `k${i % 5}` })),
    );
    const ids = permits.map((p) => granted(p).id);
    expect(new Set(ids).size).toBe(32);
    const { rows } = await raw.query(
      `SELECT sum(starts)::int AS starts FROM ordo.throttle_state WHERE name = 'shared'`,
    );
    expect(rows[0].starts).toBe(32);
  });
});

describe('from SQL', () => {
  it('try_acquire answers the start with a null expires_at; nothing is stored under its id', async () => {
    await ordo.throttles.define({ name: 'sql_plain', limit: 10, per: '1s', permits: false });
    const { rows } = await raw.query(`SELECT * FROM ordo.try_acquire('sql_plain', 'k', 'psql', 1)`);
    expect(rows[0]).toMatchObject({ granted: true, expires_at: null, holder: 'psql' });
    expect(rows[0].permit_id).toMatch(/^[0-9a-f-]{36}$/);
    await expect(
      raw.query('SELECT * FROM ordo.complete_permit($1)', [rows[0].permit_id]),
    ).rejects.toMatchObject({
      code: 'OX007',
    });
    expect(await permitRows('sql_plain')).toBe(0);
  });
});
