// ordo/graphile-worker against the real graphile-worker 0.17 and 0.16 (a schema of each one's own
// in this file's database): the scenarios of issue 45 (test/support/queue-fixtures.ts) with 50
// workers in two processes, what a refused job keeps when it is handed back, and what the adapter
// refuses at once.
import * as gw17 from 'graphile-worker';
import * as gw16 from 'graphile-worker-v0.16';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { throttled } from '../src/adapters/graphile-worker.js';
import { ordoDatabase, type OrdoDatabase } from './support/database.js';
import {
  createRunsTable,
  type QueueDriver,
  type QueueRecord,
  queueScenarios,
  type ScenarioContext,
  withoutQueueLibrary,
} from './support/queue-fixtures.js';
import type { QueueName } from './support/queue-worker.js';
import { until } from './support/until.js';

let t: OrdoDatabase;
const ctx = {} as ScenarioContext;
const utils: gw17.WorkerUtils[] = [];

beforeAll(async () => {
  t = await ordoDatabase();
  await createRunsTable(t.sql);
  Object.assign(ctx, { ordo: t.ordo, sql: t.sql, databaseUrl: t.db.url });
});
afterAll(async () => {
  await Promise.all(utils.map((u) => u.release()));
  await t?.close();
});

const quiet = (lib: typeof gw17) => new lib.Logger(() => () => undefined);

async function workerUtils(lib: typeof gw17, schema: string): Promise<gw17.WorkerUtils> {
  const u = await lib.makeWorkerUtils({ connectionString: t.db.url, schema, logger: quiet(lib) });
  await u.migrate();
  utils.push(u);
  return u;
}

function driver(queue: QueueName, lib: typeof gw17, schema: string): QueueDriver {
  return {
    queue,
    workerConfig: { workers: 1, concurrency: 25, schema },
    async open(name, { attempts }) {
      const u = await workerUtils(lib, schema);
      const added: number[] = [];
      return {
        async add(data) {
          await u.addJob(name, data, { maxAttempts: attempts });
          added.push(data.n);
        },
        async records() {
          // A completed job is deleted: what is left is failed for good, or still to run.
          const { rows } = await t.sql.query<{ n: number; failed: boolean }>(
            `SELECT (j.payload->>'n')::int AS n, j.attempts >= j.max_attempts AND j.locked_at IS NULL AS failed
               FROM "${schema}"._private_jobs j JOIN "${schema}"._private_tasks k ON k.id = j.task_id
              WHERE k.identifier = $1`,
            [name],
          );
          return added.map((n): QueueRecord => {
            const left = rows.filter((r) => r.n === n);
            if (left.length === 0) return { n, state: 'completed' };
            return { n, state: left.length === 1 && left[0]!.failed ? 'failed' : 'other' };
          });
        },
        // graphile-worker frees a dead worker's jobs after 4 hours, or at once when told that
        // the worker is gone (forceUnlockWorkers), as an orchestrator that saw it die does.
        async recover() {
          const { rows } = await t.sql.query<{ locked_by: string }>(
            `SELECT DISTINCT j.locked_by FROM "${schema}"._private_jobs j
               JOIN "${schema}"._private_tasks k ON k.id = j.task_id
              WHERE k.identifier = $1 AND j.locked_by IS NOT NULL`,
            [name],
          );
          await u.forceUnlockWorkers(rows.map((r) => r.locked_by));
        },
        close: async () => undefined,
      };
    },
  };
}

describe('ordo/graphile-worker with graphile-worker 0.17', { timeout: 120_000 }, () => {
  queueScenarios(driver('graphile-worker', gw17, 'gw17'), ctx);
});

describe('ordo/graphile-worker with graphile-worker 0.16', { timeout: 120_000 }, () => {
  queueScenarios(driver('graphile-worker-v0.16', gw16 as unknown as typeof gw17, 'gw16'), ctx);
});

describe('ordo/graphile-worker', () => {
  it('a refused job goes back with its payload, key, priority and named queue (unlocked), its attempt given back, under a new id', async () => {
    const name = 'gw_keeps';
    await t.ordo.throttles.define({ name, every: '1m' });
    const u = await workerUtils(gw17, 'gw_keeps');
    const ran: string[] = [];
    const task = await throttled(t.ordo, { throttle: name, schema: 'gw_keeps' }, (payload, helpers) => {
      ran.push(helpers.job.id);
    });
    const first = await u.addJob(name, { n: 1 }, { priority: 1 });
    const second = await u.addJob(
      name,
      { n: 2 },
      { priority: 1, jobKey: 'k2', queueName: 'serial', maxAttempts: 1 },
    );
    const runner = await gw17.run({
      connectionString: t.db.url,
      schema: 'gw_keeps',
      concurrency: 1,
      pollInterval: 100,
      noHandleSignals: true,
      taskList: { [name]: task },
      logger: quiet(gw17),
    });
    try {
      await until('the first to run and the second to be handed back', async () => {
        const { rows } = await t.sql.query(
          `SELECT 1 FROM gw_keeps._private_jobs WHERE payload->>'n' = '2' AND locked_at IS NULL AND run_at > now()`,
        );
        return ran.length === 1 && rows.length === 1;
      });
      expect(ran).toEqual([first.id]);
      const { rows } = await t.sql.query(
        `SELECT j.id, j.payload, j.key, j.priority, j.attempts, j.max_attempts, q.queue_name, q.locked_by AS queue_locked_by,
                extract(epoch FROM j.run_at - now())::float AS wait_s
           FROM gw_keeps._private_jobs j LEFT JOIN gw_keeps._private_job_queues q ON q.id = j.job_queue_id`,
      );
      expect(rows).toHaveLength(1);
      const back = rows[0]!;
      expect(back.id).not.toBe(second.id);
      // No attempt used (maxAttempts 1: an attempt used would have failed it for good).
      expect(back).toMatchObject({
        payload: { n: 2 },
        key: 'k2',
        priority: 1,
        attempts: 0,
        max_attempts: 1,
        queue_name: 'serial',
        queue_locked_by: null,
      });
      expect(back.wait_s).toBeGreaterThan(50);
    } finally {
      await runner.stop();
    }
  });

  it('refuses at once: a throttle that does not exist, not a processor, a bad schema name', async () => {
    await t.ordo.throttles.define({ name: 'gw_bad', every: '1s' });
    await expect(throttled(t.ordo, { throttle: 'gw_none' }, () => undefined)).rejects.toMatchObject({
      code: 'throttle_not_found',
    });
    await expect(throttled(t.ordo, { throttle: 'gw_bad' }, {} as never)).rejects.toMatchObject({
      code: 'invalid_argument',
      message: expect.stringContaining("takes the job's processor last") as string,
    });
    await expect(
      throttled(t.ordo, { throttle: 'gw_bad', schema: 'a"b' }, () => undefined),
    ).rejects.toMatchObject({
      code: 'invalid_argument',
      message: expect.stringContaining('schema must be an identifier') as string,
    });
  });

  it('without graphile-worker installed, throttled() names the npm install', async () => {
    const said = JSON.parse(await withoutQueueLibrary('graphile-worker')) as {
      code: string;
      message: string;
    };
    expect(said).toEqual({
      code: 'invalid_argument',
      message:
        'ordo/graphile-worker needs graphile-worker, which is not installed: npm install graphile-worker',
    });
  });
});
