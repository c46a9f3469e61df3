// `ordo serve` (and other CLI commands) as real child processes, run from source the way
// test/cli.int.test.ts runs them: `node --import tsx test/support/ordo-cli.ts <args>`.
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { Agent } from 'undici-types';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
// Absolute paths: a child may run in another folder (cwd), where 'tsx' would not resolve.
const CLI = [
  '--import',
  pathToFileURL(join(ROOT, 'node_modules/tsx/dist/loader.mjs')).href,
  join(ROOT, 'test/support/ordo-cli.ts'),
];

/** Variables that would change which database or which tokens a child uses. */
const INHERITED_SETTINGS = [
  'DATABASE_URL',
  'ORDO_DATABASE_URL',
  'ORDO_LISTEN_URL',
  'ORDO_TOKENS',
  'ORDO_SCHEMA',
] as const;

export interface ChildOptions {
  /** Set (a string) or remove (undefined) variables on top of this process's environment. */
  env?: Record<string, string | undefined>;
  /** Keep DATABASE_URL, ORDO_DATABASE_URL, ORDO_TOKENS and ORDO_SCHEMA from this process (default: removed). */
  inheritSettings?: boolean;
  /** The folder it runs in (default: the repository). */
  cwd?: string;
  /** Run as this user (and group), as root can. */
  uid?: number;
  gid?: number;
}

export interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

/** Every child started here and not yet exited, so that a failing test leaves none behind. */
const children = new Set<ChildProcess>();

function environment(options: ChildOptions): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  if (!options.inheritSettings) for (const key of INHERITED_SETTINGS) delete env[key];
  for (const [key, value] of Object.entries(options.env ?? {})) {
    if (value === undefined) delete env[key];
    else env[key] = value;
  }
  return env;
}

