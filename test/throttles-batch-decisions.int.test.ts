// A batch of requests decided in one statement (acquire_all, as the client's coalesced calls and
// the line's service use it) gets exactly the answers its requests would get one at a time, in
// order: same grants, same reasons, same limits named, and the same state left behind. The
// decision reads its requests as sets, in rounds; this compares it with the plain
// sequence on random batches: costs, requests of several limits, refusals in the middle that
// must take nothing, every policy. Both run from the same state (each in a transaction rolled
// back); the limits refill over hours, so the milliseconds between the two cannot change a
// decision.
import fc from 'fast-check';
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo } from '../src/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';

let db: TestDatabase;
let ordo: Ordo;
let raw: pg.Pool;

const THROTTLES = ['bucket', 'slots', 'once', 'both'] as const;
const KEYS = ['a', 'b', 'c'];

beforeAll(async () => {
  db = await freshDatabase();
  ordo = await createOrdo({ databaseUrl: db.url, poolSize: 2 });
  raw = db.pool(1);
  await ordo.throttles.define({ name: 'bucket', limit: 6, per: '6h' });
  await ordo.throttles.define({ name: 'slots', concurrency: 4 });
  // Waits of different limits never tie: 7 minutes, multiples of 60 and of 70 minutes, 100 ms.
  await ordo.throttles.define({ name: 'once', every: '7m' });
  await ordo.throttles.define({ name: 'both', limit: 5, per: '350m', concurrency: 3 });
  // Some keys start part-used, one paused, one with its own limit.
  await ordo.throttles.acquire('bucket', { key: 'a', cost: 3 });
  await ordo.throttles.acquire('slots', { key: 'b', cost: 2 });
  await ordo.throttles.acquire('once', { key: 'c' });
  await ordo.throttles.pause('both', { key: 'c', until: '1h' });
  await ordo.throttles.setKeyLimits('slots', 'c', { concurrency: 3 });
});
afterAll(async () => {
  await ordo?.close();
  await db?.drop();
});

interface Item {
  name: (typeof THROTTLES)[number];
  key: string;
  cost: number;
}

const item = fc.record({
  name: fc.constantFrom(...THROTTLES),
  key: fc.constantFrom(...KEYS),
  cost: fc.integer({ min: 1, max: 3 }),
});
// A request names each (throttle, key) at most once.
const request = fc.uniqueArray(item, { minLength: 1, maxLength: 3, selector: (i) => `${i.name}/${i.key}` });

type Outcome = { answers: Answer[]; state: unknown[]; live: unknown[] } | { error: string | undefined };
type Answer = {
  granted: boolean;
  reason: string | null;
  limit_name: string | null;
  limit_key: string | null;
  holder: string | null;
};

const DECIDE = `SELECT granted, reason, limit_name, limit_key, holder, permit_id, acquired_at <= expires_at AS ordered
  FROM ordo.acquire_all($1::integer[], $2::text[], $3::text[], $4::integer[], $5::text[]) ORDER BY request`;
/** Each permit's rows: how many (one per item), their holders and their (throttle, key) items. */
const PERMITS = `SELECT id, count(*)::integer AS rows, array_agg(DISTINCT holder) AS holders,
    array_agg(DISTINCT (name, key)::text) AS items
  FROM ordo.permits WHERE id = ANY ($1::uuid[]) GROUP BY id`;
const STATE = `SELECT name, key, starts, tat, every_from, last_start FROM ordo.throttle_state ORDER BY name, key`;
const LIVE = `SELECT name, key, sum(cost)::integer AS units FROM ordo.permits WHERE ended_at IS NULL GROUP BY 1, 2 ORDER BY 1, 2`;

/** Request r (from `first`) is held by `h<r>`. */
function args(requests: Item[][], first = 1): unknown[] {
  const flat = requests.flatMap((items, r) => items.map((i) => ({ ...i, r: r + first })));
  return [
    flat.map((i) => i.r),
    flat.map((i) => i.name),
    flat.map((i) => i.key),
    flat.map((i) => i.cost),
    flat.map((i) => `h${i.r}`),
  ];
}

