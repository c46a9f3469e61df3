// A process of test/support/throttle-worker.ts, as the throttle tests drive it: its JSON events
// collected as they come, waited for by a predicate, and its output kept for the failure message.
import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const running = new Set<ChildProcess>();

export type WorkerEvent = Record<string, any> & { event: string };

export interface WorkerProcess {
  child: ChildProcess;
  events: WorkerEvent[];
  /** Resolves with the first event (from `from` on) that matches; rejects on error, exit or timeout. */
  next(match: (e: WorkerEvent) => boolean, timeoutMs?: number, from?: number): Promise<WorkerEvent>;
  /** Writes one line to its standard input. */
  send(line: string): void;
  exited: Promise<number | null>;
}

/**
 * Starts `throttle-worker.ts <args…>` and resolves once it says it is ready (a line `ready` or
 * an event `ready`); rejects with its output if it exits first.
 */
export function startThrottleWorker(
  args: string[],
  env: Record<string, string> = {},
): Promise<WorkerProcess> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'test/support/throttle-worker.ts', ...args], {
    cwd: ROOT,
    env: { ...process.env, ...env },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  running.add(child);
  const events: WorkerEvent[] = [];
  const listeners = new Set<() => void>();
  let output = '';
  let rest = '';
  let ready!: () => void;
  const isReady = new Promise<void>((resolve) => (ready = resolve));
  child.stdout!.on('data', (chunk: Buffer) => {
    output += chunk.toString();
    rest += chunk.toString();
    for (let i = rest.indexOf('\n'); i >= 0; i = rest.indexOf('\n')) {
      const line = rest.slice(0, i).trim();
      rest = rest.slice(i + 1);
      if (line === 'ready') ready();
      else if (line.startsWith('{')) {
        const e = JSON.parse(line) as WorkerEvent;
        if (e.event === 'ready') ready();
        events.push(e);
      }
    }
    for (const l of listeners) l();
  });
  child.stderr!.on('data', (chunk: Buffer) => {
    output += chunk.toString();
  });
  const exited = new Promise<number | null>((resolve) =>
    child.on('exit', (code) => {
      running.delete(child);
      resolve(code);
      for (const l of listeners) l();
    }),
  );
  const w: WorkerProcess = {
    child,
    events,
    exited,
    send: (line) => child.stdin!.write(`${line}\n`),
    next(match, timeoutMs = 20_000, from = 0) {
      return new Promise((resolve, reject) => {
        const check = () => {
          const found = events.slice(from).find(match);
          if (found) return done(() => resolve(found));
          const error = events.find((e) => e.event === 'error');
          if (error) return done(() => reject(new Error(`worker failed: ${JSON.stringify(error)}`)));
          if (child.exitCode !== null || child.signalCode !== null)
            return done(() => reject(new Error(`worker exited; its output:\n${output}`)));
        };
        const timer = setTimeout(
          () => done(() => reject(new Error(`no matching event in ${timeoutMs} ms; output:\n${output}`))),
          timeoutMs,
        );
        const done = (settle: () => void) => {
          clearTimeout(timer);
          listeners.delete(check);
          settle();
        };
        listeners.add(check);
        check();
      });
    },
  };
  const failed = exited.then(() => {
    throw new Error(`worker exited before it was ready; its output:\n${output}`);
  });
  failed.catch(() => undefined);
  return Promise.race([isReady, failed]).then(() => w);
}

/** Kills every worker still running (afterAll). */
export function killThrottleWorkers(): void {
  for (const child of running) child.kill('SIGKILL');
}
