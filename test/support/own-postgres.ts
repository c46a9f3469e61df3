import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { startEmbedded } from '../../src/db/embedded.js';

export interface OwnPostgres {
  url: string;
  stop(): Promise<void>;
}

/**
 * A PostgreSQL server for one test file alone. Outbox reads depend on every open transaction
 * on the whole server (pg_snapshot_xmin is cluster-wide), so outbox tests must not share one
 * with files that hold transactions open.
 */
export async function ownPostgres(settings: Record<string, string> = {}): Promise<OwnPostgres> {
  const dir = await mkdtemp(join(tmpdir(), 'ordo-own-'));
  // When tests run as root, PostgreSQL runs as the `postgres` user, which must reach the directory.
  await chmod(dir, 0o755);
  let server = await startEmbedded(join(dir, 'pg'));
  if (Object.keys(settings).length > 0) {
    // Settings such as max_prepared_transactions take a restart.
    const client = new pg.Client({ connectionString: server.url });
    await client.connect();
    for (const [name, value] of Object.entries(settings)) {
      await client.query(`ALTER SYSTEM SET ${name} = '${value.replaceAll("'", "''")}'`);
    }
    await client.end();
    await server.stop();
    server = await startEmbedded(join(dir, 'pg'));
  }
  return {
    url: server.url,
    async stop() {
      await server.stop();
      await rm(dir, { recursive: true, force: true });
    },
  };
}
