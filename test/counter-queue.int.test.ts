// Every take of a gapless counter queues on the counter's own advisory lock, so
// that takers of one hot counter wait in the lock table rather than on its row, and a
// transaction holds at most 16 such locks: PostgreSQL's shared lock table holds
// max_locks_per_transaction × max_connections locks for every session at once, and one
// transaction numbering from thousands of counters must not fill it.
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo } from '../src/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { COUNTERS_QUEUED } from './support/sql-take.js';
import { until } from './support/until.js';

let db: TestDatabase;
let ordo: Ordo;
let pool: pg.Pool;

beforeAll(async () => {
  db = await freshDatabase('ordo_counter_queue');
  ordo = await createOrdo({ databaseUrl: db.url });
  pool = db.pool(8);
});
afterAll(async () => {
  await ordo?.close();
  await db?.drop();
});

/** The counter locks `pid` holds (granted) and waits for, of any counter. */
async function counterLocks(pid: number): Promise<{ granted: number; waiting: number }> {
  const { rows } = await pool.query(
    `SELECT count(*) FILTER (WHERE granted)::int AS granted, count(*) FILTER (WHERE NOT granted)::int AS waiting
       FROM pg_locks
      WHERE locktype = 'advisory' AND classid = hashtext($1)::oid AND objsubid = 2 AND pid = $2`,
    [`${ordo.schema}.counter`, pid],
  );
  return rows[0];
}

