import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo, OrdoError } from '../src/index.js';
import { buildServer } from '../src/server/app.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { type OwnPostgres, ownPostgres } from './support/own-postgres.js';
import { runCliSync } from './support/server-process.js';
import { pastCounterQueue, sqlTake } from './support/sql-take.js';

let db: TestDatabase;
let ordo: Ordo;
const clients: pg.Client[] = [];

beforeAll(async () => {
  db = await freshDatabase();
  ordo = await createOrdo({ databaseUrl: db.url, poolSize: 4 });
});
afterAll(async () => {
  await Promise.all(clients.map((c) => c.end().catch(() => undefined)));
  await ordo?.close();
  await db?.drop();
});

/** A connection of its own, named as an application would name it. */
async function connection(applicationName: string, url = db.url): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url, application_name: applicationName });
  client.on('error', () => undefined);
  await client.connect();
  clients.push(client);
  return client;
}

async function until<T>(probe: () => Promise<T>, done: (value: T) => boolean): Promise<T> {
  for (let i = 0; ; i++) {
    const value = await probe();
    if (done(value) || i > 250) return value;
    await sleep(20);
  }
}

/** A transaction on `w` that takes a number of `name` in `scope` (next({ tx }), or sqlTake) and commits: its value. */
async function takeAndCommit(w: pg.Client, name: string, scope: string, viaSql = false): Promise<number> {
  await w.query('BEGIN');
  const value = viaSql
    ? (await sqlTake(w, ordo.schema, name, scope)).value
    : (await ordo.sequences.next(name, { scope, tx: w })).value;
  await w.query('COMMIT');
  return value;
}

const cli = (...args: string[]) => runCliSync(args, { env: { DATABASE_URL: db.url } });

