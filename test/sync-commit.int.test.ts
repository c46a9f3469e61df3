// A COMMIT that waits for a synchronous standby is never cancelled by ordo. Cancelling that wait
// (a statement_timeout or a cancel request over COMMIT) leaves the transaction committed on the
// primary and visible there without being on the standby, and a failover then loses it. Here a
// PostgreSQL of the file's own names a synchronous standby that never comes, so every commit
// waits: a call past statementTimeout is told `timeout` (503, outcome unknown), its backend
// still waits for the standby, and once the wait ends the number is committed and the same
// Idempotency-Key answers it.
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { createOrdo, type Ordo, OrdoError } from '../src/index.js';
import { type OwnPostgres, ownPostgres } from './support/own-postgres.js';

let server: OwnPostgres;
let admin: pg.Client;
let ordo: Ordo;

beforeAll(async () => {
  server = await ownPostgres();
  admin = new pg.Client({ connectionString: server.url });
  await admin.connect();
  ordo = await createOrdo({ databaseUrl: server.url, statementTimeout: '500ms' });
  await ordo.sequences.define({ name: 'invoice' });
});

afterAll(async () => {
  await ordo?.close();
  await admin?.end();
  await server?.stop();
});

/** Every commit from now on waits for a standby named `absent`, which never connects. */
async function standbyRequired(on: boolean): Promise<void> {
  await admin.query(`ALTER SYSTEM SET synchronous_standby_names = '${on ? 'absent' : ''}'`);
  await admin.query('SELECT pg_reload_conf()');
  // The setting reaches every backend at its next command; the admin's own, at once.
  await sleep(200);
}

it('a commit waiting for a synchronous standby past statementTimeout: the caller hears timeout, the wait goes on, the key answers the number once it ends', async () => {
  await standbyRequired(true);
  try {
    const error = await ordo.sequences.next('invoice', { idempotencyKey: 'invoice-for-order-7' }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(OrdoError);
    expect((error as OrdoError).code).toBe('timeout');

    // The backend is still in its COMMIT, waiting for the standby: nothing cancelled it.
    await sleep(300);
    const { rows } = await admin.query(
      `SELECT wait_event, query FROM pg_stat_activity WHERE application_name = 'ordo' AND wait_event = 'SyncRep'`,
    );
    expect(rows).toHaveLength(1);
  } finally {
    await standbyRequired(false);
  }
  // The wait ends: the commit went through, and the same key answers its number.
  const { rows: counted } = await admin.query(`SELECT value FROM ordo.counters WHERE sequence = 'invoice'`);
  expect(counted.map((r) => Number(r.value))).toEqual([1]);
  expect(await ordo.sequences.next('invoice', { idempotencyKey: 'invoice-for-order-7' })).toMatchObject({
    value: 1,
  });
  expect((await ordo.sequences.next('invoice')).value).toBe(2);
});
