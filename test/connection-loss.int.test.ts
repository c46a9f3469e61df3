/**
 * A connection the server ends at the moment ordo's pool hands it to the next caller must not
 * end the process. pg-pool hands a connection out inside the socket read that finished the
 * previous holder's last statement; a "terminating connection" in that same read reached a
 * client nobody listened to yet (seen in CI as an uncaught exception during a restart test).
 */
import { spawnSync } from 'node:child_process';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { type OrdoDatabase, ordoDatabase } from './support/database.js';

let t: OrdoDatabase;
beforeAll(async () => {
  // One connection: the second transaction waits for the first one's.
  t = await ordoDatabase({ poolSize: 1 });
});
afterAll(() => t?.close());

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
      const psql = spawnSync('psql', [t.db.url, '-X', '-Atc', `SELECT pg_terminate_backend(${pid})`]);
      expect(psql.status, psql.stderr.toString()).toBe(0);
      expect((await first)[0]!.position).toBeTypeOf('number');
      // Nothing ran before its BEGIN: it is begun again on a new connection.
      expect((await second).rows).toEqual([{ one: 1 }]);
    }
    expect(uncaught).toEqual([]);
  } finally {
    process.off('uncaughtException', hear);
  }
});
