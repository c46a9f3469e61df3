// A worker process of a job queue (BullMQ 5 or 6, pg-boss, graphile-worker 0.16 or 0.17) whose
// processor runs under ordo's adapter, as test/queue-*.int.test.ts drive it (through
// test/support/queue-fixtures.ts). Its configuration is the JSON in QUEUE_WORKER; it prints
// `ready` once its workers are made, starts them on a line `start` on its standard input, and
// writes each run to the test's table queue_runs: the permit's grant (the database's clock), its
// end, the job's attempt, and what ordo's state said of the key when the run began.
import { setTimeout as sleep } from 'node:timers/promises';
import { createInterface } from 'node:readline';
import pg from 'pg';
import type { JobContext } from '../../src/adapters/job-permit.js';
import { createOrdo } from '../../src/index.js';

/** The queues a worker process runs: each supported major of each library. */
export type QueueName = 'bullmq' | 'bullmq-v5' | 'pg-boss' | 'graphile-worker' | 'graphile-worker-v0.16';

export interface WorkerConfig {
  queue: QueueName;
  databaseUrl: string;
  /** The queue's name (BullMQ, pg-boss) or task identifier (graphile-worker); runs are recorded under it. */
  queueName: string;
  /** BullMQ: the key prefix in Redis, one per test file. */
  prefix?: string;
  /** BullMQ: Worker objects in this process; the others: one worker of `concurrency`. */
  workers: number;
  concurrency: number;
  throttle?: string;
  /** Several limits, each key and cost read from the job's data by field name. */
  limits?: { name: string; keyField?: keyof JobData; costField?: keyof JobData }[];
  wait?: string | number;
  /** Runs (by their order in this queue, from 1) that throw an error. */
  failRuns?: number[];
  /** Runs that throw an error with `retryAfter`, as a downstream 429. */
  limitedRuns?: number[];
  /** Runs that wait for their signal to abort (their permit ended by the test), and record why. */
  abortRuns?: number[];
  /** Runs that hang for a minute (to be killed). */
  hangRuns?: number[];
  /** graphile-worker: its schema, one per major. */
  schema?: string;
  retryAfter?: string | number;
  /** BullMQ: the lock's duration and the stall check's interval (ms), short for the SIGKILL test. */
  lockDuration?: number;
}

export interface JobData {
  n: number;
  sleepMs: number;
  tenant?: string;
  cost?: number;
}

const config = JSON.parse(process.env.QUEUE_WORKER!) as WorkerConfig;
const ordo = await createOrdo({ databaseUrl: config.databaseUrl, poolSize: 10 });
const sql = new pg.Pool({ connectionString: config.databaseUrl, max: 4 });

/** The job's processor: records the run, works for data.sleepMs, then ends as the test asked. */
async function work(jobId: string, data: JobData, context: JobContext, attempt: number): Promise<number> {
  const { permit } = context;
  const state = await ordo.throttles.state(permit.name, permit.key);
  const { rows } = await sql.query<{ ordinal: number }>(
    `INSERT INTO queue_runs (queue, n, job_id, permit, started_at, expires_at, attempt, pid, tenant, cost,
                             last_outcome, last_permit, ordinal)
     SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, count(*) + 1 FROM queue_runs WHERE queue = $1
     RETURNING ordinal`,
    [
      config.queueName,
      data.n,
      jobId,
      permit.id,
      permit.acquiredAt,
      permit.expiresAt,
      attempt,
      process.pid,
      data.tenant ?? null,
      data.cost ?? 1,
      state.lastOutcome,
      state.lastPermitId,
    ],
  );
  const ordinal = rows[0]!.ordinal;
  if (config.abortRuns?.includes(ordinal)) {
    const { signal } = context;
    await new Promise((resolve) => {
      signal.addEventListener('abort', resolve, { once: true });
      setTimeout(resolve, 15_000);
    });
    const reason = signal.reason as { code?: string } | undefined;
    await sql.query('UPDATE queue_runs SET ended_at = clock_timestamp(), aborted = $2 WHERE permit = $1', [
      permit.id,
      signal.aborted ? (reason?.code ?? String(reason)) : 'not aborted',
    ]);
    throw signal.aborted ? signal.reason : new Error('the signal was not aborted');
  }
  await sleep(config.hangRuns?.includes(ordinal) ? 60_000 : data.sleepMs);
  await sql.query('UPDATE queue_runs SET ended_at = clock_timestamp() WHERE permit = $1', [permit.id]);
  if (config.failRuns?.includes(ordinal)) throw new Error(`run ${ordinal} failed on purpose`);
  if (config.limitedRuns?.includes(ordinal))
    throw Object.assign(new Error(`429 on run ${ordinal}`), { retryAfter: config.retryAfter });
  return data.n;
}

