import { spawn } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';
import fc from 'fast-check';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo } from '../src/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { pastCounterQueue, sqlTake } from './support/sql-take.js';

let db: TestDatabase;
let ordo: Ordo;
let raw: pg.Pool;

beforeAll(async () => {
  db = await freshDatabase();
  ordo = await createOrdo({ databaseUrl: db.url, poolSize: 8 });
  raw = db.pool(40);
  await raw.query('CREATE TABLE docs (seq text NOT NULL, scope text NOT NULL, number bigint NOT NULL)');
});
afterAll(async () => {
  await ordo?.close();
  await db?.drop();
});

const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => from + i);
const sorted = (xs: number[]) => [...xs].sort((a, b) => a - b);

async function committed(seq: string, scope = ''): Promise<number[]> {
  const { rows } = await raw.query('SELECT number FROM docs WHERE seq = $1 AND scope = $2 ORDER BY number', [
    seq,
    scope,
  ]);
  return rows.map((r) => Number(r.number));
}

/**
 * One business transaction: take a number, store a document with it, commit or roll back. The
 * number from next({ tx }) (take_value()), or with `viaSql` from a SQL call of take(); with
 * `rowOnly` the transaction first takes 16 numbers of other scopes (pastCounterQueue): it queues on the row.
 */
async function business(
  seq: string,
  opts: {
    scope?: string;
    at?: string;
    rollback: boolean;
    holdMs?: number;
    viaSql?: boolean;
    rowOnly?: boolean;
  },
): Promise<{ value: number; period: string | null }> {
  const client = await raw.connect();
  try {
    await client.query('BEGIN');
    if (opts.rowOnly) await pastCounterQueue(client, ordo.schema, seq, opts.at);
    const issued = opts.viaSql
      ? await sqlTake(client, ordo.schema, seq, opts.scope ?? '', opts.at)
      : await ordo.sequences.next(seq, { tx: client, scope: opts.scope, at: opts.at });
    await client.query('INSERT INTO docs (seq, scope, number) VALUES ($1, $2, $3)', [
      seq,
      opts.scope ?? '',
      issued.value,
    ]);
    if (opts.holdMs) await sleep(opts.holdMs);
    await client.query(opts.rollback ? 'ROLLBACK' : 'COMMIT');
    return issued;
  } finally {
    client.release();
  }
}

