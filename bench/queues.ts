import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { Queue, Worker } from 'bullmq';
import { Logger, makeWorkerUtils, run } from 'graphile-worker';
import PgBoss from 'pg-boss';
import { throttled as bullmqThrottled } from '../src/adapters/bullmq.js';
import { throttled as graphileThrottled } from '../src/adapters/graphile-worker.js';
import { throttled as pgBossThrottled } from '../src/adapters/pg-boss.js';
import { createOrdo, type Ordo } from '../src/index.js';
import { type BenchContext, fmt, ratioCell, type Suite, type Table } from './harness.js';

/**
 * Jobs per second through each queue library on this machine (workers in this process, jobs
 * that do nothing): with ordo's adapter on a throttle whose limit is never reached (each job an
 * acquire and a completion), beside the same queue without it, and, for BullMQ, beside its own
 * `limiter` with the same limit. What the adapter costs a job; goal ≥ 0.5× of the queue alone.
 */

const GOAL = 0.5;
const THROTTLE = 'bench_queue_open';
/** The same limit as a plain rate limiter: a start and nothing more, no permit row (permits: false). */
const STARTS_ONLY = 'bench_queue_starts';
/** Tenants the jobs of the keyed scenario are spread over. */
const KEYS = 1000;
const NEVER_REACHED = 1_000_000;
const CONCURRENCY = 50;
const REDIS = { host: '127.0.0.1', port: 6379 };
const quiet = new Logger(() => () => undefined);

/** One way of running a queue's workers: drains `jobs` jobs once, and answers how long it took. */
type Drain = (jobs: number) => Promise<number>;

interface QueueBench {
  name: string;
  /** Jobs per drain: enough for a second or more of work at the queue's pace here. */
  jobs: number;
  scenarios: Record<string, Drain>;
  close(): Promise<void>;
}

async function bullmq(ordo: Ordo): Promise<QueueBench> {
  const prefix = `ordo-bench-${randomBytes(4).toString('hex')}`;
  const queues: Queue[] = [];
  const drain =
    (
      processor: () => Promise<(job: any, token?: string, signal?: AbortSignal) => Promise<unknown>>,
      limiter?: boolean,
    ): Drain =>
    async (jobs) => {
      const name = `q${queues.length}`;
      const queue = new Queue(name, { connection: REDIS, prefix });
      queues.push(queue);
      await queue.addBulk(Array.from({ length: jobs }, (_, n) => ({ name: 'job', data: { n } })));
      let done = 0;
      const started = performance.now();
      const worker = new Worker(name, await processor(), {
        connection: REDIS,
        prefix,
        concurrency: CONCURRENCY,
        removeOnComplete: { count: 0 },
        ...(limiter ? { limiter: { max: NEVER_REACHED, duration: 1000 } } : {}),
      });
      worker.on('completed', () => void done++);
      while (done < jobs) await sleep(5);
      const ms = performance.now() - started;
      await worker.close();
      return ms;
    };
  const nothing = async () => async () => undefined;
  return {
    name: 'BullMQ 6',
    jobs: 4000,
    scenarios: {
      alone: drain(nothing),
      'own limiter': drain(nothing, true),
      'ordo adapter': drain(() => bullmqThrottled(ordo, { throttle: THROTTLE }, () => undefined)),
      'ordo adapter, 1,000 keys': drain(() =>
        bullmqThrottled(ordo, { throttle: THROTTLE, key: (job) => `t${job.data.n % KEYS}` }, () => undefined),
      ),
      'ordo adapter, permits: false': drain(() =>
        bullmqThrottled(ordo, { throttle: STARTS_ONLY }, () => undefined),
      ),
    },
    async close() {
      for (const q of queues) {
        await q.obliterate({ force: true });
        await q.close();
      }
    },
  };
}

async function pgBoss(ordo: Ordo, url: string): Promise<QueueBench> {
  const boss = new PgBoss({ connectionString: url, max: 10, supervise: false, schedule: false });
  boss.on('error', () => undefined);
  await boss.start();
  let queues = 0;
  // A job per fetch would wait out the polling interval after each; batches of 50, two loops.
  const drain =
    (handler: () => Promise<(jobs: PgBoss.Job<object>[]) => Promise<unknown>>): Drain =>
    async (jobs) => {
      const name = `q${queues++}`;
      await boss.createQueue(name);
      await boss.insert(Array.from({ length: jobs }, (_, n) => ({ name, data: { n } })));
      const h = await handler();
      const started = performance.now();
      const ids = await Promise.all(
        [0, 1].map(() => boss.work(name, { batchSize: CONCURRENCY, pollingIntervalSeconds: 0.5 }, h)),
      );
      const count = async () =>
        Number(
          (
            await boss
              .getDb()
              .executeSql(`SELECT count(*) AS n FROM pgboss.job WHERE name = $1 AND state = 'completed'`, [
                name,
              ])
          ).rows[0].n,
        );
      while ((await count()) < jobs) await sleep(20);
      const ms = performance.now() - started;
      for (const id of ids) await boss.offWork({ id });
      return ms;
    };
  return {
    name: 'pg-boss 10',
    jobs: 3000,
    scenarios: {
      alone: drain(async () => async () => undefined),
      'ordo adapter': drain(() => pgBossThrottled(ordo, { boss, throttle: THROTTLE }, () => undefined)),
    },
    close: () => boss.stop({ graceful: false, wait: true }),
  };
}

