// A worker process for the throttle tests: its own ordo instances (own pools, own node ids)
// on the same database. Usage:
//
//   throttle-worker.ts <mode> <databaseUrl> <throttle> [json options]
//
// With THROTTLE_CLOCK_SKEW_MS set, the process's clock is wrong by that much: Date and
// Date.now() are shifted before ordo is loaded (timers, being monotonic, are not).
//
// Prints `ready` once connected, then waits for `go` on stdin (except repl). Every event is one
// JSON line on stdout. An error is printed as {"event":"error","code","message"} and the process
// exits 1.
//
// Modes:
//   story  {instances, workers, tasks}: workers loop: acquire; refused → sleep retryAfterMs;
//          granted → claim the next row of the `tasks` table, sleep its duration_ms, complete
//          ({"event":"run"|"idle", task, permit, acquiredAt, endedAt, …}). `stop` ends the loops.
//   bucket {instances, workers, seconds}: acquire and complete at once as fast as allowed,
//          sleeping retryAfterMs when refused ({"event":"grant", acquiredAt}), then `done`.
//   hold   {}: run() a task that never ends; prints {"event":"holding", id, acquiredAt, expiresAt}.
//   repl   {}: one command per stdin line: `acquire <throttle>` → {"event":"acquired", …result,
//          nodeNow} (a granted permit is completed at once), `run <throttle> <ms>` →
//          {"event":"ran", …} after run() with a task of <ms>, `exit`. (<throttle> on the
//          command line is unused.)
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';

const skew = Number(process.env.THROTTLE_CLOCK_SKEW_MS ?? 0);
if (skew !== 0) {
  const RealDate = Date;
  class SkewedDate extends RealDate {
    constructor(...args: unknown[]) {
      if (args.length === 0) super(RealDate.now() + skew);
      else super(...(args as [string | number]));
    }
    static override now(): number {
      return RealDate.now() + skew;
    }
  }
  globalThis.Date = SkewedDate as DateConstructor;
}
const { createOrdo } = await import('../../src/index.js');
type Ordo = Awaited<ReturnType<typeof createOrdo>>;

const [mode, url, throttle, json] = process.argv.slice(2) as [string, string, string, string | undefined];
const options = JSON.parse(json ?? '{}') as {
  instances?: number;
  workers?: number;
  seconds?: number;
  tasks?: string;
};

function emit(event: string, fields: Record<string, unknown> = {}): void {
  process.stdout.write(`${JSON.stringify({ event, pid: process.pid, skew, ...fields })}\n`);
}

function fail(e: unknown): never {
  const error = e as { code?: string; message?: string };
  emit('error', { code: error.code ?? 'unknown', message: error.message ?? String(e) });
  process.exit(1);
}

let stopped = false;
let go!: () => void;
const started = new Promise<void>((resolve) => {
  go = resolve;
});
const commands: string[] = [];
let wake: (() => void) | undefined;
let buffered = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (text: string) => {
  buffered += text;
  for (let i = buffered.indexOf('\n'); i >= 0; i = buffered.indexOf('\n')) {
    const line = buffered.slice(0, i).trim();
    buffered = buffered.slice(i + 1);
    if (line === 'go') go();
    else if (line === 'stop') stopped = true;
    else {
      commands.push(line);
      wake?.();
    }
  }
});
process.stdin.on('end', () => {
  stopped = true;
  commands.push('exit');
  wake?.();
  go();
});

async function nextCommand(): Promise<string> {
  while (commands.length === 0) await new Promise<void>((resolve) => (wake = resolve));
  return commands.shift()!;
}

const instances: Ordo[] = [];
try {
  for (let i = 0; i < (options.instances ?? 1); i++)
    instances.push(await createOrdo({ databaseUrl: url, poolSize: 3 }));
} catch (e) {
  fail(e);
}
const pool = new pg.Pool({ connectionString: url, max: 2 });
pool.on('error', () => undefined);

async function story(ordo: Ordo, worker: number): Promise<void> {
  while (!stopped) {
    const got = await ordo.throttles.acquire(throttle, { holder: `${process.pid}/${worker}` });
    if (!got.granted) {
      await sleep(got.retryAfterMs);
      continue;
    }
    const { rows } = await pool.query(
      `DELETE FROM ${options.tasks} WHERE id = (SELECT id FROM ${options.tasks} ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
       RETURNING id, duration_ms`,
    );
    const task = rows[0] as { id: number; duration_ms: number } | undefined;
    if (task) await sleep(task.duration_ms);
    const end = await got.complete();
    emit(task ? 'run' : 'idle', {
      task: task?.id ?? null,
      worker,
      permit: got.id,
      acquiredAt: got.acquiredAt.toISOString(),
      endedAt: end.endedAt.toISOString(),
    });
  }
}

async function bucket(ordo: Ordo, until: number): Promise<void> {
  while (performance.now() < until) {
    const got = await ordo.throttles.acquire(throttle);
    if (!got.granted) {
      await sleep(Math.min(got.retryAfterMs, Math.max(0, until - performance.now())));
      continue;
    }
    await got.complete();
    emit('grant', { acquiredAt: got.acquiredAt.toISOString() });
  }
}

try {
  if (mode === 'repl') {
    const ordo = instances[0]!;
    emit('ready');
    for (;;) {
      const [command, name, arg] = (await nextCommand()).split(' ') as [string, string, string];
      if (command === 'exit') break;
      if (command === 'acquire') {
        const got = await ordo.throttles.acquire(name);
        emit('acquired', {
          granted: got.granted,
          ...(got.granted
            ? { id: got.id, acquiredAt: got.acquiredAt.toISOString(), expiresAt: got.expiresAt.toISOString() }
            : { retryAfterMs: got.retryAfterMs, reason: got.reason }),
          nodeNow: new Date().toISOString(),
        });
        if (got.granted) await got.complete();
      } else if (command === 'run') {
        const result = await ordo.throttles.run(name, async ({ permit }) => {
          await sleep(Number(arg));
          return { acquiredAt: permit.acquiredAt.toISOString(), expiresAt: permit.expiresAt.toISOString() };
        });
        emit('ran', { ...result });
      }
    }
  } else {
    process.stdout.write('ready\n');
    await started;
    if (mode === 'story') {
      const loops = instances.flatMap((ordo, i) =>
        Array.from({ length: options.workers ?? 1 }, (_, w) => story(ordo, i * 100 + w)),
      );
      await Promise.all(loops);
    } else if (mode === 'bucket') {
      const until = performance.now() + (options.seconds ?? 1) * 1000;
      await Promise.all(
        instances.flatMap((ordo) => Array.from({ length: options.workers ?? 1 }, () => bucket(ordo, until))),
      );
    } else if (mode === 'hold') {
      await instances[0]!.throttles.run(throttle, async ({ permit }) => {
        emit('holding', {
          id: permit.id,
          acquiredAt: permit.acquiredAt.toISOString(),
          expiresAt: permit.expiresAt.toISOString(),
        });
        await new Promise(() => undefined);
      });
    } else {
      throw new Error(`unknown mode ${mode}`);
    }
  }
  emit('done');
  await Promise.all(instances.map((o) => o.close()));
  await pool.end();
  process.stdin.destroy();
} catch (e) {
  fail(e);
}