describe('gapless under concurrency', () => {
  it('36 concurrent transactions, a third rolling back: committed numbers are exactly 1..k', async () => {
    await ordo.sequences.define({ name: 'rollbacks' });
    const outcomes = range(1, 36).map((i) => i % 3 === 0);
    const results = await Promise.all(
      outcomes.map((rollback, i) => business('rollbacks', { rollback, holdMs: i % 4 })),
    );
    const k = outcomes.filter((r) => !r).length;
    expect(await committed('rollbacks')).toEqual(range(1, k));
    // Rolled-back numbers were handed out again: more numbers were issued than committed.
    expect(results.length).toBe(36);
    expect(await ordo.nextval('rollbacks')).toBe(k + 1);
  });

  it('takers in transactions queued on the counter’s lock, and transactions past 16 counters and standalone calls queued on its row, share one counter: 1..k', async () => {
    await ordo.sequences.define({ name: 'mixed_queues', reset: 'day' });
    const day = '2030-02-01T12:00:00Z';
    const standalone = async () => {
      const issued = await ordo.sequences.next('mixed_queues', { scope: 't', at: day });
      await raw.query('INSERT INTO docs (seq, scope, number) VALUES ($1, $2, $3)', [
        'mixed_queues',
        't',
        issued.value,
      ]);
      return true;
    };
    const outcomes = await Promise.all(
      range(1, 48).map((i) => {
        if (i % 3 === 2) return standalone();
        const rollback = i % 4 === 1;
        return business('mixed_queues', {
          scope: 't',
          at: day,
          rollback,
          holdMs: i % 5,
          viaSql: i % 2 === 0,
          rowOnly: i % 3 === 0,
        }).then(() => !rollback);
      }),
    );
    const k = outcomes.filter(Boolean).length;
    expect(await committed('mixed_queues', 't')).toEqual(range(1, k));
  });

  it('the first calls of a new day racing each other get 1..n with no error', async () => {
    await ordo.sequences.define({ name: 'daily', reset: 'day', timeZone: 'Europe/Paris' });
    // In transactions, all at the same instant of a day never seen before.
    const inTx = await Promise.all(
      range(1, 30).map(() => business('daily', { scope: 'tx', at: '2031-05-05T10:00:00Z', rollback: false })),
    );
    expect(sorted(inTx.map((i) => i.value))).toEqual(range(1, 30));
    expect(new Set(inTx.map((i) => i.period))).toEqual(new Set(['2031-05-05']));
    // Standalone, each at a different instant of the same new day: distinct coalescing keys,
    // so these are separate statements racing to create the day's row.
    const standalone = await Promise.all(
      range(1, 30).map((i) =>
        ordo.sequences.next('daily', {
          scope: 'standalone',
          at: new Date(Date.UTC(2031, 4, 6, 0, 0, i)).toISOString(),
        }),
      ),
    );
    expect(sorted(standalone.map((i) => i.value))).toEqual(range(1, 30));
  });

  it('thousands of concurrent standalone calls on one key: exactly 1..n in far fewer statements', async () => {
    let statements = 0;
    const counting = new pg.Pool({ connectionString: db.url, max: 8 });
    const query = counting.query.bind(counting) as (...args: any[]) => any;
    (counting as any).query = (...args: any[]) => {
      if (typeof args[0] === 'string' && args[0].includes('.take(')) statements++;
      return query(...args);
    };
    const local = await createOrdo({ pool: counting });
    try {
      await local.sequences.define({ name: 'hot' });
      const n = 5000;
      const values = await Promise.all(range(1, n).map(() => local.nextval('hot', { scope: 'k' })));
      expect(sorted(values)).toEqual(range(1, n));
      expect(statements).toBeLessThan(n / 20);
      // Every caller got its own number: callers that arrived together got increasing values.
      expect(values[0]).toBe(1);
    } finally {
      await local.close();
      await counting.end();
    }
  });

  it('a process killed with SIGKILL while holding a number gives it back', async () => {
    await ordo.sequences.define({ name: 'killed' });
    expect(await ordo.nextval('killed')).toBe(1);
    const child = spawn(
      process.execPath,
      ['--import', 'tsx', 'test/support/take-and-hang.ts', db.url, 'killed'],
      {
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
    const taken = await new Promise<number>((resolve, reject) => {
      child.stdout.on('data', (chunk: Buffer) => {
        const m = /taken (\d+)/.exec(chunk.toString());
        if (m) resolve(Number(m[1]));
      });
      child.on('exit', (code) => reject(new Error(`child exited early with ${code}`)));
    });
    expect(taken).toBe(2);
    const exited = new Promise((resolve) => child.on('exit', resolve));
    child.kill('SIGKILL');
    await exited;
    // The killed process's transaction is rolled back by PostgreSQL: its number comes back.
    expect(await business('killed', { rollback: false })).toMatchObject({ value: 2 });
  });

  it('property: random interleavings of commits and rollbacks never leave a gap or a duplicate', async () => {
    let run = 0;
    const step = fc.record({
      scope: fc.constantFrom('a', 'b'),
      takes: fc.integer({ min: 1, max: 3 }),
      many: fc.boolean(),
      rollback: fc.boolean(),
      delayMs: fc.integer({ min: 0, max: 4 }),
    });
    type Step = { scope: string; takes: number; many: boolean; rollback: boolean; delayMs: number };
    const program = fc.array(fc.array(step, { minLength: 1, maxLength: 4 }), { minLength: 2, maxLength: 6 });
    await fc.assert(
      fc.asyncProperty(program, fc.integer({ min: 0, max: 6 }), async (workers, standaloneCalls) => {
        const seq = `prop_${++run}`;
        await ordo.sequences.define({ name: seq });
        const expected = { a: 0, b: 0 };
        const worker = async (steps: Step[]) => {
          for (const s of steps) {
            const client = await raw.connect();
            try {
              await client.query('BEGIN');
              const issued = s.many
                ? await ordo.sequences.nextMany(seq, s.takes, { tx: client, scope: s.scope })
                : [];
              for (let i = 0; !s.many && i < s.takes; i++) {
                issued.push(await ordo.sequences.next(seq, { tx: client, scope: s.scope }));
              }
              for (const i of issued) {
                await client.query('INSERT INTO docs (seq, scope, number) VALUES ($1, $2, $3)', [
                  seq,
                  s.scope,
                  i.value,
                ]);
              }
              await sleep(s.delayMs);
              await client.query(s.rollback ? 'ROLLBACK' : 'COMMIT');
              if (!s.rollback) expected[s.scope as 'a' | 'b'] += s.takes;
            } finally {
              client.release();
            }
          }
        };
        const standalone = async () => {
          for (let i = 0; i < standaloneCalls; i++) {
            const v = await ordo.nextval(seq, { scope: 'a' });
            await raw.query('INSERT INTO docs (seq, scope, number) VALUES ($1, $2, $3)', [seq, 'a', v]);
            expected.a++;
          }
        };
        await Promise.all([...workers.map(worker), standalone()]);
        expect(await committed(seq, 'a')).toEqual(range(1, expected.a));
        expect(await committed(seq, 'b')).toEqual(range(1, expected.b));
      }),
      { numRuns: 25 },
    );
  });
});

describe('remove while values are being taken', () => {
  it('a call racing a removal gets sequence_not_found, and nothing is left behind', async () => {
    await ordo.sequences.define({ name: 'doomed', reset: 'day' });
    // Another process removes the sequence in a transaction that is still open.
    const remover = await raw.connect();
    await remover.query('BEGIN');
    await remover.query("DELETE FROM ordo.sequences WHERE name = 'doomed'");
    // Five transactions still see the definition, so they try to create counter rows; their
    // foreign-key checks wait for the remover.
    const clients = await Promise.all(range(1, 5).map(() => raw.connect()));
    const racing = Promise.allSettled(
      clients.map(async (client, i) => {
        await client.query('BEGIN');
        try {
          return await ordo.sequences.next('doomed', { tx: client, at: `2030-01-0${i + 1}T00:00:00Z` });
        } finally {
          await client.query('ROLLBACK');
        }
      }),
    );
    // Wait until all five are blocked on the remover's lock, not merely scheduled.
    for (let waiting = 0; waiting < 5; await sleep(10)) {
      const { rows } = await raw.query(
        "SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
      );
      waiting = rows[0].n;
    }
    await remover.query('COMMIT');
    remover.release();
    for (const r of await racing) {
      expect(r.status).toBe('rejected');
      expect((r as PromiseRejectedResult).reason).toMatchObject({
        code: 'sequence_not_found',
        message: 'The sequence was removed while a value was being taken',
      });
    }
    for (const c of clients) c.release();
    const left = await raw.query("SELECT count(*)::int AS n FROM ordo.counters WHERE sequence = 'doomed'");
    expect(left.rows[0].n).toBe(0);
  });
});

describe('coalescing across keys', () => {
  it('a batch never deadlocks with a transaction that locks its rows in another order', async () => {
    await ordo.sequences.define({ name: 'crossed' });
    const user = await raw.connect();
    try {
      await user.query('BEGIN');
      // Were there a deadlock, this session would detect it first and be the one aborted.
      await user.query("SET LOCAL deadlock_timeout = '200ms'");
      // The user's transaction holds scope b, and will ask for scope a next.
      const b1 = await ordo.sequences.next('crossed', { scope: 'b', tx: user });
      // Standalone calls for a and b in the same tick: one batch, which locks a, then waits on b.
      const burst = Promise.all(
        ['a', 'b', 'a', 'b', 'a'].map((scope) => ordo.sequences.next('crossed', { scope })),
      );
      for (let waiting = 0; waiting < 1; await sleep(5)) {
        const { rows } = await raw.query(
          "SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        );
        waiting = rows[0].n;
      }
      // Opposite order: a deadlock if the batch kept a locked while waiting on b.
      const a1 = await ordo.sequences.next('crossed', { scope: 'a', tx: user });
      await user.query('COMMIT');
      const issued = await burst;
      const values = (scope: string, own: number) =>
        sorted([own, ...issued.filter((i) => i.scope === scope).map((i) => i.value)]);
      expect(values('a', a1.value)).toEqual([1, 2, 3, 4]);
      expect(values('b', b1.value)).toEqual([1, 2, 3]);
    } finally {
      user.release();
    }
  });

  it('many keys in one batch: every key gapless, far fewer statements than calls', async () => {
    await ordo.sequences.define({ name: 'spread', reset: 'day' });
    const scopes = range(1, 64).map((i) => `k${i}`);
    const calls = range(1, 20).flatMap(() => scopes.map((scope) => ({ scope })));
    const issued = await Promise.all(calls.map((c) => ordo.sequences.next('spread', c)));
    for (const scope of scopes) {
      expect(sorted(issued.filter((i) => i.scope === scope).map((i) => i.value))).toEqual(range(1, 20));
    }
  });

  it('take_many from SQL leaves the caller transaction’s lock_timeout as it was', async () => {
    const client = await raw.connect();
    try {
      await client.query('BEGIN');
      await client.query("SET LOCAL lock_timeout = '7s'");
      await client.query(
        "SELECT * FROM ordo.take_many(ARRAY['spread'], ARRAY['sql'], ARRAY[NULL]::timestamptz[], ARRAY[2])",
      );
      expect((await client.query('SHOW lock_timeout')).rows[0].lock_timeout).toBe('7s');
      await client.query('ROLLBACK');
    } finally {
      client.release();
    }
  });
});

describe('batched standalone calls at the edges', () => {
  it('wraps a cycling sequence inside one batch, per key, in arrival order', async () => {
    await ordo.sequences.define({ name: 'wrapping', start: 1, maxValue: 3, cycle: true });
    // Same tick: one take_many for both scopes, 7 values for 'x' (wrapping twice) and 4 for 'y'.
    const calls = ['x', 'y', 'x', 'x', 'y', 'x', 'x', 'y', 'x', 'y', 'x'].map((scope) =>
      ordo.sequences.next('wrapping', { scope }),
    );
    const issued = await Promise.all(calls);
    const of = (scope: string) => issued.filter((i) => i.scope === scope).map((i) => i.value);
    expect(of('x')).toEqual([1, 2, 3, 1, 2, 3, 1]);
    expect(of('y')).toEqual([1, 2, 3, 1]);
  });

  it('an exhausted key in a batch does not stop the other keys, and its last values still go out', async () => {
    await ordo.sequences.define({ name: 'small', maxValue: 2 });
    await ordo.sequences.define({ name: 'roomy' });
    const calls = [
      ...range(1, 4).map(() => ordo.sequences.next('small', { scope: 's' })),
      ...range(1, 3).map(() => ordo.sequences.next('roomy', { scope: 'r' })),
    ];
    const settled = await Promise.allSettled(calls);
    const values = settled.map((r) =>
      r.status === 'fulfilled' ? r.value.value : (r.reason as { code: string }).code,
    );
    expect(values).toEqual([1, 2, 'sequence_exhausted', 'sequence_exhausted', 1, 2, 3]);
  });
});

describe('coalesced nextMany', () => {
  it('concurrent standalone nextMany calls share statements; each caller gets consecutive values', async () => {
    let statements = 0;
    const counting = new pg.Pool({ connectionString: db.url, max: 4 });
    const query = counting.query.bind(counting) as (...args: any[]) => any;
    (counting as any).query = (...args: any[]) => {
      if (typeof args[0] === 'string' && /\.take(_many)?\(/.test(args[0])) statements++;
      return query(...args);
    };
    const local = await createOrdo({ pool: counting });
    try {
      await local.sequences.define({ name: 'many_hot' });
      const counts = range(1, 200).map((i) => 1 + (i % 7));
      const results = await Promise.all(counts.map((n) => local.sequences.nextMany('many_hot', n)));
      for (const [i, issued] of results.entries()) {
        expect(issued).toHaveLength(counts[i]!);
        const first = issued[0]!.value;
        expect(issued.map((x) => x.value)).toEqual(range(first, first + counts[i]! - 1));
      }
      const total = counts.reduce((a, b) => a + b, 0);
      expect(sorted(results.flat().map((x) => x.value))).toEqual(range(1, total));
      expect(statements).toBeLessThan(20);
    } finally {
      await local.close();
      await counting.end();
    }
  });
});

describe('concurrent definitions', () => {
  it('ten concurrent defines of a new name: one creates it, the others get sequence_exists (both kinds)', async () => {
    for (const kind of ['gapless', 'batched'] as const) {
      for (let round = 0; round < 5; round++) {
        const name = `racing_${kind}_${round}`;
        const settled = await Promise.allSettled(
          range(1, 10).map(() => ordo.sequences.define({ name, kind })),
        );
        expect(settled.filter((s) => s.status === 'fulfilled')).toHaveLength(1);
        for (const s of settled.filter((s) => s.status === 'rejected')) {
          expect((s as PromiseRejectedResult).reason).toMatchObject({ code: 'sequence_exists' });
        }
        const tolerant = await Promise.all(
          range(1, 10).map(() => ordo.sequences.define({ name, kind, ifNotExists: true })),
        );
        expect(new Set(tolerant.map((d) => d.epoch)).size).toBe(1);
      }
    }
  });
});