async function graphileWorker(ordo: Ordo, url: string): Promise<QueueBench> {
  const utils = await makeWorkerUtils({ connectionString: url, logger: quiet });
  await utils.migrate();
  const drain =
    (task: () => Promise<(payload: unknown, helpers: any) => Promise<void>>): Drain =>
    async (jobs) => {
      await utils.addJobs(Array.from({ length: jobs }, (_, n) => ({ identifier: 'job', payload: { n } })));
      let done = 0;
      const started = performance.now();
      const runner = await run({
        connectionString: url,
        concurrency: CONCURRENCY,
        maxPoolSize: 10,
        noHandleSignals: true,
        logger: quiet,
        taskList: { job: await task() },
      });
      runner.events.on('job:success', () => void done++);
      while (done < jobs) await sleep(5);
      const ms = performance.now() - started;
      await runner.stop();
      return ms;
    };
  return {
    name: 'graphile-worker 0.17',
    jobs: 3000,
    scenarios: {
      alone: drain(async () => async () => undefined),
      'ordo adapter': drain(() => graphileThrottled(ordo, { throttle: THROTTLE }, () => undefined)),
    },
    close: async () => utils.release(),
  };
}

export const queues: Suite = {
  name: 'queues',
  async run(ctx: BenchContext): Promise<Table[]> {
    const ordo = await createOrdo({ databaseUrl: ctx.url });
    await ordo.throttles.define({ name: THROTTLE, concurrency: NEVER_REACHED, overwrite: true });
    await ordo.throttles.define({
      name: STARTS_ONLY,
      limit: NEVER_REACHED,
      per: '1s',
      permits: false,
      overwrite: true,
    });
    const rows: (string[] | null)[] = [];
    const failures: string[] = [];
    const rounds = Math.max(1, Math.min(ctx.rounds, 3));
    try {
      for (const make of [
        () => bullmq(ordo),
        () => pgBoss(ordo, ctx.url),
        () => graphileWorker(ordo, ctx.url),
      ]) {
        const q = await make();
        try {
          const names = Object.keys(q.scenarios);
          const total = Object.fromEntries(names.map((n) => [n, 0]));
          // Alternated, each first once: a warm-up drain, then `rounds` measured.
          for (let r = -1; r < rounds; r++) {
            for (let i = 0; i < names.length; i++) {
              const name = names[(i + Math.max(r, 0)) % names.length]!;
              ctx.log(`queues: ${q.name}, ${name}, round ${r + 1}`);
              const ms = await q.scenarios[name]!(r < 0 ? Math.ceil(q.jobs / 10) : q.jobs);
              if (r >= 0) total[name]! += ms;
            }
          }
          const rate = (n: string) => (q.jobs * rounds) / (total[n]! / 1000);
          const alone = rate('alone');
          if (rows.length > 0) rows.push(null);
          for (const n of names) {
            const ratio = rate(n) / alone;
            rows.push([
              q.name,
              n,
              fmt.int(rate(n)),
              n === 'alone'
                ? '1.00×'
                : n === 'ordo adapter'
                  ? ratioCell(ratio, GOAL)
                  : `${ratio.toFixed(2)}×`,
            ]);
          }
        } finally {
          await q.close();
        }
      }
    } finally {
      await ordo.close();
    }
    return [
      {
        title: `Job queues: jobs/s with ordo's adapter on a limit never reached (${CONCURRENCY} workers, jobs that do nothing)`,
        columns: [
          { header: 'queue' },
          { header: 'workers' },
          { header: 'jobs/s', align: 'right' },
          { header: 'vs alone (goal ≥ 0.5×)', align: 'right' },
        ],
        rows,
        notes: [
          'ordo adapter: each job an acquire and a completion of a permit (shared statements), on a concurrency limit of 1,000,000, every job on one key; 1,000 keys: the key read from the job, spread over 1,000 tenants.',
          'permits: false: the same limit as a plain rate limiter (limit 1,000,000 per 1s): one statement per job, no lease and no outcome.',
          "own limiter: BullMQ's Worker limiter with the same limit (max 1,000,000 per second).",
          'pg-boss: two work() loops of batches of 50 (one job per fetch would wait out the polling interval after each).',
        ],
        failures,
      },
    ];
  },
};
