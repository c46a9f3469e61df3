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
//   line   {instances?}: JSON commands, one per stdin line, each with a `tag`, run concurrently
//          (so that one process holds many waiters); prints `ready` and needs no `go`:
//          {"op":"acquire", tag, items, wait?, holdMs?, keep?, fail?: {error, retryAfter}}:
//            acquireAll(items, { holder: tag, wait }) → {"event":"granted", tag, id, acquiredAt,
//            expiresAt} or {"event":"refused", tag, reason, retryAfterMs, limit}; a grant is then
//            held holdMs and completed (or failed with `fail`) → {"event":"ended", tag, id,
//            acquiredAt, endedAt, outcome}, unless `keep` keeps it for {"op":"end", tag, fail?}.
//          {"op":"loop", tag, workers, items, wait?, holdMs?, costs?}: `workers` loops, worker w
//            asking items with the last item's cost costs[w % costs.length]; granted → held
//            holdMs, completed → {"event":"grant", tag, worker, cost, id, acquiredAt, endedAt};
//            refused → sleep retryAfterMs (at most 100 ms). {"op":"stop", tag} ends them (a wait
//            in progress leaves the line) → {"event":"stopped", tag}.
//          {"op":"setKeyLimits" | "removeKeyLimits", tag, name, key, limits?} → {"event":"done", tag, result}.
//          {"op":"exit"}.
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
// Types only: erased, so ordo is still loaded after the clock is skewed.
import type { Permit } from '../../src/index.js';

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
  poolSize?: number;
};

function emit(event: string, fields: Record<string, unknown> = {}): void {
  process.stdout.write(`${JSON.stringify({ event, pid: process.pid, skew, ...fields })}\n`);
}

function fail(e: unknown): never {
  const error = e as { code?: string; message?: string; op?: string; tag?: string };
  emit('error', {
    code: error.code ?? 'unknown',
    message: error.message ?? String(e),
    op: error.op,
    tag: error.tag,
  });
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
    instances.push(await createOrdo({ databaseUrl: url, poolSize: options.poolSize ?? 3 }));
} catch (e) {
  fail(e);
}
const pool = new pg.Pool({ connectionString: url, max: mode === 'line' ? 1 : 2 });
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

type Item = { name: string; key?: string; cost?: number };
interface LineCommand {
  op: string;
  tag: string;
  items?: Item[];
  wait?: string | number;
  holdMs?: number;
  keep?: boolean;
  fail?: { error?: string; retryAfter?: string | number };
  workers?: number;
  costs?: number[];
  name?: string;
  key?: string;
  limits?: Record<string, unknown>;
}

/** The `line` mode: commands run concurrently, each answered by events with its tag. */
async function lineMode(ordo: Ordo): Promise<void> {
  const kept = new Map<string, Permit>();
  const loops = new Map<string, { stop: AbortController; done: Promise<unknown> }>();
  const ends = async (permit: Permit, c: LineCommand, tag: string) => {
    const end =
      c.fail === undefined
        ? await permit.complete()
        : await permit.fail(c.fail.error ?? 'failed', {
            ...(c.fail.retryAfter === undefined ? {} : { retryAfter: c.fail.retryAfter }),
          });
    emit('ended', {
      tag,
      id: permit.id,
      acquiredAt: permit.acquiredAt.toISOString(),
      endedAt: end.endedAt.toISOString(),
      outcome: end.outcome,
    });
  };
  const acquire = async (c: LineCommand) => {
    const got = await ordo.throttles.acquireAll(c.items!, {
      holder: c.tag,
      ...(c.wait === undefined ? {} : { wait: c.wait }),
    });
    if (!got.granted) {
      emit('refused', { tag: c.tag, reason: got.reason, retryAfterMs: got.retryAfterMs, limit: got.limit });
      return;
    }
    emit('granted', {
      tag: c.tag,
      id: got.id,
      acquiredAt: got.acquiredAt.toISOString(),
      expiresAt: got.expiresAt?.toISOString() ?? null,
    });
    if (c.keep) {
      kept.set(c.tag, got);
      return;
    }
    if (c.holdMs) await sleep(c.holdMs);
    await ends(got, c, c.tag);
  };
  const loop = async (c: LineCommand, worker: number, stop: AbortSignal) => {
    const costs = c.costs ?? [1];
    const cost = costs[worker % costs.length]!;
    const items = c.items!.map((item, i) => (i === c.items!.length - 1 ? { ...item, cost } : item));
    while (!stop.aborted) {
      const got = await ordo.throttles.acquireAll(items, {
        holder: `${c.tag}/${worker}`,
        ...(c.wait === undefined ? {} : { wait: c.wait, signal: stop }),
      });
      if (!got.granted) {
        if (c.wait === undefined) await sleep(Math.min(got.retryAfterMs, 100));
        continue;
      }
      if (c.holdMs) await sleep(c.holdMs);
      const end = await got.complete();
      emit('grant', {
        tag: c.tag,
        worker,
        cost,
        id: got.id,
        acquiredAt: got.acquiredAt.toISOString(),
        endedAt: end.endedAt.toISOString(),
      });
    }
  };
  const serve = async (c: LineCommand) => {
    if (c.op === 'acquire') return acquire(c);
    if (c.op === 'end') {
      const permit = kept.get(c.tag);
      if (!permit) throw new Error(`no permit kept as ${c.tag}`);
      kept.delete(c.tag);
      return ends(permit, c, c.tag);
    }
    if (c.op === 'loop') {
      const stop = new AbortController();
      const done = Promise.all(Array.from({ length: c.workers ?? 1 }, (_, w) => loop(c, w, stop.signal)));
      loops.set(c.tag, { stop, done });
      return done;
    }
    if (c.op === 'stop') {
      const running = loops.get(c.tag);
      running?.stop.abort();
      await running?.done;
      loops.delete(c.tag);
      return emit('stopped', { tag: c.tag });
    }
    if (c.op === 'setKeyLimits' || c.op === 'removeKeyLimits') {
      const result =
        c.op === 'setKeyLimits'
          ? await ordo.throttles.setKeyLimits(c.name!, c.key!, c.limits ?? {})
          : await ordo.throttles.removeKeyLimits(c.name!, c.key!);
      return emit('done', { tag: c.tag, result });
    }
    throw new Error(`unknown op ${c.op}`);
  };
  emit('ready');
  for (;;) {
    const text = await nextCommand();
    if (text === 'exit' || text === '{"op":"exit"}') break;
    const c = JSON.parse(text) as LineCommand;
    serve(c).catch((e: unknown) => fail(Object.assign(e as object, { op: c.op, tag: c.tag })));
  }
  for (const { stop } of loops.values()) stop.abort();
  await Promise.all([...loops.values()].map((l) => l.done));
}

try {
  if (mode === 'line') {
    await lineMode(instances[0]!);
  } else if (mode === 'repl') {
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
            ? {
                id: got.id,
                acquiredAt: got.acquiredAt.toISOString(),
                expiresAt: got.expiresAt?.toISOString() ?? null,
              }
            : { retryAfterMs: got.retryAfterMs, reason: got.reason }),
          nodeNow: new Date().toISOString(),
        });
        if (got.granted) await got.complete();
      } else if (command === 'run') {
        const result = await ordo.throttles.run(name, async ({ permit }) => {
          await sleep(Number(arg));
          return {
            acquiredAt: permit.acquiredAt.toISOString(),
            expiresAt: permit.expiresAt?.toISOString() ?? null,
          };
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
          expiresAt: permit.expiresAt?.toISOString() ?? null,
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