/** A transaction open on a client of its own: its pid, and the client (released with release(true): closed). */
async function transaction(): Promise<{ client: pg.PoolClient; pid: number }> {
  const client = await pool.connect();
  await client.query('BEGIN');
  const pid = (await client.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
  return { client, pid };
}

/** `body` in a transaction of its own (its client closed afterwards, whatever happens). */
async function inTransaction(
  body: (t: { client: pg.PoolClient; pid: number }) => Promise<void>,
): Promise<void> {
  const t = await transaction();
  try {
    await body(t);
  } finally {
    t.client.release(true);
  }
}

describe('a transaction numbering from many counters', () => {
  it.each([
    [
      'take_value() (what next({ tx }) sends)',
      (s: string) => `("${s}".take_value('many', 'tenant-' || i))[1]::int`,
    ],
    [
      'take() (what nextval() and SQL callers run)',
      (s: string) => `(SELECT t.value FROM "${s}".take('many', 'tenant-' || i, now(), 1) AS t)`,
    ],
  ])(
    'through %s: 20,000 counters in one transaction commit, holding 16 counter locks, and other sessions lock meanwhile',
    async (_, call) => {
      await ordo.sequences.define({ name: 'many', overwrite: true });
      await pool.query(`DELETE FROM "${ordo.schema}".counters WHERE sequence = 'many'`);
      await inTransaction(async ({ client, pid }) => {
        const { rows } = await client.query(
          `SELECT count(*)::int AS n, min(v)::int AS lo, max(v)::int AS hi
           FROM (SELECT ${call(ordo.schema)} AS v FROM generate_series(1, 20000) AS i) AS taken`,
        );
        expect(rows[0]).toEqual({ n: 20_000, lo: 1, hi: 1 });
        expect(await counterLocks(pid)).toEqual({ granted: COUNTERS_QUEUED, waiting: 0 });
        // Another session takes locks of its own while that transaction is open: the shared lock
        // table is not full.
        expect((await ordo.sequences.next('many', { scope: 'elsewhere' })).value).toBe(1);
        await client.query('COMMIT');
      });
      const { rows } = await pool.query(
        `SELECT count(*)::int AS n, count(*) FILTER (WHERE value = 1)::int AS first
         FROM "${ordo.schema}".counters WHERE sequence = 'many' AND scope LIKE 'tenant-%'`,
      );
      expect(rows[0]).toEqual({ n: 20_000, first: 20_000 });
    },
  );

  // The bound counts the transaction's own takes: PostgreSQL's count of a transaction's writes
  // (pg_stat_get_xact_tuples_*) holds every write since the backend last flushed its statistics,
  // at most once a second, so on a busy connection a bound read from it would be reached in most
  // transactions, which would then wait on the row. The last transaction takes two numbers: its
  // first before it has a transaction id (not counted), its second after (counted); both queue.
  it.each([
    [
      'take_value() (what next({ tx }) sends)',
      (s: string, scope: string) => `SELECT "${s}".take_value('busy', '${scope}')`,
    ],
    [
      'take() (what nextval() and SQL callers run)',
      (s: string, scope: string) => `SELECT * FROM "${s}".take('busy', '${scope}', now(), 1)`,
    ],
  ])('through %s: a connection that numbered 40 times this second still queues', async (_, call) => {
    await ordo.sequences.define({ name: 'busy', overwrite: true });
    await inTransaction(async ({ client, pid }) => {
      await client.query('COMMIT');
      for (let i = 0; i < 40; i++) await client.query(call(ordo.schema, 'hot'));
      await client.query('BEGIN');
      await client.query(call(ordo.schema, 'hot'));
      await client.query(call(ordo.schema, 'warm'));
      expect(await counterLocks(pid)).toEqual({ granted: 2, waiting: 0 });
      await client.query('COMMIT');
    });
  });

  it('a savepoint rolled back gives back the locks it queued on and their places in the count', async () => {
    await ordo.sequences.define({ name: 'undone' });
    await inTransaction(async ({ client, pid }) => {
      await client.query('SAVEPOINT numbering');
      for (let i = 0; i < 20; i++) await ordo.sequences.next('undone', { scope: `s${i}`, tx: client });
      expect(await counterLocks(pid)).toEqual({ granted: COUNTERS_QUEUED, waiting: 0 });
      await client.query('ROLLBACK TO SAVEPOINT numbering');
      expect(await counterLocks(pid)).toEqual({ granted: 0, waiting: 0 });
      expect((await ordo.sequences.next('undone', { scope: 'after', tx: client })).value).toBe(1);
      expect(await counterLocks(pid)).toEqual({ granted: 1, waiting: 0 });
      await client.query('COMMIT');
    });
  });

  it('a transaction with a transaction id before its first number queues on 15 counters', async () => {
    await ordo.sequences.define({ name: 'fifteen' });
    await inTransaction(async ({ client, pid }) => {
      await client.query('SELECT pg_current_xact_id()');
      for (let i = 0; i < 20; i++) await ordo.sequences.next('fifteen', { scope: `s${i}`, tx: client });
      expect(await counterLocks(pid)).toEqual({ granted: COUNTERS_QUEUED - 1, waiting: 0 });
      await client.query('COMMIT');
    });
  });

  it('next({ tx }) on 40 scopes queues on the locks of the first 16 only, and numbers every one', async () => {
    await ordo.sequences.define({ name: 'forty' });
    await inTransaction(async ({ client, pid }) => {
      const values: number[] = [];
      for (let i = 0; i < 40; i++)
        values.push((await ordo.sequences.next('forty', { scope: `s${i}`, tx: client })).value);
      expect(values).toEqual(Array(40).fill(1));
      expect(await counterLocks(pid)).toEqual({ granted: COUNTERS_QUEUED, waiting: 0 });
      // A second number of a counter past the 16: from its row, in order.
      expect((await ordo.sequences.next('forty', { scope: 's39', tx: client })).value).toBe(2);
      await client.query('COMMIT');
    });
  });
});

describe('numbering at commit queues on the counter’s lock', () => {
  it('three commits of one counter wait in the lock table behind its holder, then number in turn', async () => {
    await ordo.sequences.define({ name: 'at_commit_queue' });
    await pool.query(
      'CREATE TABLE queued_invoices (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, tenant text NOT NULL, number bigint)',
    );
    await ordo.sequences.attach('at_commit_queue', {
      table: 'queued_invoices',
      column: 'number',
      scopeColumn: 'tenant',
    });
    // The counter exists: one created by an open transaction is invisible to holders().
    await ordo.sequences.next('at_commit_queue', { scope: 'acme' });
    const holder = await transaction();
    const committers = await Promise.all([1, 2, 3].map(() => transaction()));
    try {
      expect((await ordo.sequences.next('at_commit_queue', { scope: 'acme', tx: holder.client })).value).toBe(
        2,
      );
      for (const c of committers)
        await c.client.query("INSERT INTO queued_invoices (tenant) VALUES ('acme')");
      const committing = committers.map((c) => c.client.query('COMMIT'));
      await until('three commits queued on the counter’s lock', async () => {
        const locks = await Promise.all(committers.map((c) => counterLocks(c.pid)));
        return locks.every((l) => l.waiting === 1);
      });
      expect(await ordo.sequences.holders('at_commit_queue')).toMatchObject([
        { scope: 'acme', pid: holder.pid, waiting: 3 },
      ]);
      await holder.client.query('COMMIT');
      await Promise.all(committing);
    } finally {
      for (const c of [holder, ...committers]) c.client.release(true);
    }
    const { rows } = await pool.query('SELECT number::int FROM queued_invoices ORDER BY number');
    expect(rows.map((r) => r.number)).toEqual([3, 4, 5]);
  });
});