/**
 * The answers, each granted one checked against its permit's rows: one row per item of its
 * request, all with its holder and no other request's id; then without the permit ids.
 */
async function answered(client: pg.PoolClient, requests: Item[][], first: number): Promise<Answer[]> {
  const rows = (await client.query(DECIDE, args(requests, first))).rows;
  const granted = rows.filter((a) => a.granted);
  const permits = new Map(
    (await client.query(PERMITS, [granted.map((a) => a.permit_id)])).rows.map((p) => [p.id, p]),
  );
  expect(new Set(granted.map((a) => a.permit_id)).size).toBe(granted.length);
  for (const [i, a] of rows.entries()) {
    const holder = `h${i + first}`;
    if (!a.granted) {
      expect([a.holder, a.permit_id, a.ordered]).toEqual([null, null, null]);
      continue;
    }
    expect([a.holder, a.ordered]).toEqual([holder, true]);
    expect(permits.get(a.permit_id)).toMatchObject({
      rows: requests[i]!.length,
      holders: [holder],
      items: requests[i]!.map((item) => `(${item.name},${item.key})`).sort(),
    });
  }
  return rows.map(({ permit_id: _id, ordered: _ordered, ...answer }) => answer);
}

/** The answers, and what they left behind, of deciding `requests` one way; rolled back. */
async function decide(requests: Item[][], together: boolean): Promise<Outcome> {
  const client = await raw.connect();
  try {
    await client.query('BEGIN');
    const answers: Answer[] = [];
    try {
      if (together) answers.push(...(await answered(client, requests, 1)));
      else for (const [i, r] of requests.entries()) answers.push(...(await answered(client, [r], i + 1)));
    } catch (e) {
      // A cost above a key's limit fails the statement either way (none here: costs are at most
      // 3); a failed check of answered() is the test's failure, not an outcome to compare.
      const code = (e as { code?: string }).code;
      if (code === undefined) throw e;
      return { error: code };
    }
    // Times differ by the milliseconds between the two runs: compared as whether they moved.
    const state = (await client.query(STATE)).rows.map((s) => ({
      ...s,
      tat: s.tat !== null,
      every_from: s.every_from !== null,
      last_start: s.last_start !== null,
    }));
    const live = (await client.query(LIVE)).rows;
    return { answers, state, live };
  } finally {
    await client.query('ROLLBACK');
    client.release();
  }
}

function withoutKeys(o: Outcome): Outcome {
  return 'answers' in o ? { ...o, answers: o.answers.map((a) => ({ ...a, limit_key: null })) } : o;
}

