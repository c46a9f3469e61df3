// What the tests of the queue adapters share (test/queue-*.int.test.ts): worker processes of
// test/support/queue-worker.ts, the table their runs are written to, and the scenarios of issue
// 45 run against each queue through a small driver (how to add a job, pause, read the queue's
// own record, recover a killed worker's job). Every check reads the database's clock.
import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import type pg from 'pg';
import { afterAll, expect, it } from 'vitest';
import type { Ordo } from '../../src/index.js';
import type { JobData, QueueName, WorkerConfig } from './queue-worker.js';
import { until } from './until.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const children = new Set<ChildProcess>();
afterAll(() => {
  for (const c of children) c.kill('SIGKILL');
});

export interface QueueRun {
  ordinal: number;
  n: number;
  job_id: string;
  permit: string;
  started_at: Date;
  ended_at: Date | null;
  expires_at: Date;
  attempt: number;
  pid: number;
  tenant: string | null;
  cost: number;
  last_outcome: string | null;
  last_permit: string | null;
  aborted: string | null;
}

export async function createRunsTable(sql: pg.Pool): Promise<void> {
  await sql.query(`CREATE TABLE IF NOT EXISTS queue_runs (
    queue text NOT NULL, ordinal int NOT NULL, n int NOT NULL, job_id text NOT NULL, permit uuid NOT NULL,
    started_at timestamptz NOT NULL, ended_at timestamptz, expires_at timestamptz, attempt int NOT NULL,
    pid int NOT NULL, tenant text, cost int NOT NULL, last_outcome text, last_permit uuid, aborted text)`);
}

export async function runsOf(sql: pg.Pool, queue: string): Promise<QueueRun[]> {
  const { rows } = await sql.query<QueueRun>(
    'SELECT * FROM queue_runs WHERE queue = $1 ORDER BY started_at, ordinal',
    [queue],
  );
  return rows;
}

export interface QueueWorker {
  child: ChildProcess;
  /** Starts its workers (the queue's "resume" for queues without a pause of their own). */
  start(): Promise<void>;
  /** Closes its workers and ordo, and waits for it to exit. */
  stop(): Promise<void>;
  output(): string;
}

/** A worker process, resolved once it has made its workers (not yet started). */
export async function startQueueWorker(config: WorkerConfig): Promise<QueueWorker> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'test/support/queue-worker.ts'], {
    cwd: ROOT,
    env: { ...process.env, QUEUE_WORKER: JSON.stringify(config) },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  children.add(child);
  child.on('exit', () => children.delete(child));
  let out = '';
  child.stdout!.on('data', (c: Buffer) => (out += c.toString()));
  child.stderr!.on('data', (c: Buffer) => (out += c.toString()));
  const saw = async (line: string, ms: number) => {
    await until(
      `the worker process to say ${line}`,
      () => {
        if (child.exitCode !== null || child.signalCode !== null)
          throw new Error(`the worker process exited; its output:\n${out}`);
        return out.split('\n').includes(line);
      },
      ms,
    );
  };
  await saw('ready', 30_000);
  return {
    child,
    output: () => out,
    start: async () => {
      child.stdin!.write('start\n');
      await saw('{"event":"started"}', 30_000);
    },
    stop: async () => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.stdin!.write('stop\n');
      await exited;
    },
  };
}

/** The queue's own record of a job: its number, how it ended, and whether it is still there. */
export interface QueueRecord {
  n: number;
  state: 'completed' | 'failed' | 'other';
}

/** How the scenarios use one queue (one supported major of one library). */
export interface QueueDriver {
  queue: QueueName;
  /** What every worker process of this queue is given besides the scenario's own. */
  workerConfig: Partial<WorkerConfig>;
  /** Makes a queue of that name whose jobs have `attempts` attempts in all. */
  open(name: string, options: { attempts: number }): Promise<QueueHandle>;
}

export interface QueueHandle {
  add(data: JobData): Promise<void>;
  /**
   * Pauses the queue, when the library has a pause (BullMQ); the others have none, and their
   * workers are started only on resume.
   */
  pause?(): Promise<void>;
  resume?(): Promise<void>;
  records(): Promise<QueueRecord[]>;
  /** What the queue does for a worker killed mid-job, so that the job is taken again. */
  recover(): Promise<void>;
  close(): Promise<void>;
}

/** Overlapping runs at their most, each counting its cost (intervals from grant to measured end). */
export function mostAtOnce(runs: QueueRun[]): number {
  const edges = runs.flatMap((r) => [
    { at: r.started_at.getTime(), d: r.cost },
    { at: r.ended_at!.getTime(), d: -r.cost },
  ]);
  // An end before a start at the same instant: the next grant follows the end.
  edges.sort((a, b) => a.at - b.at || a.d - b.d);
  let now = 0;
  let most = 0;
  for (const e of edges) most = Math.max(most, (now += e.d));
  return most;
}

