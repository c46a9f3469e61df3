// docs/queues.md's examples run as written, against the real queues: each TypeScript block in the
// guide's order, its imports given to it (the adapters from src/, the queue libraries), and then
// jobs added to what it made, to see them run under the throttle it names and the others handed
// back. BullMQ's queue is renamed from 'jobs' to one of this file's own (Redis is shared).
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { runInNewContext } from 'node:vm';
import { Queue, Worker } from 'bullmq';
import { Logger, makeWorkerUtils, run } from 'graphile-worker';
import PgBoss from 'pg-boss';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import * as bullmqAdapter from '../src/adapters/bullmq.js';
import * as graphileAdapter from '../src/adapters/graphile-worker.js';
import * as pgBossAdapter from '../src/adapters/pg-boss.js';
import { ordoDatabase, type OrdoDatabase } from './support/database.js';
import { fencedBlocks } from './support/readme.js';
import { until } from './support/until.js';

const GUIDE = new URL('../docs/queues.md', import.meta.url);
const blocks = fencedBlocks(readFileSync(GUIDE, 'utf8')).filter((b) => b.lang === 'ts');
const connection = { host: '127.0.0.1', port: 6379 };
const bullQueue = `guide-${randomBytes(4).toString('hex')}`;

let t: OrdoDatabase;
const done: (() => Promise<unknown>)[] = [];
beforeAll(async () => {
  t = await ordoDatabase();
});
afterAll(async () => {
  for (const d of done.reverse()) await d().catch(() => undefined);
  await t?.close();
});

/** The block that imports from `from`, or (from undefined) the blocks that import nothing. */
function block(from: string): string {
  const found = blocks.find((b) => b.code.includes(`from '${from}'`));
  if (!found) throw new Error(`docs/queues.md has no example importing ${from}`);
  return found.code;
}

/** Runs a block as the body of an async function, its imports removed, with `scope` as its globals. */
async function runBlock(code: string, scope: Record<string, unknown>, returns: string): Promise<any> {
  const body = `${code.replace(/^import .*;$/gm, '')}\nreturn ${returns};`;
  const { outputText } = ts.transpileModule(`(async () => {\n${body}\n})`, {
    compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
  });
  const fn = runInNewContext(outputText, { ...scope, console }) as () => Promise<unknown>;
  return fn();
}

describe("docs/queues.md's examples", { timeout: 60_000 }, () => {
  const worked: unknown[] = [];
  const work = async (data: unknown) => void worked.push(data);

  it('define FOO', async () => {
    const define = blocks.find((b) => b.code.includes("name: 'FOO'") && !b.code.includes('import '))!;
    await runBlock(define.code, { ordo: t.ordo }, 'undefined');
    expect(await t.ordo.throttles.get('FOO')).toMatchObject({ everyMs: 60_000, concurrency: 1 });
  });

  it('BullMQ: one FOO of a tenant runs, the others wait delayed with no attempt used', async () => {
    const code = block('ordo/bullmq').replace("'jobs'", JSON.stringify(bullQueue));
    const worker = (await runBlock(
      code,
      { Worker, throttled: bullmqAdapter.throttled, ordo: t.ordo, connection, work },
      'worker',
    )) as Worker;
    const queue = new Queue(bullQueue, { connection });
    done.push(async () => {
      await worker.close();
      await queue.obliterate({ force: true });
      await queue.close();
    });
    await queue.addBulk([1, 2, 3].map((n) => ({ name: 'FOO', data: { tenant: 'b1', n } })));
    await queue.add('FOO', { tenant: 'b2', n: 4 });
    await until('one FOO of each tenant', () => worked.length === 2);
    await until('two jobs delayed', async () => (await queue.getDelayedCount()) === 2);
    for (const job of await queue.getDelayed()) expect(job.attemptsMade).toBe(0);
  });

  it('pg-boss: one FOO of a tenant runs, the other goes back to its queue', async () => {
    worked.length = 0;
    const boss = (await runBlock(
      block('ordo/pg-boss'),
      { PgBoss, throttled: pgBossAdapter.throttled, ordo: t.ordo, databaseUrl: t.db.url, work },
      'boss',
    )) as PgBoss;
    done.push(() => boss.stop({ graceful: false, wait: true }));
    await boss.send('jobs', { tenant: 'p1', n: 1 });
    await boss.send('jobs', { tenant: 'p1', n: 2 });
    await until('one FOO', () => worked.length === 1, 10_000);
    await until('the other handed back', async () => {
      const { rows } = await t.sql.query(
        `SELECT 1 FROM pgboss.job WHERE name = 'jobs' AND state = 'created' AND start_after > now() + interval '50 seconds'`,
      );
      return rows.length === 1;
    });
  });

  it('graphile-worker: one FOO of a tenant runs, the other goes back to the jobs table', async () => {
    worked.length = 0;
    const utils = await makeWorkerUtils({
      connectionString: t.db.url,
      logger: new Logger(() => () => undefined),
    });
    done.push(async () => utils.release());
    await utils.migrate();
    await utils.addJob('FOO', { tenant: 'g1', n: 1 });
    await utils.addJob('FOO', { tenant: 'g1', n: 2 });
    const runner = (await runBlock(
      block('ordo/graphile-worker'),
      { run, throttled: graphileAdapter.throttled, ordo: t.ordo, databaseUrl: t.db.url, work },
      'runner',
    )) as Awaited<ReturnType<typeof run>>;
    done.push(() => runner.stop());
    await until('one FOO', () => worked.length === 1, 10_000);
    await until('the other handed back', async () => {
      const { rows } = await t.sql.query(
        `SELECT 1 FROM graphile_worker._private_jobs WHERE attempts = 0 AND locked_at IS NULL AND run_at > now() + interval '50 seconds'`,
      );
      return rows.length === 1;
    });
  });

  it('several limits with costs: a payment runs under both, each counting its lines', async () => {
    const paid: unknown[] = [];
    const code = blocks.find((b) => b.code.includes("name: 'payments'"))!.code;
    const processor = (await runBlock(
      code,
      {
        throttled: bullmqAdapter.throttled,
        ordo: t.ordo,
        pay: async (data: unknown) => void paid.push(data),
      },
      'processor',
    )) as bullmqAdapter.ThrottledBullProcessor<bullmqAdapter.BullJob, unknown>;
    const name = `${bullQueue}-payments`;
    const worker = new Worker(name, processor, { connection });
    const queue = new Queue(name, { connection });
    done.push(async () => {
      await worker.close();
      await queue.obliterate({ force: true });
      await queue.close();
    });
    await queue.add('pay', { tenant: 'acme', lines: 3 });
    await until('the payment', () => paid.length === 1);
    expect((await t.ordo.throttles.state('payments_tenant', 'acme')).starts).toBe(1);
    expect((await t.ordo.throttles.state('payments')).starts).toBe(1);
  });
});
