import type { ChildProcess } from 'node:child_process';
import pg from 'pg';
import { hearClientErrors } from '../../src/db/clients.js';
import { createOrdo, type Ordo } from '../../src/index.js';
import { type OwnPostgres, ownPostgres } from './own-postgres.js';

/**
 * A PostgreSQL of the test file's own for outbox tests that kill consumers or restart the
 * server, with a client, a raw pool and the `received` table consumers write through their
 * handler's transaction: a second delivery of a position violates its primary key; n is the
 * order of insertion.
 */
export interface OutboxServer {
  server: OwnPostgres;
  ordo: Ordo;
  raw: pg.Pool;
  /** Consumer processes started by the file; killed with SIGKILL by stop(). */
  children: Set<ChildProcess>;
  stop(): Promise<void>;
}

export async function outboxServer(
  options: { poolSize?: number; rawMax?: number } = {},
): Promise<OutboxServer> {
  const server = await ownPostgres();
  const ordo = await createOrdo({
    databaseUrl: server.url,
    ...(options.poolSize ? { poolSize: options.poolSize } : {}),
  });
  const raw = new pg.Pool({ connectionString: server.url, max: options.rawMax ?? 2 });
  // Connections still closing when the server stops must not fail the file.
  raw.on('error', () => undefined);
  hearClientErrors(raw);
  await raw.query(`CREATE TABLE received (
    n bigserial UNIQUE, position bigint PRIMARY KEY, transaction_id xid8 NOT NULL, consumer text NOT NULL)`);
  const children = new Set<ChildProcess>();
  return {
    server,
    ordo,
    raw,
    children,
    async stop() {
      const gone = [...children]
        .filter((c) => c.exitCode === null && c.signalCode === null)
        .map((c) => new Promise((resolve) => c.once('exit', resolve)));
      for (const c of children) c.kill('SIGKILL');
      await Promise.all(gone);
      await ordo.close();
      await raw.end();
      await server.stop();
    },
  };
}
