import pg from 'pg';
import { createOrdo } from '../src/index.js';
import { outboxPlans } from '../src/outbox/plans.js';
import { backendCpu, inTransactions, measureCpu, withScratchDatabase } from './cpu.js';
import { PAYLOAD, PLAIN_APPEND, PLAIN_DDL } from './outbox.js';

/**
 * CPU per outbox append in a transaction, the server's and Node's apart: what outbox (a)
 * compares, measured so that other work on the machine does not decide the result. One
 * connection runs N × (BEGIN; append; COMMIT) per variant, alternating in rounds.
 * VARIANTS=a,b runs only those; PER_TXN (default 1) messages per append.
 *
 *   DATABASE_URL=… npx tsx bench/append-cpu.ts [N] [rounds]
 */
const url = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const N = Number(process.argv[2] ?? 20000);
const ROUNDS = Number(process.argv[3] ?? 40);
const PER_TXN = Number(process.env.PER_TXN ?? 1);
const TOPIC = 'cpu-append';

await withScratchDatabase('ordo_append_cpu', url, async (target) => {
  const pool = new pg.Pool({ connectionString: target, max: 2 });
  pool.on('error', () => undefined);
  const ordo = await createOrdo({ pool });
  const client = await pool.connect();
  await client.query(PLAIN_DDL);
  const server = await backendCpu((text) => client.query(text));
  const messages = (i: number) =>
    Array.from({ length: PER_TXN }, (_, k) => ({
      type: 'OrderPlaced',
      key: `k${(i + k) % 64}`,
      data: PAYLOAD,
    }));

  const appends: Record<string, (i: number) => Promise<unknown>> = {
    /** outbox (a)'s plain INSERT. */
    insert: (i) => {
      const batch = messages(i);
      return client.query(PLAIN_APPEND, [
        TOPIC,
        batch.map((m) => m.type),
        batch.map((m) => m.key),
        batch.map((m) => JSON.stringify(m.data)),
      ]);
    },
    /** The statement append({ tx }) sends, by hand: no message ids, and no headers (null: stored as {}). */
    'append_answer() sql': (i) => {
      const batch = messages(i);
      return client.query(outboxPlans('ordo').append, [
        TOPIC,
        batch.map((m) => m.type),
        batch.map((m) => JSON.stringify(m.data)),
        batch.map((m) => m.key),
        batch.map(() => null),
        batch.map(() => null),
      ]);
    },
    /** outbox (a). */
    'append({ tx })': (i) => ordo.outbox.append(TOPIC, messages(i), { tx: client }),
  };
  const variants = inTransactions(client, server, appends);
  await measureCpu(variants, {
    ops: N,
    rounds: ROUNDS,
    warmup: 500,
    what: `BEGIN; append ${PER_TXN}; COMMIT`,
    beforeRound: () => client.query('TRUNCATE ordo.messages, bench_plain_outbox'),
  });
  client.release();
  await ordo.close();
  await pool.end();
});
