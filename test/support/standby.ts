// A hot standby of a server of the test's own (restartable-postgres.ts): a base backup taken
// with `pg_basebackup -R` (which writes standby.signal and primary_conninfo), started on a port
// of its own and streaming from the primary. Read-only sessions only, as a real standby.
// Debian's PostgreSQL binaries, as restartable-postgres.ts uses them.
import { join } from 'node:path';
import pg from 'pg';
import { type RestartablePostgres, run, serverFolder } from './restartable-postgres.js';

const BINDIR = process.env.PG_BINDIR ?? '/usr/lib/postgresql/15/bin';

export interface Standby {
  /** postgres://postgres@127.0.0.1:<port>/postgres (trust authentication, as the primary's). */
  url: string;
  port: number;
  dataDir: string;
  /** The standby's log so far (with `log_connections` on: one line per session opened). */
  log(): Promise<string>;
  /** Stops the standby (immediate) and removes its files. Safe to call twice. */
  cleanup(): Promise<void>;
}

/**
 * Takes a base backup of `primary` (its default pg_hba.conf lets 127.0.0.1 replicate with
 * trust) and starts it as a hot standby; resolves once it accepts read-only sessions.
 * Settings are appended to the copied postgresql.conf.
 */
export async function standbyOf(
  primary: RestartablePostgres,
  settings: Record<string, string | number> = {},
): Promise<Standby> {
  const folder = await serverFolder('ordo-standby-');
  try {
    await run(
      join(BINDIR, 'pg_basebackup'),
      [
        '-h',
        '127.0.0.1',
        '-p',
        String(primary.port),
        '-U',
        'postgres',
        '-D',
        folder.dataDir,
        '-R',
        '-X',
        'stream',
      ],
      folder.runAs,
    );
    // These replace the primary's settings copied with its postgresql.conf.
    const port = await folder.startOnFreePort('standby.ts', (port) => ({
      port,
      hot_standby: 'on',
      log_connections: 'on',
      ...settings,
    }));
    const url = `postgres://postgres@127.0.0.1:${port}/postgres`;
    await waitForStandby(url);
    return { url, port, dataDir: folder.dataDir, log: folder.log, cleanup: folder.remove };
  } catch (e) {
    await folder.remove();
    throw e;
  }
}

/** Until a session works and the server says it is in recovery. */
async function waitForStandby(url: string, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 2_000 });
    client.on('error', () => undefined);
    try {
      await client.connect();
      const { rows } = await client.query('SELECT pg_is_in_recovery() AS standby');
      if (rows[0].standby === true) return;
      throw new Error('the server is not in recovery');
    } catch (e) {
      if (Date.now() > deadline)
        throw new Error(`the standby did not accept sessions: ${String(e)}`, { cause: e });
    } finally {
      await client.end().catch(() => undefined);
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
