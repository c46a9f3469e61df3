import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import pg from 'pg';
import { afterAll, beforeAll } from 'vitest';
import { createOrdo, type Ordo } from '../../src/index.js';
import { type RestartablePostgres, restartablePostgres } from './restartable-postgres.js';

const run = promisify(execFile);

export interface RestoreServers {
  /** The cluster dumped. */
  readonly old: RestartablePostgres;
  /** The new cluster restored into. */
  readonly restored: RestartablePostgres;
  /** An ordo on `url`, closed after the file's tests. */
  ordoOn(url: string, schema?: string): Promise<Ordo>;
}

/**
 * Two PostgreSQL servers of a test file's own, one to dump and one to restore into (Debian's
 * binaries, so that Debian's pg_dump matches them): started before the file's tests and removed
 * after them, every ordo opened by ordoOn() closed first.
 */
export function restoreServers(): RestoreServers {
  let old: RestartablePostgres | undefined;
  let restored: RestartablePostgres | undefined;
  const opened: Ordo[] = [];
  beforeAll(async () => {
    [old, restored] = await Promise.all([restartablePostgres(), restartablePostgres()]);
  }, 120_000);
  afterAll(async () => {
    await Promise.all(opened.map((o) => o.close().catch(() => undefined)));
    await Promise.all([old?.cleanup(), restored?.cleanup()]);
  });
  return {
    get old() {
      return old!;
    },
    get restored() {
      return restored!;
    },
    async ordoOn(url: string, schema = 'ordo') {
      const o = await createOrdo({ databaseUrl: url, schema });
      opened.push(o);
      return o;
    },
  };
}

/** One statement on a connection of its own. */
export async function sql(url: string, text: string, values: unknown[] = []): Promise<pg.QueryResult> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    return await c.query(text, values);
  } finally {
    await c.end();
  }
}

/** pg_dump of the database at `from`, written to a file beside `to`'s data directory. */
export async function dump(from: string, to: RestartablePostgres, name: string): Promise<string> {
  const file = `${to.dataDir}/../${name}.sql`;
  await run('/usr/bin/pg_dump', ['--no-owner', '-f', file, from]);
  return file;
}

/** A dump run by psql into the database at `url`, stopping at the first error. */
export async function restore(file: string, url: string): Promise<void> {
  await run('/usr/bin/psql', ['-q', '-v', 'ON_ERROR_STOP=1', '-f', file, url]);
}