export interface ScenarioContext {
  ordo: Ordo;
  sql: pg.Pool;
  databaseUrl: string;
}

/**
 * The scenarios of issue 45 for one queue, as tests of the describe block that calls this.
 * `ctx` is filled by the test file's beforeAll.
 */
export function queueScenarios(driver: QueueDriver, ctx: ScenarioContext): void {
  const base = (queueName: string): WorkerConfig => ({
    queue: driver.queue,
    databaseUrl: ctx.databaseUrl,
    queueName,
    workers: 1,
    concurrency: 25,
    ...driver.workerConfig,
  });
  const tag = driver.queue.replace(/[^a-z0-9]/g, '_');
  /** Two processes of 25 workers each: 50 in all. */
  const fifty = (config: WorkerConfig) => Promise.all([startQueueWorker(config), startQueueWorker(config)]);

  it('the seed: paused, 10 FOO added over 10 intervals of 2 s, then resumed under 50 workers in two processes: starts ≥ 1.9 s apart, never two at once, each once, no attempt used by a refusal, the failure recorded', async () => {
    const name = `${tag}_foo`;
    await ctx.ordo.throttles.define({ name, every: '2s', concurrency: 1, lease: '10s' });
    const queue = await driver.open(name, { attempts: 1 });
    const workers = await fifty({ ...base(name), throttle: name, failRuns: [4] });
    try {
      if (queue.pause) {
        await queue.pause();
        await Promise.all(workers.map((w) => w.start()));
      }
      for (let n = 1; n <= 10; n++) {
        await queue.add({ n, sleepMs: 300 });
        if (n < 10) await sleep(2000);
      }
      if (queue.resume) await queue.resume();
      else await Promise.all(workers.map((w) => w.start()));
      await until(
        '10 runs ended',
        async () => (await runsOf(ctx.sql, name)).filter((r) => r.ended_at).length === 10,
        40_000,
      );
      await until(
        'the queue to record 10 ends',
        async () => (await queue.records()).filter((r) => r.state !== 'other').length === 10,
        10_000,
      );
      const runs = await runsOf(ctx.sql, name);
      expect(runs.map((r) => r.n).sort((a, b) => a - b)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
      for (let i = 1; i < runs.length; i++) {
        const apart = runs[i]!.started_at.getTime() - runs[i - 1]!.started_at.getTime();
        expect(apart, `start ${i + 1} after start ${i}`).toBeGreaterThanOrEqual(1900);
        expect(apart, `start ${i + 1} after start ${i}: refused jobs come back in time`).toBeLessThan(4000);
        expect(runs[i]!.started_at.getTime()).toBeGreaterThanOrEqual(runs[i - 1]!.ended_at!.getTime());
      }
      expect(mostAtOnce(runs)).toBe(1);
      expect(runs.map((r) => r.attempt)).toEqual(runs.map(() => 1));
      const failed = runs.find((r) => r.ordinal === 4)!;
      const after = runs.find((r) => r.ordinal === 5)!;
      expect([after.last_outcome, after.last_permit]).toEqual(['failed', failed.permit]);
      const records = await queue.records();
      expect(records.map((r) => r.n).sort((a, b) => a - b)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
      for (const r of records)
        expect([r.n, r.state]).toEqual([r.n, r.n === failed.n ? 'failed' : 'completed']);
    } finally {
      await Promise.all(workers.map((w) => w.stop()));
      await queue.close();
    }
  });

  it('with refund and wait, the FOO after a failed one starts at once', async () => {
    const name = `${tag}_refund`;
    await ctx.ordo.throttles.define({ name, every: '2s', concurrency: 1, refundOnFailure: true });
    const queue = await driver.open(name, { attempts: 1 });
    const workers = await fifty({ ...base(name), throttle: name, wait: '30s', failRuns: [2] });
    try {
      await queue.pause?.();
      if (queue.pause) await Promise.all(workers.map((w) => w.start()));
      for (let n = 1; n <= 3; n++) await queue.add({ n, sleepMs: 200 });
      if (queue.resume) await queue.resume();
      else await Promise.all(workers.map((w) => w.start()));
      await until(
        '3 runs ended',
        async () => (await runsOf(ctx.sql, name)).filter((r) => r.ended_at).length === 3,
        20_000,
      );
      const [first, second, third] = await runsOf(ctx.sql, name);
      expect(second!.started_at.getTime() - first!.started_at.getTime()).toBeGreaterThanOrEqual(1900);
      expect(third!.last_outcome).toBe('failed');
      // Refunded: the start is not 2 s after the failed one, but as soon as it failed.
      expect(third!.started_at.getTime() - second!.ended_at!.getTime()).toBeLessThan(600);
      expect([first, second, third].map((r) => r!.attempt)).toEqual([1, 1, 1]);
    } finally {
      await Promise.all(workers.map((w) => w.stop()));
      await queue.close();
    }
  });

  it('a global and a per-tenant limit together, with costs, under 50 workers: neither ever exceeded, each job once', async () => {
    const all = `${tag}_all`;
    const tenant = `${tag}_tenant`;
    await ctx.ordo.throttles.define({ name: all, concurrency: 5 });
    await ctx.ordo.throttles.define({ name: tenant, concurrency: 2 });
    const queue = await driver.open(all, { attempts: 1 });
    const workers = await fifty({
      ...base(all),
      limits: [
        { name: all, costField: 'cost' },
        { name: tenant, keyField: 'tenant', costField: 'cost' },
      ],
    });
    try {
      const jobs: JobData[] = [];
      for (let i = 0; i < 16; i++) jobs.push({ n: jobs.length + 1, sleepMs: 150, tenant: 'a', cost: 1 });
      for (let i = 0; i < 8; i++) jobs.push({ n: jobs.length + 1, sleepMs: 150, tenant: 'b', cost: 2 });
      for (let i = 0; i < 8; i++) jobs.push({ n: jobs.length + 1, sleepMs: 150, tenant: 'c', cost: 1 });
      await queue.pause?.();
      if (queue.pause) await Promise.all(workers.map((w) => w.start()));
      for (const j of jobs) await queue.add(j);
      if (queue.resume) await queue.resume();
      else await Promise.all(workers.map((w) => w.start()));
      await until(
        '32 runs ended',
        async () => (await runsOf(ctx.sql, all)).filter((r) => r.ended_at).length === 32,
        40_000,
      );
      const runs = await runsOf(ctx.sql, all);
      expect(runs.map((r) => r.n).sort((a, b) => a - b)).toEqual(jobs.map((j) => j.n));
      expect(mostAtOnce(runs)).toBeLessThanOrEqual(5);
      expect(mostAtOnce(runs), 'the global limit is used').toBeGreaterThanOrEqual(4);
      for (const t of ['a', 'b', 'c'])
        expect(mostAtOnce(runs.filter((r) => r.tenant === t)), t).toBeLessThanOrEqual(2);
      expect(runs.every((r) => r.attempt === 1)).toBe(true);
      await until(
        'the queue to record 32 completions',
        async () => (await queue.records()).filter((r) => r.state === 'completed').length === 32,
        10_000,
      );
    } finally {
      await Promise.all(workers.map((w) => w.stop()));
      await queue.close();
    }
  });

  it('a downstream 429 thrown with retryAfter pauses the key, and the job runs again after it without using an attempt', async () => {
    const name = `${tag}_api`;
    await ctx.ordo.throttles.define({ name, concurrency: 1 });
    const queue = await driver.open(name, { attempts: 1 });
    const workers = await fifty({ ...base(name), throttle: name, limitedRuns: [1], retryAfter: '2s' });
    try {
      await queue.pause?.();
      if (queue.pause) await Promise.all(workers.map((w) => w.start()));
      await queue.add({ n: 1, sleepMs: 50 });
      await queue.add({ n: 2, sleepMs: 50 });
      if (queue.resume) await queue.resume();
      else await Promise.all(workers.map((w) => w.start()));
      await until(
        '3 runs ended',
        async () => (await runsOf(ctx.sql, name)).filter((r) => r.ended_at).length === 3,
        20_000,
      );
      const [limited, next, last] = await runsOf(ctx.sql, name);
      expect(next!.started_at.getTime() - limited!.ended_at!.getTime()).toBeGreaterThanOrEqual(1900);
      expect(next!.last_outcome).toBe('failed');
      expect([next!.n, last!.n].sort()).toEqual([1, 2]);
      expect([limited, next, last].map((r) => r!.attempt)).toEqual([1, 1, 1]);
      await until(
        'the queue to record 2 completions',
        async () => (await queue.records()).filter((r) => r.state === 'completed').length === 2,
        10_000,
      );
    } finally {
      await Promise.all(workers.map((w) => w.stop()));
      await queue.close();
    }
  });

  it("a permit lost mid-job aborts the processor's signal, and the job fails with that reason", async () => {
    const name = `${tag}_lost`;
    await ctx.ordo.throttles.define({ name, concurrency: 1, lease: '1500ms' });
    const queue = await driver.open(name, { attempts: 1 });
    const worker = await startQueueWorker({ ...base(name), concurrency: 1, throttle: name, abortRuns: [1] });
    try {
      await worker.start();
      await queue.add({ n: 1, sleepMs: 0 });
      await until('the run to start', async () => (await runsOf(ctx.sql, name)).length === 1, 20_000);
      const [run] = await runsOf(ctx.sql, name);
      // Someone else ends the permit: the next renewal of its lease finds it gone.
      await ctx.ordo.throttles.complete(run!.permit);
      await until(
        'the processor to see its signal abort',
        async () => (await runsOf(ctx.sql, name))[0]!.ended_at !== null,
        10_000,
      );
      expect(['permit_not_found', 'permit_expired']).toContain((await runsOf(ctx.sql, name))[0]!.aborted);
      await until(
        'the queue to record the failure',
        async () => (await queue.records()).some((r) => r.state === 'failed'),
        10_000,
      );
    } finally {
      await worker.stop();
      await queue.close();
    }
  });

  it('a worker killed with SIGKILL mid-job: its lease lapses (expired), the queue retries the job, and the limit holds meanwhile', async () => {
    const name = `${tag}_kill`;
    await ctx.ordo.throttles.define({ name, concurrency: 1, lease: '2s' });
    const queue = await driver.open(name, { attempts: 3 });
    const config: WorkerConfig = { ...base(name), concurrency: 1, throttle: name, hangRuns: [1] };
    const killed = await startQueueWorker(config);
    let taker: QueueWorker | undefined;
    try {
      await killed.start();
      await queue.add({ n: 1, sleepMs: 100 });
      await until('the first run to start', async () => (await runsOf(ctx.sql, name)).length === 1, 20_000);
      await sleep(1000); // the lease is extended meanwhile
      const { rows } = await ctx.sql.query<{ now: Date }>('SELECT now()');
      killed.child.kill('SIGKILL');
      const killedAt = rows[0]!.now.getTime();
      taker = await startQueueWorker(config);
      await taker.start();
      await queue.recover();
      await until(
        'the job to run again',
        async () => (await runsOf(ctx.sql, name)).filter((r) => r.ended_at).length === 1,
        30_000,
      );
      const [first, again] = await runsOf(ctx.sql, name);
      expect(first!.ended_at).toBeNull();
      expect(again!.n).toBe(1);
      expect([again!.last_outcome, again!.last_permit]).toEqual(['expired', first!.permit]);
      // The killed worker had extended its lease (2 s) at most 2/3 s before it died.
      expect(again!.started_at.getTime() - killedAt).toBeGreaterThanOrEqual(1300);
      await until(
        'the queue to record the completion',
        async () => (await queue.records()).some((r) => r.state === 'completed'),
        10_000,
      );
    } finally {
      killed.child.kill('SIGKILL');
      await taker?.stop();
      await queue.close();
    }
  });
}

/**
 * What importing an adapter and calling throttled() says in an application that has ordo and its
 * dependencies but not the queue library: a copy of src/ beside a node_modules holding only
 * ordo's own dependencies, run by a process of its own.
 */
export async function withoutQueueLibrary(adapter: string): Promise<string> {
  const { mkdtemp, cp, mkdir, symlink, writeFile, rm, readFile } = await import('node:fs/promises');
  const { tmpdir } = await import('node:os');
  const { join } = await import('node:path');
  const { execFile } = await import('node:child_process');
  const dir = await mkdtemp(join(tmpdir(), 'ordo-no-queue-'));
  try {
    await cp(join(ROOT, 'src'), join(dir, 'src'), { recursive: true });
    await cp(join(ROOT, 'sql'), join(dir, 'sql'), { recursive: true });
    const own = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as {
      dependencies: Record<string, string>;
    };
    await mkdir(join(dir, 'node_modules', '@fastify'), { recursive: true });
    await mkdir(join(dir, 'node_modules', '@types'), { recursive: true });
    for (const dep of Object.keys(own.dependencies))
      await symlink(join(ROOT, 'node_modules', dep), join(dir, 'node_modules', dep));
    await writeFile(join(dir, 'package.json'), '{ "type": "module" }');
    await writeFile(
      join(dir, 'probe.ts'),
      `const { throttled } = await import('./src/adapters/${adapter}.js');
       try { await (throttled as any)({}, { throttle: 'FOO' }, () => undefined); console.log('no error'); }
       catch (e) { console.log(JSON.stringify({ code: (e as any).code, message: (e as Error).message })); }`,
    );
    const tsx = join(ROOT, 'node_modules', 'tsx', 'dist', 'esm', 'index.mjs');
    return await new Promise<string>((resolve, reject) =>
      execFile(process.execPath, ['--import', tsx, 'probe.ts'], { cwd: dir }, (error, stdout, stderr) =>
        error ? reject(new Error(`${error.message}\n${stderr}`)) : resolve(stdout.trim()),
      ),
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
