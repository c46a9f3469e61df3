/**
 * A connection the server ends at the moment ordo's pool hands it to the next caller must not
 * end the process. pg-pool hands a connection out inside the socket read that finished the
 * previous holder's last statement; a "terminating connection" in that same read reaches a
 * client nobody listens to yet, an uncaught exception unless ordo listens for it.
 */
import { spawnSync } from 'node:child_process';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { OrdoError } from '../src/index.js';
import { type OrdoDatabase, ordoDatabase } from './support/database.js';

let t: OrdoDatabase;
beforeAll(async () => {
  // One connection: the second transaction waits for the first one's.
  t = await ordoDatabase({ poolSize: 1 });
});
afterAll(() => t?.close());

/**
 * Ends a backend from another process, synchronously: the event loop is blocked meanwhile, so
 * whatever the server sends before and after arrives in one read.
 */
function terminateNow(pid: number): void {
  const psql = spawnSync('psql', [t.db.url, '-X', '-Atc', `SELECT pg_terminate_backend(${pid})`]);
  expect(psql.status, psql.stderr.toString()).toBe(0);
}

it('a connection terminated as it passes from a call to a waiting transaction: it begins again on a new one, and the process lives on', async () => {
  const uncaught: unknown[] = [];
  const hear = (e: unknown) => uncaught.push(e);
  process.on('uncaughtException', hear);
  try {
    for (let round = 0; round < 5; round++) {
      const pid = await t.ordo.transaction(
        async (tx) => (await tx.query('SELECT pg_backend_pid() AS pid')).rows[0].pid,
      );
      // A call without tx runs on the pool's one connection; the transaction waits for it.
      const first = t.ordo.outbox.append('connection-loss', { type: 'Tick', data: { round } });
      const second = t.ordo.transaction((tx) => tx.query('SELECT 1 AS one'));
      // Blocks the event loop once the append is on its way: its answer and the server's
      // "terminating connection" then arrive in one read.
      await new Promise((resolve) => setImmediate(resolve));
      terminateNow(pid);
      expect((await first)[0]!.position).toBeTypeOf('number');
      // Nothing ran before its BEGIN: it is begun again on a new connection.
      expect((await second).rows).toEqual([{ one: 1 }]);
    }
    expect(uncaught).toEqual([]);
  } finally {
    process.off('uncaughtException', hear);
  }
});

it('a connection the server ended while it sat in the pool: the BEGIN sent on it fails, and the transaction begins again on a new one', async () => {
  for (let round = 0; round < 3; round++) {
    const pid = await t.ordo.transaction(
      async (tx) => (await tx.query('SELECT pg_backend_pid() AS pid')).rows[0].pid,
    );
    // The server's end waits unread in the socket while the transaction takes that connection
    // and sends BEGIN on it (nothing is read in between): BEGIN gets it as its answer.
    terminateNow(pid);
    const calls = { fn: 0 };
    const begun = t.ordo.transaction(async (tx) => {
      calls.fn++;
      return (await tx.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
    });
    expect(await begun).not.toBe(pid);
    expect(calls.fn).toBe(1);
  }
});

it("a caller's transaction whose connection was cut: each call on it fails at once with database_unavailable, not after connectTimeout", async () => {
  const tx = await t.sql.connect();
  const cut = new Promise<void>((resolve) => tx.on('error', () => resolve()));
  try {
    await tx.query('BEGIN');
    const { rows } = await tx.query('SELECT pg_backend_pid() AS pid');
    terminateNow(rows[0].pid);
    await cut;
    await t.ordo.sequences.define({ name: 'cut_tx', ifNotExists: true });
    const calls: [string, () => Promise<unknown>][] = [
      ['sequences.next', () => t.ordo.sequences.next('cut_tx', { tx })],
      ['outbox.append', () => t.ordo.outbox.append('cut-tx', { type: 'Tick', data: {} }, { tx })],
    ];
    for (const [name, call] of calls) {
      const started = performance.now();
      const e = await call().then(
        () => undefined,
        (error: unknown) => error,
      );
      // A statement on that connection can never be sent: trying again for connectTimeout (10 s
      // here) would only make the caller wait.
      expect(e, name).toBeInstanceOf(OrdoError);
      expect((e as OrdoError).code, name).toBe('database_unavailable');
      expect(performance.now() - started, name).toBeLessThan(5_000);
    }
  } finally {
    tx.release(true);
  }
});