describe('a batch decided in one statement', () => {
  it('answers each request as deciding them one at a time would, and leaves the same state', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(request, { minLength: 1, maxLength: 14 }), async (requests) => {
        const together = await decide(requests, true);
        const alone = await decide(requests, false);
        // Two keys of one throttle granted earlier in the batch wait exactly as long (one
        // clock); one at a time, the later grant waits longer. Either key is the right answer.
        expect(withoutKeys(together)).toEqual(withoutKeys(alone));
        if ('answers' in together)
          for (const [i, a] of together.answers.entries())
            if (a.limit_key !== null)
              expect(
                requests[i]!.some((item) => item.name === a.limit_name && item.key === a.limit_key),
              ).toBe(true);
      }),
      { numRuns: 150 },
    );
  });

  it('refuses in the middle without taking anything, and grants the cheaper request after it', async () => {
    // bucket/a has 3 tokens left: 2 granted, 3 refused, 1 granted; slots/b has 2 free: the
    // request of both refused for the bucket takes no slot, so the last one gets two.
    const outcome = await decide(
      [
        [{ name: 'bucket', key: 'a', cost: 2 }],
        [
          { name: 'bucket', key: 'a', cost: 3 },
          { name: 'slots', key: 'b', cost: 1 },
        ],
        [{ name: 'bucket', key: 'a', cost: 1 }],
        [{ name: 'slots', key: 'b', cost: 2 }],
      ],
      true,
    );
    expect(outcome).toMatchObject({
      answers: [
        { granted: true, reason: null, limit_name: null, limit_key: null },
        { granted: false, reason: 'rate', limit_name: 'bucket', limit_key: 'a' },
        { granted: true, reason: null, limit_name: null, limit_key: null },
        { granted: true, reason: null, limit_name: null, limit_key: null },
      ],
    });
  });

  it('refuses arguments a caller in SQL can get wrong, one item or several, writing nothing', async () => {
    // [req, names, keys, costs, holders]: each shape once with one item and once among others.
    const long = 'x'.repeat(201);
    const bad: [unknown[], RegExp][] = [];
    for (const [req, name, key, cost, holder] of [
      [null, 'slots', 'a', 1, 'h'],
      [1, null, 'a', 1, 'h'],
      [1, 'slots', null, 1, 'h'],
      [1, 'slots', long, 1, 'h'],
      [1, 'slots', 'a', null, 'h'],
      [1, 'slots', 'a', 0, 'h'],
      [1, 'slots', 'a', 1_000_001, 'h'],
      [1, 'slots', 'a', 1, long],
    ]) {
      const shape =
        /Each item needs a request number, a throttle name, a key \(a text of at most 200 characters\)/;
      bad.push([[[req], [name], [key], [cost], [holder]], shape]);
      bad.push([
        [
          [1, req],
          ['bucket', name],
          ['b', key],
          [1, cost],
          ['h', holder],
        ],
        shape,
      ]);
    }
    bad.push([[[1, 2], ['slots'], ['a', 'b'], [1, 1], ['h', 'h']], /Each item needs/]);
    bad.push([[[1], ['slots'], ['a'], [1], ['h', 'h']], /Each item needs/]);
    bad.push([
      [
        [1, 1],
        ['slots', 'slots'],
        ['a', 'a'],
        [1, 1],
        ['h', 'h'],
      ],
      /names each throttle and key at most once/,
    ]);
    const before = await raw.query(STATE);
    const live = await raw.query(LIVE);
    for (const [values, message] of bad) {
      const e = await raw.query(DECIDE, values).then(
        () => undefined,
        (error: { code?: string; message: string }) => error,
      );
      expect(e, JSON.stringify(values)).toMatchObject({
        code: 'OX003',
        message: expect.stringMatching(message),
      });
    }
    expect((await raw.query(STATE)).rows).toEqual(before.rows);
    expect((await raw.query(LIVE)).rows).toEqual(live.rows);
    // A NULL holder is the session's, not an error; the same request with one is granted.
    const client = await raw.connect();
    try {
      await client.query('BEGIN');
      const { rows } = await client.query(DECIDE, [[1], ['slots'], ['a'], [1], [null]]);
      const [pid] = (await client.query('SELECT pg_backend_pid() AS pid')).rows.map((r) => r.pid);
      expect(rows).toMatchObject([
        {
          granted: true,
          reason: null,
          limit_name: null,
          limit_key: null,
          holder: expect.stringMatching(`:${pid}$`),
        },
      ]);
    } finally {
      await client.query('ROLLBACK');
      client.release();
    }
  });

  it('groups items by request number, in the order of their first item', async () => {
    const client = await raw.connect();
    try {
      await client.query('BEGIN');
      // Request 7's two items are apart; request 3 comes second. once/a grants one start only.
      const { rows } = await client.query(
        `SELECT request, granted, reason FROM ordo.acquire_all(ARRAY[7, 3, 7], ARRAY['once', 'once', 'slots'],
                                                             ARRAY['a', 'a', 'a'], ARRAY[1, 1, 1], ARRAY['x', 'y', 'x'])`,
      );
      expect(rows).toEqual([
        { request: 7, granted: true, reason: null },
        { request: 3, granted: false, reason: 'every' },
      ]);
    } finally {
      await client.query('ROLLBACK');
      client.release();
    }
  });
});
