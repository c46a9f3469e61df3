// Throttles across processes, each with its own ordo instances: the FOO story with 50 workers,
// a worker killed with SIGKILL while it holds a permit, a token bucket hammered by many
// workers, and workers whose clocks are an hour wrong. Every timing assertion compares the
// database's own timestamps (acquiredAt, endedAt, expires_at), so that a slow machine makes
// the tests slower, not wrong.
import { setTimeout as sleep } from 'node:timers/promises';
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo } from '../src/index.js';
import type { Permit } from '../src/throttles/permit.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import {
  killThrottleWorkers,
  startThrottleWorker,
  type WorkerEvent,
  type WorkerProcess,
} from './support/throttle-worker-process.js';
import { until } from './support/until.js';

const HOUR = 3_600_000;

let db: TestDatabase;
let ordo: Ordo;
let raw: pg.Pool;

beforeAll(async () => {
  db = await freshDatabase();
  ordo = await createOrdo({ databaseUrl: db.url, poolSize: 4 });
  raw = db.pool(2);
});
afterAll(async () => {
  killThrottleWorkers();
  await ordo?.close();
  await db?.drop();
});

type Event = WorkerEvent;
type Worker = WorkerProcess;

/** A worker process; `applicationName` names its sessions (by default they are 'ordo', as ours). */
function worker(
  mode: string,
  throttle: string,
  options: object = {},
  skewMs = 0,
  applicationName?: string,
): Promise<Worker> {
  const url = applicationName ? `${db.url}?application_name=${applicationName}` : db.url;
  return startThrottleWorker([mode, url, throttle, JSON.stringify(options)], {
    THROTTLE_CLOCK_SKEW_MS: String(skewMs),
  });
}

/** Acquires in this process, sleeping each refusal's retryAfterMs, until granted. */
async function untilGranted(name: string): Promise<Permit> {
  for (let i = 0; i < 200; i++) {
    const r = await ordo.throttles.acquire(name);
    if (r.granted) return r;
    await sleep(r.retryAfterMs);
  }
  throw new Error(`no grant of ${name}`);
}

const time = (iso: string) => new Date(iso).getTime();

describe('the FOO story: 50 workers in 5 processes (10 ordo instances) released at once', () => {
  it('starts at least the interval apart, never two running, and the ten queued tasks run one per interval', async () => {
    const EVERY = 500;
    await ordo.throttles.define({ name: 'FOO', every: `${EVERY}ms`, concurrency: 1, lease: '10s' });
    // Ten queued tasks, three of them longer than the interval.
    const durations = [50, 800, 50, 50, 1100, 50, 50, 700, 50, 50];
    await raw.query('CREATE TABLE story_tasks (id integer PRIMARY KEY, duration_ms integer NOT NULL)');
    await raw.query('INSERT INTO story_tasks SELECT i, d FROM unnest($1::int[]) WITH ORDINALITY AS u(d, i)', [
      durations,
    ]);
    // Two of the processes have clocks an hour wrong, one each way.
    const skews = [HOUR, -HOUR, 0, 0, 0];
    const workers = await Promise.all(
      skews.map((skew) => worker('story', 'FOO', { instances: 2, workers: 5, tasks: 'story_tasks' }, skew)),
    );
    for (const w of workers) w.send('go');
    const runs = () => workers.flatMap((w) => w.events.filter((e) => e.event === 'run'));
    const deadline = Date.now() + 30_000;
    while (runs().length < durations.length && Date.now() < deadline) {
      await Promise.race(
        workers.map((w) => w.next((e) => e.event === 'run' || e.event === 'error', 30_000, w.events.length)),
      );
    }
    for (const w of workers) w.send('stop');
    expect(await Promise.all(workers.map((w) => w.exited))).toEqual([0, 0, 0, 0, 0]);

    const done = runs();
    expect(done.map((e) => e.task).sort((a, b) => a - b)).toEqual(durations.map((_, i) => i + 1));
    // Every start, the tasks' and those that found the queue empty, in the order granted.
    const starts = workers
      .flatMap((w) => w.events.filter((e) => e.event === 'run' || e.event === 'idle'))
      .map((e): Event & { start: number; end: number } => ({
        ...e,
        start: time(e.acquiredAt),
        end: time(e.endedAt),
      }))
      .sort((a, b) => a.start - b.start);
    for (let i = 1; i < starts.length; i++) {
      const [before, after] = [starts[i - 1]!, starts[i]!];
      // At most one start per interval, measured on the database clock.
      expect(after.start - before.start, JSON.stringify([before, after])).toBeGreaterThanOrEqual(EVERY);
      // Never two running: each start comes after the previous task ended.
      expect(after.start, JSON.stringify([before, after])).toBeGreaterThanOrEqual(before.end);
    }
    // One per interval: the tasks ran in queue order, each starting soon after both the
    // interval and the task before it were over (refused workers sleep the hint they got).
    const taskStarts = starts.filter((s) => s.event === 'run');
    expect(taskStarts.map((s) => s.task)).toEqual(durations.map((_, i) => i + 1));
    for (let i = 1; i < taskStarts.length; i++) {
      const [before, after] = [taskStarts[i - 1]!, taskStarts[i]!];
      const allowed = Math.max(before.start + EVERY, before.end);
      expect(after.start - allowed, JSON.stringify([before, after])).toBeLessThan(500);
    }
    // The database counted exactly these starts.
    expect((await ordo.throttles.state('FOO')).starts).toBe(starts.length);
  });
});

