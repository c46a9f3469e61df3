import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { existsSync, rmSync } from 'node:fs';
import { chmod, chown, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { freePort } from '../../src/db/embedded.js';

export interface PgBouncer {
  /** The upstream URL with PgBouncer's host and port: same user, password and database. */
  url: string;
  /** PgBouncer's port on 127.0.0.1. */
  port: number;
  /** Its process id (running as `postgres` when the tests run as root). */
  pid: number;
  /** Server connections PgBouncer keeps per (database, user): fewer than the clients it serves. */
  poolSize: number;
  /** What PgBouncer has written so far (it logs to stderr), for failure messages. */
  log(): string;
  /** SIGINT, then waits for the process to exit (SIGKILL after 10 s) and removes its files. */
  stop(): Promise<void>;
}

export interface PgBouncerOptions {
  /** `default_pool_size`: server connections per (database, user). Default 3. */
  poolSize?: number;
  /** `pool_mode`. Default 'transaction', as Supabase, Neon and Heroku connect. */
  poolMode?: 'transaction' | 'session' | 'statement';
}

const PGBOUNCER = process.env.PGBOUNCER ?? '/usr/sbin/pgbouncer';
const START_TIMEOUT_MS = 15_000;
const STOP_TIMEOUT_MS = 10_000;

/** Whether a PgBouncer binary is installed (`apt-get install pgbouncer`). */
export function pgbouncerInstalled(): boolean {
  return existsSync(PGBOUNCER);
}

/** Processes started here and not yet stopped: killed if the test process exits first. */
const running = new Map<ChildProcess, string>();
process.once('exit', () => {
  for (const [child, dir] of running) {
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});

/**
 * A real PgBouncer on a free port of 127.0.0.1, in front of `upstreamUrl` (a PostgreSQL on
 * 127.0.0.1 or localhost, with a user and password in the URL, e.g. ownPostgres()'s), in
 * `pool_mode = transaction` with a small `default_pool_size`, so that server connections are
 * really shared between clients: a LISTEN's server connection goes back to the pool as soon as
 * the statement ends, session state does not follow a client, and named prepared statements
 * are parsed on one server connection and executed on another.
 *
 * Every database name is forwarded (`* = …`), so a test may create databases upstream and
 * reach them through the same PgBouncer. Clients authenticate with SCRAM-SHA-256 against the
 * password of the URL (kept in plain text in `auth_file`, which PgBouncer also uses to log into
 * PostgreSQL, itself SCRAM). PgBouncer refuses to run as root: as root, it runs as the system
 * user `postgres` (which the embedded PostgreSQL already needs), from a temporary folder of
 * its own that holds its configuration and the auth file (mode 600, owned by that user).
 */
export async function startPgBouncer(
  upstreamUrl: string,
  options: PgBouncerOptions = {},
): Promise<PgBouncer> {
  if (!pgbouncerInstalled()) {
    throw new Error(`PgBouncer is not installed (${PGBOUNCER}): apt-get install -y pgbouncer`);
  }
  const upstream = new URL(upstreamUrl);
  const user = decodeURIComponent(upstream.username);
  const password = decodeURIComponent(upstream.password);
  if (!user || !password) throw new Error('startPgBouncer needs a URL with a user and a password');
  const poolSize = options.poolSize ?? 3;
  const runAs = userInfo().uid === 0 ? postgresUser() : undefined;

  const dir = await mkdtemp(join(tmpdir(), 'ordo-pgbouncer-'));
  try {
    await chmod(dir, 0o755);
    const authFile = join(dir, 'userlist.txt');
    const quote = (s: string) => `"${s.replaceAll('"', '""')}"`;
    await writeFile(authFile, `${quote(user)} ${quote(password)}\n`, { mode: 0o600 });
    if (runAs) await chown(authFile, runAs.uid, runAs.gid);

    // A port can be taken between finding it free and PgBouncer binding it: try a few.
    for (let attempt = 1; ; attempt++) {
      const port = await freePort();
      const configFile = join(dir, 'pgbouncer.ini');
      await writeFile(
        configFile,
        config({
          upstreamHost: upstream.hostname === 'localhost' ? '127.0.0.1' : upstream.hostname,
          upstreamPort: Number(upstream.port || 5432),
          port,
          authFile,
          poolSize,
          poolMode: options.poolMode ?? 'transaction',
        }),
        { mode: 0o644 },
      );
      const child = spawn(PGBOUNCER, [configFile], {
        cwd: dir,
        stdio: ['ignore', 'pipe', 'pipe'],
        ...(runAs ? { uid: runAs.uid, gid: runAs.gid } : {}),
      });
      running.set(child, dir);
      let output = '';
      child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
      child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
      const exited = new Promise<string>((resolve) =>
        child.once('exit', (code, signal) => {
          running.delete(child);
          resolve(`pgbouncer exited with ${signal ?? `status ${code}`}`);
        }),
      );
      child.once('error', (e) => (output += `\n${e.message}`));

      const url = new URL(upstreamUrl);
      url.hostname = '127.0.0.1';
      url.port = String(port);
      const failure = await Promise.race([ready(url.toString()), exited]);
      if (failure === undefined) {
        return {
          url: url.toString(),
          port,
          pid: child.pid!,
          poolSize,
          log: () => output,
          stop: async () => {
            if (child.exitCode === null && child.signalCode === null) {
              child.kill('SIGINT');
              const killed = sleep(STOP_TIMEOUT_MS, undefined, { ref: false }).then(() => {
                child.kill('SIGKILL');
                return exited;
              });
              await Promise.race([exited, killed]);
            }
            await rm(dir, { recursive: true, force: true });
          },
        };
      }
      child.kill('SIGKILL');
      await exited;
      if (attempt >= 3 || !/Address already in use/i.test(output)) {
        throw new Error(`PgBouncer did not start: ${failure}\n${output.trim()}`);
      }
    }
  } catch (e) {
    await rm(dir, { recursive: true, force: true });
    throw e;
  }
}

function config(c: {
  upstreamHost: string;
  upstreamPort: number;
  port: number;
  authFile: string;
  poolSize: number;
  poolMode: string;
}): string {
  return `[databases]
* = host=${c.upstreamHost} port=${c.upstreamPort}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = ${c.port}
; no Unix socket: several PgBouncers may run at once, and /tmp is shared
unix_socket_dir =
auth_type = scram-sha-256
auth_file = ${c.authFile}
pool_mode = ${c.poolMode}
default_pool_size = ${c.poolSize}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 1000
max_db_connections = 0
; what drivers send at startup that PgBouncer does not track
ignore_startup_parameters = extra_float_digits,options
server_login_retry = 1
server_connect_timeout = 5
query_wait_timeout = 60
logfile =
pidfile =
log_connections = 0
log_disconnections = 0
log_pooler_errors = 1
`;
}

/** Undefined once a client can log in through PgBouncer and run a query, else why not. */
async function ready(url: string): Promise<string | undefined> {
  const deadline = Date.now() + START_TIMEOUT_MS;
  let last: unknown;
  while (Date.now() < deadline) {
    const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 2000 });
    client.on('error', () => undefined);
    try {
      await client.connect();
      await client.query('SELECT 1');
      return undefined;
    } catch (e) {
      last = e;
    } finally {
      await client.end().catch(() => undefined);
    }
    await sleep(50);
  }
  return `no connection within ${START_TIMEOUT_MS} ms (${String(last)})`;
}

/** The system user `postgres`: PgBouncer, like PostgreSQL, refuses to run as root. */
function postgresUser(): { uid: number; gid: number } {
  const uid = spawnSync('id', ['-u', 'postgres'], { encoding: 'utf8' });
  const gid = spawnSync('id', ['-g', 'postgres'], { encoding: 'utf8' });
  if (uid.status !== 0 || gid.status !== 0) {
    throw new Error(
      'running as root, PgBouncer needs the system user "postgres" to run as (useradd --system postgres)',
    );
  }
  return { uid: Number(uid.stdout.trim()), gid: Number(gid.stdout.trim()) };
}
