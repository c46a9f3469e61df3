// A hot standby of a server of the test's own (restartable-postgres.ts): a base backup taken
// with `pg_basebackup -R` (which writes standby.signal and primary_conninfo), started on a port
// of its own and streaming from the primary. Read-only sessions only, as a real standby.
// Debian's PostgreSQL binaries, as restartable-postgres.ts uses them.
import { spawnSync } from 'node:child_process';
import { rmSync } from 'node:fs';
import { appendFile, chmod, chown, mkdir, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { freePort } from '../../src/db/embedded.js';
import { postgresUser, type RestartablePostgres, type RunAs, run } from './restartable-postgres.js';

const BINDIR = process.env.PG_BINDIR ?? '/usr/lib/postgresql/15/bin';
const PG_CTL_TIMEOUT_S = 30;

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

/** Standbys started here and not yet cleaned up: stopped if the test process exits first. */
const live = new Map<string, { dataDir: string; runAs: RunAs | undefined }>();
process.once('exit', () => {
  for (const [dir, { dataDir, runAs }] of live) {
    spawnSync(join(BINDIR, 'pg_ctl'), ['-D', dataDir, '-m', 'immediate', '-w', 'stop'], {
      stdio: 'ignore',
      ...(runAs ?? {}),
    });
    rmSync(dir, { recursive: true, force: true });
  }
});

/**
 * Takes a base backup of `primary` (its default pg_hba.conf lets 127.0.0.1 replicate with
 * trust) and starts it as a hot standby; resolves once it accepts read-only sessions.
 * Settings are appended to the copied postgresql.conf.
 */
export async function standbyOf(
  primary: RestartablePostgres,
  settings: Record<string, string | number> = {},
): Promise<Standby> {
  const runAs = userInfo().uid === 0 ? postgresUser() : undefined;
  const dir = await mkdtemp(join(tmpdir(), 'ordo-standby-'));
  const dataDir = join(dir, 'data');
  const logFile = join(dir, 'log', 'postgresql.log');
  live.set(dir, { dataDir, runAs });
  let running = false;
  const pgCtl = (args: string[]) =>
    run(
      join(BINDIR, 'pg_ctl'),
      ['-D', dataDir, '-l', logFile, '-t', String(PG_CTL_TIMEOUT_S), '-w', ...args],
      runAs,
    );
  const cleanup = async () => {
    if (!live.has(dir)) return;
    if (running) await pgCtl(['-m', 'immediate', 'stop']).catch(() => undefined);
    running = false;
    live.delete(dir);
    await rm(dir, { recursive: true, force: true });
  };
  try {
    await chmod(dir, 0o755);
    await mkdir(dataDir, { mode: 0o700 });
    await mkdir(join(dir, 'log'), { mode: 0o755 });
    if (runAs) {
      await chown(dataDir, runAs.uid, runAs.gid);
      await chown(join(dir, 'log'), runAs.uid, runAs.gid);
    }
    await run(
      join(BINDIR, 'pg_basebackup'),
      ['-h', '127.0.0.1', '-p', String(primary.port), '-U', 'postgres', '-D', dataDir, '-R', '-X', 'stream'],
      runAs,
    );
    for (let attempt = 1; ; attempt++) {
      const port = await freePort();
      // The last line of postgresql.conf wins: these replace the primary's copied settings.
      const conf = { port, hot_standby: 'on', log_connections: 'on', ...settings };
      await appendFile(
        join(dataDir, 'postgresql.conf'),
        `\n# standby.ts\n${Object.entries(conf)
          .map(([k, v]) => `${k} = '${String(v).replaceAll("'", "''")}'`)
          .join('\n')}\n`,
      );
      try {
        await pgCtl(['start']);
        running = true;
      } catch (e) {
        const log = await readFile(logFile, 'utf8').catch(() => '');
        if (attempt < 3 && /could not bind|Address already in use/i.test(log)) continue;
        throw new Error(`the standby did not start: ${(e as Error).message}\n${log}`, { cause: e });
      }
      const url = `postgres://postgres@127.0.0.1:${port}/postgres`;
      await waitForStandby(url);
      return { url, port, dataDir, log: () => readFile(logFile, 'utf8').catch(() => ''), cleanup };
    }
  } catch (e) {
    await cleanup();
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
