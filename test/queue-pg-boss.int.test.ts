// ordo/pg-boss against the real pg-boss 10 (its own schema in this file's database): the scenarios
// of issue 45 (test/support/queue-fixtures.ts) with 50 workers in two processes, what a refused job
// keeps when it is handed back, and what the adapter refuses at once.
import PgBoss from 'pg-boss';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { throttled } from '../src/adapters/pg-boss.js';
import { ordoDatabase, type OrdoDatabase } from './support/database.js';
import {
  createRunsTable,
  type QueueDriver,
  type QueueRecord,
  queueScenarios,
  type ScenarioContext,
  withoutQueueLibrary,
} from './support/queue-fixtures.js';
import { until } from './support/until.js';

let t: OrdoDatabase;
/** The test's own PgBoss: it creates the queues, sends, and runs pg-boss's maintenance (expiry). */
let boss: PgBoss;
const ctx = {} as ScenarioContext;

beforeAll(async () => {
  t = await ordoDatabase();
  await createRunsTable(t.sql);
  Object.assign(ctx, { ordo: t.ordo, sql: t.sql, databaseUrl: t.db.url });
  boss = new PgBoss({ connectionString: t.db.url, max: 4, maintenanceIntervalSeconds: 1, schedule: false });
  boss.on('error', () => undefined);
  await boss.start();
});
afterAll(async () => {
  await boss?.stop({ graceful: false, wait: true });
  await t?.close();
});

const driver: QueueDriver = {
  queue: 'pg-boss',
  workerConfig: { workers: 1, concurrency: 25 },
  async open(name, { attempts }) {
    // A short expiry, so that pg-boss's maintenance fails a killed worker's job within seconds.
    await boss.createQueue(name, { name, retryLimit: attempts - 1, retryDelay: 0, expireInSeconds: 5 });
    return {
      add: async (data) => void (await boss.send(name, data)),
      async records() {
        const { rows } = await t.sql.query<{ n: number; state: string }>(
          `SELECT (data->>'n')::int AS n, state FROM pgboss.job WHERE name = $1`,
          [name],
        );
        return rows.map((r): QueueRecord => ({
          n: r.n,
          state: r.state === 'completed' || r.state === 'failed' ? r.state : 'other',
        }));
      },
      // pg-boss's maintenance (every second here) fails the job after its expiry, to be retried.
      recover: async () => undefined,
      close: async () => undefined,
    };
  },
};

describe('ordo/pg-boss with pg-boss 10', { timeout: 120_000 }, () => {
  queueScenarios(driver, ctx);

  it('a refused job goes back with its data, priority, place, retry count and singleton key, under a new id', async () => {
    const name = 'pgboss_keeps';
    await t.ordo.throttles.define({ name, every: '1m' });
    await boss.createQueue(name, { name, retryLimit: 2 });
    const ran: string[] = [];
    const handler = await throttled<PgBoss.JobWithMetadata<{ n: number }>, void>(
      t.ordo,
      { boss, throttle: name },
      (job) => void ran.push(job.id),
    );
    const first = (await boss.send(name, { n: 1 }, { priority: 3 }))!;
    const second = (await boss.send(name, { n: 2 }, { priority: 3, singletonKey: 'k2' }))!;
    const before = (await boss.getJobById(name, second, { includeArchive: false }))!;
    const worker = await boss.work(name, { includeMetadata: true, pollingIntervalSeconds: 0.5 }, handler);
    try {
      await until('the first to run and the second to be handed back', async () => {
        const { rows } = await t.sql.query(
          `SELECT 1 FROM pgboss.job WHERE name = $1 AND data->>'n' = '2' AND state = 'created' AND start_after > now()`,
          [name],
        );
        return ran.length === 1 && rows.length === 1;
      });
      expect(ran).toEqual([first]);
      expect(await boss.getJobById(name, second)).toBeNull();
      const { rows } = await t.sql.query(
        `SELECT id, data, priority, created_on, retry_count, singleton_key, started_on, extract(epoch FROM start_after - now())::float AS wait_s
           FROM pgboss.job WHERE name = $1 AND data->>'n' = '2'`,
        [name],
      );
      expect(rows).toHaveLength(1);
      const back = rows[0]!;
      expect(back.id).not.toBe(second);
      expect(back).toMatchObject({
        data: { n: 2 },
        priority: 3,
        retry_count: 0,
        singleton_key: 'k2',
        started_on: null,
      });
      expect(back.created_on).toEqual(before.createdOn);
      // Back for what the throttle said: about a minute.
      expect(back.wait_s).toBeGreaterThan(50);
    } finally {
      await boss.offWork(worker);
    }
  });

  it('refuses at once: no boss, a schema without pg-boss, a throttle that does not exist, not a processor', async () => {
    await t.ordo.throttles.define({ name: 'pgboss_bad', every: '1s' });
    await expect(throttled(t.ordo, { throttle: 'pgboss_bad' } as never, () => 1)).rejects.toMatchObject({
      code: 'invalid_argument',
      message: expect.stringContaining('boss must be the PgBoss instance') as string,
    });
    await expect(
      throttled(t.ordo, { boss, throttle: 'pgboss_bad', schema: 'nothing_here' }, () => 1),
    ).rejects.toMatchObject({
      code: 'invalid_argument',
      message: expect.stringContaining("the schema 'nothing_here' has no pg-boss jobs table") as string,
    });
    await expect(throttled(t.ordo, { boss, throttle: 'pgboss_none' }, () => 1)).rejects.toMatchObject({
      code: 'throttle_not_found',
    });
    await expect(
      throttled(t.ordo, { boss, throttle: 'pgboss_bad' }, undefined as never),
    ).rejects.toMatchObject({
      code: 'invalid_argument',
      message: expect.stringContaining("takes the job's processor last") as string,
    });
  });

  it('without pg-boss installed, throttled() names the npm install', async () => {
    const said = JSON.parse(await withoutQueueLibrary('pg-boss')) as { code: string; message: string };
    expect(said).toEqual({
      code: 'invalid_argument',
      message: 'ordo/pg-boss needs pg-boss, which is not installed: npm install pg-boss',
    });
  });
});
