// ordo/bullmq against the real BullMQ 6 and 5 on the machine's Redis (a key prefix of this file's
// own): the scenarios of issue 45 (test/support/queue-fixtures.ts) with 50 workers in two
// processes, then what the adapter refuses at once.
import { randomBytes } from 'node:crypto';
import * as bullmq5 from 'bullmq-v5';
import * as bullmq6 from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { throttled } from '../src/adapters/bullmq.js';
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

const connection = { host: '127.0.0.1', port: 6379 };
const prefix = `ordo-test-${randomBytes(4).toString('hex')}`;
let t: OrdoDatabase;
const ctx = {} as ScenarioContext;

beforeAll(async () => {
  t = await ordoDatabase();
  await createRunsTable(t.sql);
  Object.assign(ctx, { ordo: t.ordo, sql: t.sql, databaseUrl: t.db.url });
});
afterAll(async () => {
  await t?.close();
});

function driver(queue: 'bullmq' | 'bullmq-v5', lib: typeof bullmq6): QueueDriver {
  return {
    queue,
    // A short lock, so that a killed worker's job is found stalled within a second or two.
    workerConfig: { prefix: `${prefix}-${queue}`, workers: 1, concurrency: 25, lockDuration: 1000 },
    async open(name, { attempts }) {
      const q = new lib.Queue(name, { connection, prefix: `${prefix}-${queue}` });
      return {
        add: async (data) => void (await q.add('FOO', data, { attempts })),
        pause: () => q.pause(),
        resume: () => q.resume(),
        async records() {
          const ended = await Promise.all(
            (['completed', 'failed'] as const).map(async (state) =>
              (await q.getJobs([state])).map((j): QueueRecord => ({ n: j.data.n as number, state })),
            ),
          );
          return ended.flat();
        },
        // BullMQ finds the job stalled by itself (its lock lapses) and puts it back in wait.
        recover: async () => undefined,
        async close() {
          await q.obliterate({ force: true });
          await q.close();
        },
      };
    },
  };
}

describe('ordo/bullmq with BullMQ 6', { timeout: 120_000 }, () => {
  queueScenarios(driver('bullmq', bullmq6), ctx);
});

describe('ordo/bullmq with BullMQ 5', { timeout: 120_000 }, () => {
  queueScenarios(driver('bullmq-v5', bullmq5 as unknown as typeof bullmq6), ctx);
});

describe('ordo/bullmq refuses at once', () => {
  it('something that is not a processor, a throttle that does not exist, options it does not know', async () => {
    await t.ordo.throttles.define({ name: 'bad_input', every: '1s' });
    const refused = (p: Promise<unknown>) => expect(p).rejects;
    await refused(throttled(t.ordo, { throttle: 'bad_input' }, 'processor.js' as never)).toMatchObject({
      code: 'invalid_argument',
      message: expect.stringContaining("takes the job's processor last, a function") as string,
    });
    await refused(throttled(t.ordo, { throttle: 'no_such' }, () => 1)).toMatchObject({
      code: 'throttle_not_found',
      message: expect.stringContaining("define it (ordo.throttles.define({ name: 'no_such'") as string,
    });
    await refused(
      throttled(t.ordo, [{ name: 'bad_input' }, { name: 'no_such' }] as never, () => 1),
    ).toMatchObject({
      code: 'invalid_argument',
    });
    await refused(
      throttled(t.ordo, { throttle: [{ name: 'bad_input' }, { name: 'no_such' }] }, () => 1),
    ).toMatchObject({
      code: 'throttle_not_found',
    });
    await refused(throttled({} as never, { throttle: 'bad_input' }, () => 1)).toMatchObject({
      code: 'invalid_argument',
      message: expect.stringContaining('takes an ordo client first') as string,
    });
    await refused(throttled(t.ordo, { throttle: 'bad_input', keys: 'x' } as never, () => 1)).toMatchObject({
      code: 'invalid_argument',
      message: expect.stringContaining("has no option 'keys'") as string,
    });
    await refused(throttled(t.ordo, { throttle: [{ name: 'bad_input' }], key: 'x' }, () => 1)).toMatchObject({
      code: 'invalid_argument',
      message: expect.stringContaining('give each its own key and cost') as string,
    });
    await refused(throttled(t.ordo, { throttle: 'bad_input', cost: 0 }, () => 1)).toMatchObject({
      code: 'invalid_argument',
      message: expect.stringContaining("the cost of 'bad_input' must be a whole number from 1") as string,
    });
    await refused(throttled(t.ordo, { throttle: 'bad_input', wait: '11m' }, () => 1)).toMatchObject({
      code: 'invalid_argument',
      message: expect.stringContaining('wait must be a duration') as string,
    });
    await refused(throttled(t.ordo, { throttle: '1-bad' }, () => 1)).toMatchObject({
      code: 'invalid_argument',
    });
  });

  it('a key read from the job that is not a text fails that job, saying so', async () => {
    await t.ordo.throttles.define({ name: 'bad_key', every: '1s' });
    const name = 'bad_key';
    const queue = new bullmq6.Queue(name, { connection, prefix });
    const processor = await throttled<bullmq6.Job, number>(
      t.ordo,
      { throttle: 'bad_key', key: (job) => job.data.tenant as string },
      () => 1,
    );
    const worker = new bullmq6.Worker(name, processor, { connection, prefix });
    try {
      await queue.add('FOO', { tenant: 42 }, { attempts: 1 });
      await until('the job to fail', async () => (await queue.getJobCounts('failed')).failed === 1);
      const [job] = await queue.getJobs(['failed']);
      expect(job!.failedReason).toContain("the key read from the job for 'bad_key' must be a text");
    } finally {
      await worker.close();
      await queue.obliterate({ force: true });
      await queue.close();
    }
  });

  it('without bullmq installed, throttled() names the npm install', async () => {
    const said = JSON.parse(await withoutQueueLibrary('bullmq')) as { code: string; message: string };
    expect(said).toEqual({
      code: 'invalid_argument',
      message: 'ordo/bullmq needs bullmq, which is not installed: npm install bullmq',
    });
  });
});
