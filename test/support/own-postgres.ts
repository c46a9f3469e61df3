import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
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
export async function ownPostgres(): Promise<OwnPostgres> {
  const dir = await mkdtemp(join(tmpdir(), 'ordo-own-'));
  // When tests run as root, PostgreSQL runs as the `postgres` user, which must reach the directory.
  await chmod(dir, 0o755);
  const server = await startEmbedded(join(dir, 'pg'));
  return {
    url: server.url,
    async stop() {
      await server.stop();
      await rm(dir, { recursive: true, force: true });
    },
  };
}