describe('holders() names the transaction holding a counter', () => {
  it('a transaction left idle, with three waiting behind it, through the library, HTTP and ordo status', async () => {
    await ordo.sequences.define({ name: 'h_invoice', reset: 'year', timeZone: 'Europe/Paris' });
    // The counter exists: a counter created by an open transaction is invisible to others.
    await ordo.sequences.next('h_invoice', { scope: 'acme' });
    expect(await ordo.sequences.holders('h_invoice')).toEqual([]);

    const forgotten = await connection('forgotten-job');
    await forgotten.query('BEGIN');
    const taken = await ordo.sequences.next('h_invoice', { scope: 'acme', tx: forgotten });
    expect(taken.value).toBe(2);
    const pid = (await forgotten.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;

    const waiters = await Promise.all(['w1', 'w2', 'w3'].map((n) => connection(n)));
    const waiting = waiters.map((w) => takeAndCommit(w, 'h_invoice', 'acme'));
    const held = await until(
      () => ordo.sequences.holders('h_invoice'),
      (h) => h[0]?.waiting === 3,
    );
    expect(held).toEqual([
      {
        sequence: 'h_invoice',
        scope: 'acme',
        period: `${new Date().getUTCFullYear()}-01-01`,
        pid,
        preparedGid: null,
        openForMs: expect.any(Number),
        state: 'idle in transaction',
        applicationName: 'forgotten-job',
        waiting: 3,
      },
    ]);
    await sleep(50);
    expect((await ordo.sequences.holders('h_invoice'))[0]!.openForMs).toBeGreaterThanOrEqual(50);
    // Every sequence at once: the same holder.
    expect((await ordo.sequences.holders()).map((h) => h.pid)).toEqual([pid]);

    const app = await buildServer(ordo);
    try {
      const reply = await app.inject({ method: 'GET', url: '/v1/sequences/h_invoice/holders' });
      expect(reply.statusCode).toBe(200);
      expect(reply.json()).toMatchObject([{ pid, state: 'idle in transaction', waiting: 3 }]);
      const missing = await app.inject({ method: 'GET', url: '/v1/sequences/h_nowhere/holders' });
      expect(missing.statusCode).toBe(404);
      expect(missing.json()).toMatchObject({ code: 'sequence_not_found' });
    } finally {
      await app.close();
    }

    const status = cli('status', '--json');
    expect(status.code, status.err).toBe(0);
    expect(JSON.parse(status.out).holders).toMatchObject([
      { sequence: 'h_invoice', scope: 'acme', pid, applicationName: 'forgotten-job', waiting: 3 },
    ]);
    const text = cli('status');
    expect(text.out).toContain('counters held by open transactions');
    expect(text.out).toContain(`pid ${pid} (forgotten-job), idle in transaction`);

    await forgotten.query('COMMIT');
    expect((await Promise.all(waiting)).sort()).toEqual([3, 4, 5]);
    expect(await ordo.sequences.holders('h_invoice')).toEqual([]);
  });

  it('names a number taken in a savepoint, and forgets a rolled-back holder', async () => {
    await ordo.sequences.define({ name: 'h_savepoint' });
    await ordo.sequences.next('h_savepoint');
    const c = await connection('savepointer');
    await c.query('BEGIN');
    await c.query('SAVEPOINT s');
    await ordo.sequences.next('h_savepoint', { tx: c });
    const pid = (await c.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
    expect(await ordo.sequences.holders('h_savepoint')).toMatchObject([
      { scope: '', period: null, pid, waiting: 0 },
    ]);
    await c.query('ROLLBACK TO SAVEPOINT s');
    expect(await ordo.sequences.holders('h_savepoint')).toEqual([]);
    await c.query('ROLLBACK');
    expect((await ordo.sequences.next('h_savepoint')).value).toBe(2);
  });

  it('numbers assigned at commit leave no holder while the business transaction is open', async () => {
    await ordo.sequences.define({ name: 'h_commit' });
    const c = await connection('at-commit');
    await c.query('CREATE TABLE h_docs (number bigint)');
    await ordo.sequences.attach('h_commit', { table: 'h_docs', column: 'number' });
    await c.query('BEGIN');
    await c.query('INSERT INTO h_docs DEFAULT VALUES');
    expect(await ordo.sequences.holders('h_commit')).toEqual([]);
    await c.query('COMMIT');
    expect((await c.query('SELECT number FROM h_docs')).rows).toEqual([{ number: '1' }]);
  });

  it('refuses an unknown sequence and a bad name', async () => {
    const e = await ordo.sequences.holders('h_nowhere').catch((x: unknown) => x);
    expect(e).toBeInstanceOf(OrdoError);
    expect(e).toMatchObject({
      code: 'sequence_not_found',
      message: "The sequence 'h_nowhere' does not exist",
    });
    await expect(ordo.sequences.holders('no such')).rejects.toMatchObject({ code: 'invalid_argument' });
  });

  it('counts each waiter once: on the counter whose row it waits for, else on the holder’s first counter', async () => {
    await ordo.sequences.define({ name: 'h_two' });
    await ordo.sequences.next('h_two', { scope: 'a' });
    await ordo.sequences.next('h_two', { scope: 'b' });
    const holder = await connection('two-counters');
    await holder.query('BEGIN');
    await ordo.sequences.next('h_two', { scope: 'a', tx: holder });
    await ordo.sequences.next('h_two', { scope: 'b', tx: holder });

    // Two take a number of a: next({ tx }) queues on a's counter lock, which the holder took
    // with its number; take() from SQL (INSERT … ON CONFLICT) waits for the holder's
    // transaction alone, naming no row. Two lock b's row: the first holds its tuple lock and
    // waits for the holder, the second waits for the tuple lock.
    const [queued, viaSql] = await Promise.all(['ta1', 'ta2'].map((n) => connection(n)));
    const lockers = await Promise.all(['lb1', 'lb2'].map((n) => connection(n)));
    const taking = [takeAndCommit(queued!, 'h_two', 'a'), takeAndCommit(viaSql!, 'h_two', 'a', true)];
    const locking = lockers.map((w) =>
      w.query(
        `SELECT value FROM "${ordo.schema}".counters WHERE sequence = 'h_two' AND scope = 'b' FOR UPDATE`,
      ),
    );
    const held = await until(
      () => ordo.sequences.holders('h_two'),
      (h) => h.reduce((n, x) => n + x.waiting, 0) === 4,
    );
    expect(held.map((h) => [h.scope, h.waiting])).toEqual([
      ['a', 2],
      ['b', 2],
    ]);
    await holder.query('COMMIT');
    expect((await Promise.all(taking)).sort()).toEqual([3, 4]);
    expect((await Promise.all(locking)).map((r) => r.rows[0].value)).toEqual(['2', '2']);
    expect(await ordo.sequences.holders('h_two')).toEqual([]);
  });
});

describe('holders() counts takers queued on a counter’s lock', () => {
  it('behind a holder of the row alone: the taker waiting for the row, and two queued behind that one', async () => {
    await ordo.sequences.define({ name: 'h_queue' });
    await ordo.sequences.next('h_queue', { scope: 'q' });
    // A transaction that has taken 16 numbers takes later ones on the row alone.
    const holder = await connection('sql-holder');
    await holder.query('BEGIN');
    await pastCounterQueue(holder, ordo.schema, 'h_queue');
    await sqlTake(holder, ordo.schema, 'h_queue', 'q');
    const takers = await Promise.all(['q1', 'q2', 'q3'].map((n) => connection(n)));
    const taking = takers.map((w) => takeAndCommit(w, 'h_queue', 'q'));
    const held = await until(
      () => ordo.sequences.holders('h_queue'),
      (h) => h[0]?.waiting === 3,
    );
    expect(held).toMatchObject([{ scope: 'q', applicationName: 'sql-holder', waiting: 3 }]);
    const counterLocks = await (
      await connection('observer')
    ).query(
      `SELECT count(*) FILTER (WHERE granted)::int AS granted, count(*) FILTER (WHERE NOT granted)::int AS queued
         FROM pg_locks
        WHERE locktype = 'advisory' AND classid = hashtext($1)::oid
          AND objid = "${ordo.schema}".counter_lock('h_queue', 'q', '-infinity')::oid
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
      [`${ordo.schema}.counter`],
    );
    expect(counterLocks.rows[0]).toEqual({ granted: 1, queued: 2 });
    await holder.query('COMMIT');
    expect((await Promise.all(taking)).sort()).toEqual([3, 4, 5]);
    expect(await ordo.sequences.holders('h_queue')).toEqual([]);
  });

  it('two periods of one scope are two counters: a number of another day is not queued behind today’s holder', async () => {
    await ordo.sequences.define({ name: 'h_days', reset: 'day' });
    const today = await connection('today');
    await today.query('BEGIN');
    await ordo.sequences.next('h_days', { scope: 's', tx: today, at: '2031-03-02T10:00:00Z' });
    const other = await connection('other-day');
    await other.query('BEGIN');
    // Queued behind today's holder, it would fail here rather than wait for the test's timeout.
    await other.query("SET LOCAL lock_timeout = '2s'");
    const issued = await ordo.sequences.next('h_days', { scope: 's', tx: other, at: '2031-03-01T10:00:00Z' });
    expect(issued).toMatchObject({ value: 1, period: '2031-03-01' });
    await other.query('COMMIT');
    await today.query('COMMIT');
  });
});

describe('holders() on a server with two-phase commit', () => {
  let server: OwnPostgres | undefined;
  let own: Ordo | undefined;

  beforeAll(async () => {
    // The machine's server has max_prepared_transactions = 0: one of this file's own.
    server = await ownPostgres({ max_prepared_transactions: '2' });
    own = await createOrdo({ databaseUrl: server.url, poolSize: 2 });
  }, 120_000);
  afterAll(async () => {
    await own?.close();
    await server?.stop();
  });

  it('names a prepared transaction holding a counter, with the one waiting behind it', async () => {
    const o = own!;
    await o.sequences.define({ name: 'h_prepared' });
    await o.sequences.next('h_prepared');
    const preparing = await connection('preparing', server!.url);
    await preparing.query('BEGIN');
    expect((await o.sequences.next('h_prepared', { tx: preparing })).value).toBe(2);
    await preparing.query(`PREPARE TRANSACTION 'ordo-holder'`);
    const waiter = await connection('after-prepared', server!.url);
    try {
      await waiter.query('BEGIN');
      const waiting = o.sequences.next('h_prepared', { tx: waiter });
      const held = await until(
        () => o.sequences.holders('h_prepared'),
        (h) => h[0]?.waiting === 1,
      );
      expect(held).toEqual([
        {
          sequence: 'h_prepared',
          scope: '',
          period: null,
          pid: null,
          preparedGid: 'ordo-holder',
          openForMs: expect.any(Number),
          state: null,
          applicationName: null,
          waiting: 1,
        },
      ]);
      await preparing.query(`COMMIT PREPARED 'ordo-holder'`);
      expect((await waiting).value).toBe(3);
      await waiter.query('COMMIT');
    } finally {
      await preparing.query(`ROLLBACK PREPARED 'ordo-holder'`).catch(() => undefined);
    }
    expect(await o.sequences.holders('h_prepared')).toEqual([]);
  });
});