const options = {
  throttle: config.throttle!,
  ...(config.wait === undefined ? {} : { wait: config.wait }),
};
/** The limits as the adapter takes them, keys and costs read from each job's data. */
function limitsFor<J>(data: (job: J) => JobData) {
  if (config.limits === undefined) return options;
  return {
    ...options,
    throttle: config.limits.map((l) => ({
      name: l.name,
      ...(l.keyField === undefined ? {} : { key: (job: J) => String(data(job)[l.keyField!]) }),
      ...(l.costField === undefined ? {} : { cost: (job: J) => Number(data(job)[l.costField!] ?? 1) }),
    })),
  };
}

const starters: (() => unknown)[] = [];
const stoppers: (() => Promise<unknown>)[] = [];

if (config.queue === 'bullmq' || config.queue === 'bullmq-v5') {
  const { Worker } = (await import(config.queue)) as typeof import('bullmq');
  const { throttled } = await import('../../src/adapters/bullmq.js');
  type Job = import('bullmq').Job<JobData>;
  const processor = await throttled<Job, number>(
    ordo,
    limitsFor<Job>((j) => j.data),
    (job, context) => work(job.id!, job.data, context, job.attemptsMade + 1),
  );
  for (let i = 0; i < config.workers; i++) {
    const worker = new Worker(config.queueName, processor, {
      connection: { host: '127.0.0.1', port: 6379 },
      prefix: config.prefix!,
      concurrency: config.concurrency,
      autorun: false,
      ...(config.lockDuration === undefined
        ? {}
        : { lockDuration: config.lockDuration, stalledInterval: config.lockDuration }),
    });
    worker.on('error', () => undefined);
    starters.push(() => void worker.run());
    stoppers.push(() => worker.close());
  }
} else if (config.queue === 'pg-boss') {
  const { default: PgBoss } = await import('pg-boss');
  const { throttled } = await import('../../src/adapters/pg-boss.js');
  type Job = import('pg-boss').JobWithMetadata<JobData>;
  const boss = new PgBoss({
    connectionString: config.databaseUrl,
    max: 10,
    supervise: false,
    schedule: false,
  });
  boss.on('error', () => undefined);
  await boss.start();
  const handler = await throttled<Job, number>(
    ordo,
    { ...limitsFor<Job>((j) => j.data), boss },
    (job, context) => work(job.id, job.data, context, job.retryCount + 1),
  );
  starters.push(async () => {
    for (let i = 0; i < config.concurrency; i++)
      await boss.work(config.queueName, { includeMetadata: true, pollingIntervalSeconds: 0.5 }, handler);
  });
  stoppers.push(() => boss.stop({ graceful: false, wait: true }));
} else {
  const { run } = (await import(config.queue)) as typeof import('graphile-worker');
  const { throttled } = await import('../../src/adapters/graphile-worker.js');
  type Job = import('graphile-worker').Job;
  const task = await throttled<Job>(
    ordo,
    { ...limitsFor<Job>((j) => j.payload as JobData), schema: config.schema! },
    async (payload, helpers, context) => {
      await work(helpers.job.id, payload as JobData, context, helpers.job.attempts);
    },
  );
  starters.push(async () => {
    const runner = await run({
      connectionString: config.databaseUrl,
      concurrency: config.concurrency,
      pollInterval: 200,
      noHandleSignals: true,
      noPreparedStatements: true,
      schema: config.schema!,
      taskList: { [config.queueName]: task },
      logger: quietLogger(await import(config.queue)),
    });
    stoppers.push(() => runner.stop());
  });
}

function quietLogger(gw: typeof import('graphile-worker')) {
  return new gw.Logger(() => () => undefined);
}

console.log('ready');
const lines = createInterface({ input: process.stdin });
lines.on('line', (line) => {
  if (line === 'start') {
    void Promise.all(starters.map((s) => s())).then(() => console.log(JSON.stringify({ event: 'started' })));
  } else if (line === 'stop') {
    void (async () => {
      for (const stop of stoppers) await stop().catch(() => undefined);
      await ordo.close();
      await sql.end();
      process.exit(0);
    })();
  }
});