describe('a worker killed with SIGKILL while it holds a permit', () => {
  it('the permit stops counting when its lease ends, and the next start happens then', async () => {
    await ordo.throttles.define({ name: 'killed', concurrency: 1, lease: '900ms' });
    const holder = await worker('hold', 'killed', {}, 0, 'killed-holder');
    holder.send('go');
    const holding = await holder.next((e) => e.event === 'holding');
    // Past its first lease the permit is still alive: run() extends it while the task runs.
    await sleep(1200);
    const blocked = await ordo.throttles.acquire('killed');
    expect(blocked).toMatchObject({ granted: false, reason: 'concurrency' });
    holder.child.kill('SIGKILL');
    await holder.exited;
    // A lease extension the worker sent just before it died may still be running on its
    // session: the permit's last expiry is known once the worker's sessions have ended.
    await until('the killed worker’s sessions ended', async () => {
      const { rows } = await raw.query(
        "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = 'killed-holder'",
      );
      return rows[0].n === 0;
    });
    const { rows } = await raw.query('SELECT expires_at FROM ordo.permits WHERE id = $1', [holding.id]);
    const expiresAt = rows[0].expires_at as Date;
    expect(expiresAt.getTime()).toBeGreaterThan(time(holding.expiresAt));

    const next = await untilGranted('killed');
    expect(next.acquiredAt.getTime()).toBeGreaterThanOrEqual(expiresAt.getTime());
    expect(next.acquiredAt.getTime() - expiresAt.getTime()).toBeLessThan(500);
    const state = await ordo.throttles.state('killed');
    expect(state).toMatchObject({ lastOutcome: 'expired', lastPermitId: holding.id, starts: 2 });
    expect(state.lastEndAt).toEqual(expiresAt);
    expect(state.running.map((p) => p.id)).toEqual([next.id]);
    await next.complete();
  });
});

