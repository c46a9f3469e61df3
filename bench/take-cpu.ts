import pg from 'pg';
import { createOrdo } from '../src/index.js';
import { sequencePlans } from '../src/sequences/plans.js';
import { backendCpu, inTransactions, measureCpu, withScratchDatabase } from './cpu.js';
import { COUNTERS_DDL, UPSERT } from './gapless.js';

/**
 * CPU per number taken in a transaction, the server's and Node's apart: what gapless (a) and
 * (b) cost, measured so that other work on the machine does not decide the result (wall-clock
 * throughput does). One connection runs N × (BEGIN; take; COMMIT) per variant, the variants
 * alternating in rounds of N / rounds, and reads the backend's CPU time (/proc/<pid>/schedstat:
 * the server must run on this machine, readable by this user) and this process's
 * (process.cpuUsage()). VARIANTS=a,b runs only those.
 *
 *   DATABASE_URL=… npx tsx bench/take-cpu.ts [N] [rounds]
 */
const url = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const N = Number(process.argv[2] ?? 40000);
const ROUNDS = Number(process.argv[3] ?? 80);
const NAME = 'cpu_daily';

await withScratchDatabase('ordo_take_cpu', url, async (target) => {
  const pool = new pg.Pool({ connectionString: target, max: 2 });
  const ordo = await createOrdo({ pool });
  const prepared = await createOrdo({ pool, prepare: true });
  await ordo.sequences.define({ name: NAME, reset: 'day' });
  const client = await pool.connect();
  await client.query(COUNTERS_DDL);
  const server = await backendCpu((text) => client.query(text));

  /** The i-th take is on key k(i mod 64). */
  const scope = (i: number) => `k${i % 64}`;
  const takes: Record<string, (i: number) => Promise<unknown>> = {
    /** gapless (b): the hand-written limit. */
    upsert: (i) => client.query(UPSERT, [scope(i)]),
    /** The same as a named prepared statement: parsed and planned once. */
    'upsert, prepared': (i) => client.query({ name: 'bench_upsert', text: UPSERT, values: [scope(i)] }),
    /** take() for one value: a set-returning function and a join to plan, beside take_value(). */
    'take() sql': (i) =>
      client.query(
        `SELECT value, text, period FROM ordo.take($1, $2, coalesce($3::timestamptz, now()), $4) CROSS JOIN (SELECT set_config('synchronous_commit', 'on', true)) AS durable`,
        [NAME, scope(i), null, 1],
      ),
    /** take_value(), the statement next({ tx }) sends, alone. */
    'take_value() sql': (i) => client.query(sequencePlans('ordo').takeValue, [NAME, scope(i), null]),
    /** gapless (a). */
    'next({ tx })': (i) => ordo.sequences.next(NAME, { scope: scope(i), tx: client }),
    /** gapless (a′). */
    'next({ tx }), prepare: true': (i) => prepared.sequences.next(NAME, { scope: scope(i), tx: client }),
  };
  const variants = inTransactions(client, server, takes);
  await measureCpu(variants, { ops: N, rounds: ROUNDS, warmup: 500, what: 'BEGIN; take; COMMIT' });
  client.release();
  await ordo.close();
  await prepared.close();
  await pool.end();
});