function launch(args: string[], options: ChildOptions): { child: ChildProcess; exited: Promise<Exit> } {
  const child = spawn(process.execPath, [...CLI, ...args], {
    cwd: options.cwd ?? ROOT,
    uid: options.uid,
    gid: options.gid,
    env: environment(options),
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.add(child);
  const exited = new Promise<Exit>((resolve) => {
    child.on('exit', (code, signal) => {
      children.delete(child);
      resolve({ code, signal });
    });
    child.on('error', () => {
      children.delete(child);
      resolve({ code: null, signal: null });
    });
  });
  return { child, exited };
}

export interface CliResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  out: string;
  err: string;
}

/** Runs `ordo <args>` to completion (killed after timeoutMs). */
export async function runCli(
  args: string[],
  options: ChildOptions & { timeoutMs?: number } = {},
): Promise<CliResult> {
  const { child, exited } = launch(args, options);
  let out = '';
  let err = '';
  child.stdout!.on('data', (chunk: Buffer) => {
    out += chunk.toString();
  });
  child.stderr!.on('data', (chunk: Buffer) => {
    err += chunk.toString();
  });
  const timer = setTimeout(() => child.kill('SIGKILL'), options.timeoutMs ?? 30_000);
  try {
    const { code, signal } = await exited;
    return { code, signal, out, err };
  } finally {
    clearTimeout(timer);
  }
}

/** `ordo <args>` left running: the child to signal, its exit, and what it wrote so far. */
export function startCli(
  args: string[],
  options: ChildOptions = {},
): { child: ChildProcess; exited: Promise<Exit>; output(): string } {
  const { child, exited } = launch(args, options);
  let output = '';
  const hear = (chunk: Buffer) => {
    output += chunk.toString();
  };
  child.stdout!.on('data', hear);
  child.stderr!.on('data', hear);
  return { child, exited, output: () => output };
}

/** A short CLI command run to its end, synchronously: for commands that print and exit. */
export function runCliSync(
  args: string[],
  options: ChildOptions = {},
): { code: number | null; out: string; err: string } {
  const r = spawnSync(process.execPath, [...CLI, ...args], {
    cwd: options.cwd ?? ROOT,
    env: environment(options),
    encoding: 'utf8',
    timeout: 30_000,
  });
  return { code: r.status, out: r.stdout, err: r.stderr };
}

export interface ServerProcess {
  /** http://127.0.0.1:<port>, whatever --host was. */
  url: string;
  port: number;
  pid: number;
  child: ChildProcess;
  /** Everything the process wrote so far, stdout and stderr interleaved. */
  output(): string;
  /** The JSON log lines (pino) written to stdout so far. */
  logs(): Record<string, unknown>[];
  exited: Promise<Exit>;
  /** Sends `signal` (default SIGTERM) and resolves with the exit code; SIGKILL after timeoutMs, then throws. */
  stop(signal?: NodeJS.Signals, timeoutMs?: number): Promise<number | null>;
  /** Waits for the exit (a signal already sent) and resolves with the exit code; SIGKILL after timeoutMs, then throws. */
  wait(timeoutMs?: number): Promise<number | null>;
}

export interface ServeOptions extends ChildOptions {
  /** --database-url; without it the child falls back to its environment (or the embedded PostgreSQL). */
  databaseUrl?: string;
  /** More arguments after `serve --port 0`. */
  args?: string[];
  /** How long to wait for the log line and /healthz (default 30 s). */
  timeoutMs?: number;
}

/**
 * Starts `ordo serve --port 0 [--database-url URL] …args`, reads the port from its
 * `"msg":"ordo is listening"` log line (field url) and waits until GET /healthz answers 200.
 */
export async function startServer(options: ServeOptions = {}): Promise<ServerProcess> {
  const args = ['serve', '--port', '0'];
  if (options.databaseUrl !== undefined) args.push('--database-url', options.databaseUrl);
  args.push(...(options.args ?? []));
  const { child, exited } = launch(args, options);
  let output = '';
  let stdout = '';
  const lines: Record<string, unknown>[] = [];
  let listening: ((url: string) => void) | undefined;
  const announced = new Promise<string>((resolve) => {
    listening = resolve;
  });
  child.stdout!.on('data', (chunk: Buffer) => {
    const text = chunk.toString();
    output += text;
    stdout += text;
    let newline = stdout.indexOf('\n');
    while (newline >= 0) {
      const line = stdout.slice(0, newline).trim();
      stdout = stdout.slice(newline + 1);
      newline = stdout.indexOf('\n');
      if (!line.startsWith('{')) continue;
      try {
        const entry = JSON.parse(line) as Record<string, unknown>;
        lines.push(entry);
        if (entry.msg === 'ordo is listening' && typeof entry.url === 'string') listening?.(entry.url);
      } catch {
        // not a log line
      }
    }
  });
  child.stderr!.on('data', (chunk: Buffer) => {
    output += chunk.toString();
  });

  const timeoutMs = options.timeoutMs ?? 30_000;
  const deadline = Date.now() + timeoutMs;
  const fail = (why: string) => {
    child.kill('SIGKILL');
    return new Error(`ordo serve ${why}; its output:\n${output}`);
  };
  const early = exited.then(({ code, signal }) => {
    throw new Error(
      `ordo serve exited (code ${code}, signal ${signal}) before listening; output:\n${output}`,
    );
  });
  early.catch(() => undefined);
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(fail(`did not log 'ordo is listening' within ${timeoutMs} ms`)),
      timeoutMs,
    );
  });
  let announcedUrl: string;
  try {
    announcedUrl = await Promise.race([announced, early, late]);
  } finally {
    clearTimeout(timer);
  }
  const port = Number(new URL(announcedUrl).port);
  if (!Number.isInteger(port) || port <= 0) throw fail(`announced an unusable url ${announcedUrl}`);
  const url = `http://127.0.0.1:${port}`;

  for (;;) {
    const healthy = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(2_000) }).then(
      (r) => r.status === 200,
      () => false,
    );
    if (healthy) break;
    if (child.exitCode !== null || child.signalCode !== null) await early;
    if (Date.now() > deadline) throw fail(`did not answer /healthz within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }

  const waitForExit = async (since: string, waitMs: number): Promise<number | null> => {
    let killTimer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<'timeout'>((resolve) => {
      killTimer = setTimeout(() => resolve('timeout'), waitMs);
    });
    const result = await Promise.race([exited, timedOut]);
    clearTimeout(killTimer);
    if (result === 'timeout') {
      child.kill('SIGKILL');
      await exited;
      throw new Error(`ordo serve did not exit within ${waitMs} ms of ${since}; output:\n${output}`);
    }
    return result.code;
  };

  return {
    url,
    port,
    pid: child.pid!,
    child,
    output: () => output,
    logs: () => [...lines],
    exited,
    stop(signal: NodeJS.Signals = 'SIGTERM', timeoutMs = 20_000) {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      return waitForExit(`${signal}`, timeoutMs);
    },
    wait(timeoutMs = 20_000) {
      return waitForExit('the wait began', timeoutMs);
    },
  };
}

/** Kills (SIGKILL) every child started here that is still running; for afterAll. */
export async function killAll(): Promise<void> {
  const running = [...children];
  const gone = running.map((c) => new Promise((resolve) => c.once('exit', resolve)));
  for (const child of running) child.kill('SIGKILL');
  await Promise.all(gone);
}

/**
 * A connection pool of its own for fetch (`{ dispatcher }`), which a test can close or destroy
 * (Node's global one it cannot): the Agent class of the undici inside Node, taken from the global
 * dispatcher that Node creates on the first fetch.
 */
export function newAgent(options: { connections?: number } = {}): Agent {
  const global = (globalThis as Record<symbol, unknown>)[Symbol.for('undici.globalDispatcher.1')];
  if (!global) throw new Error('newAgent() needs a fetch() done first: Node creates its dispatcher then');
  const AgentClass = (global as object).constructor as new (options: object) => Agent;
  return new AgentClass(options);
}