describe.each([
  { kind: 'with permits', name: 'bucket', permits: true },
  { kind: 'without permits (permits: false)', name: 'bucket_plain', permits: false },
])('a token bucket $kind hammered by 24 workers in 3 processes', ({ name, permits }) => {
  it('grants within rate × time + burst, and close to it', async () => {
    const LIMIT = 10;
    const COST = 100; // ms per token: 10 per second
    await ordo.throttles.define({ name, limit: LIMIT, per: '1s', permits });
    const workers = await Promise.all(
      [0, HOUR, 0].map((skew) => worker('bucket', name, { instances: 2, workers: 4, seconds: 2.5 }, skew)),
    );
    for (const w of workers) w.send('go');
    expect(await Promise.all(workers.map((w) => w.exited))).toEqual([0, 0, 0]);
    const grants = workers
      .flatMap((w) => w.events.filter((e) => e.event === 'grant'))
      .map((e) => time(e.acquiredAt))
      .sort((a, b) => a - b);
    // In any window [t_i, t_j]: at most LIMIT + (t_j − t_i) / COST grants (times are whole
    // milliseconds, so a window may be up to 1 ms longer than it reads).
    for (let i = 0; i < grants.length; i++) {
      for (let j = i; j < grants.length; j++) {
        const allowed = LIMIT + Math.floor((grants[j]! - grants[i]! + 1) / COST);
        expect(j - i + 1, `grants ${i}..${j}`).toBeLessThanOrEqual(allowed);
      }
    }
    // And the workers got close to what the bucket allows.
    const span = grants.at(-1)! - grants[0]!;
    expect(grants.length).toBeGreaterThanOrEqual(0.8 * (LIMIT + span / COST));
    // The database counted every grant as a start (and, without permits, stored none).
    const { rows } = await raw.query(
      `SELECT (SELECT coalesce(sum(starts), 0)::int FROM ordo.throttle_state WHERE name = $1) AS starts,
              (SELECT count(*)::int FROM ordo.permits WHERE name = $1) AS permits`,
      [name],
    );
    expect(rows[0].starts).toBe(grants.length);
    if (!permits) expect(rows[0].permits).toBe(0);
  });
});

describe('workers whose clocks are an hour wrong', () => {
  it('decide exactly like the others: every time is the database’s', async () => {
    await ordo.throttles.define({ name: 'skewed', every: '1s', lease: '2s' });
    await ordo.throttles.define({ name: 'skewedRun', concurrency: 1, lease: '600ms' });
    const [ahead, behind] = await Promise.all([
      worker('repl', 'skewed', {}, HOUR),
      worker('repl', 'skewed', {}, -HOUR),
    ]);
    const ask = async (w: Worker, command: string) => {
      const from = w.events.length;
      w.send(command);
      return w.next((e) => e.event === 'acquired' || e.event === 'ran', 20_000, from);
    };

    const first = await ask(ahead, 'acquire skewed');
    expect(first.granted).toBe(true);
    // Its clock is indeed an hour ahead of the database's …
    expect(Math.abs(time(first.nodeNow) - time(first.acquiredAt) - HOUR)).toBeLessThan(60_000);
    // … and changes nothing: the lease is exactly the throttle's, on the database clock.
    expect(time(first.expiresAt) - time(first.acquiredAt)).toBe(2000);

    const late = await ask(behind, 'acquire skewed');
    expect(late).toMatchObject({ granted: false, reason: 'every' });
    expect(late.retryAfterMs).toBeGreaterThan(0);
    expect(late.retryAfterMs).toBeLessThanOrEqual(1000);
    const mine = await ordo.throttles.acquire('skewed');
    expect(mine).toMatchObject({ granted: false, reason: 'every' });

    // The worker an hour behind sleeps the hint it got and is granted, one interval after the first.
    await sleep(late.retryAfterMs);
    const second = await ask(behind, 'acquire skewed');
    expect(second.granted).toBe(true);
    expect(Math.abs(time(second.nodeNow) - time(second.acquiredAt) + HOUR)).toBeLessThan(60_000);
    const gap = time(second.acquiredAt) - time(first.acquiredAt);
    expect(gap).toBeGreaterThanOrEqual(1000);
    expect(gap).toBeLessThan(1000 + 500);
    const again = await ask(ahead, 'acquire skewed');
    expect(again).toMatchObject({ granted: false, reason: 'every' });
    expect(again.retryAfterMs).toBeLessThanOrEqual(1000);

    // run() renews its lease on timers, not on the wrong clock: a task longer than the lease completes.
    const ran = await ask(ahead, 'run skewedRun 1500');
    expect(ran.ran).toBe(true);
    expect((await ordo.throttles.state('skewedRun')).lastOutcome).toBe('completed');

    ahead.send('exit');
    behind.send('exit');
    expect(await Promise.all([ahead.exited, behind.exited])).toEqual([0, 0]);
  });
});
