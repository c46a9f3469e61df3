import { readFileSync } from 'node:fs';
import pg from 'pg';
import { createOrdo } from '../src/index.js';

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

const db = `ordo_take_cpu_${process.pid}`;
const admin = new pg.Client({ connectionString: url });
await admin.connect();
await admin.query(`CREATE DATABASE ${db}`);
const target = new URL(url);
target.pathname = `/${db}`;
try {
  const pool = new pg.Pool({ connectionString: target.toString(), max: 2 });
  const ordo = await createOrdo({ pool });
  await ordo.sequences.define({ name: NAME, reset: 'day' });
  const client = await pool.connect();
  await client.query(`CREATE TABLE bench_counters (
    scope text NOT NULL, day date NOT NULL, value bigint NOT NULL, PRIMARY KEY (scope, day))`);
  const pid = (await client.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
  const serverNs = () => Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[0]);

  const variants: Record<string, (scope: string) => Promise<unknown>> = {
    /** gapless (b): the hand-written limit. */
    upsert: (scope) =>
      client.query(
        `INSERT INTO bench_counters AS c (scope, day, value) VALUES ($1, current_date, 1)
         ON CONFLICT (scope, day) DO UPDATE SET value = c.value + 1
         RETURNING value, day::text AS day`,
        [scope],
      ),
    /** The statement next({ tx }) sent before 0018. */
    'take() sql': (scope) =>
      client.query(
        `SELECT value, text, period FROM ordo.take($1, $2, coalesce($3::timestamptz, now()), $4) CROSS JOIN (SELECT set_config('synchronous_commit', 'on', true)) AS durable`,
        [NAME, scope, null, 1],
      ),
    /** The statement it sends since 0018, alone. */
    'take_value() sql': (scope) =>
      client.query('SELECT ordo.take_value($1, $2, $3) AS issued', [NAME, scope, null]),
    /** gapless (a). */
    'next({ tx })': (scope) => ordo.sequences.next(NAME, { scope, tx: client }),
  };
  const only = process.env.VARIANTS?.split(',');
  const names = Object.keys(variants).filter((v) => !only || only.includes(v));
  const totals = new Map(names.map((n) => [n, { server: 0, client: 0, wall: 0, ops: 0 }]));
  const op = async (take: (scope: string) => Promise<unknown>, i: number) => {
    await client.query('BEGIN');
    await take(`k${i % 64}`);
    await client.query('COMMIT');
  };
  for (const n of names) for (let i = 0; i < 500; i++) await op(variants[n]!, i); // warm-up
  for (let r = 0; r < ROUNDS; r++) {
    for (const n of names) {
      const take = variants[n]!;
      const s0 = serverNs();
      const c0 = process.cpuUsage();
      const w0 = performance.now();
      for (let i = 0; i < N / ROUNDS; i++) await op(take, i);
      const w = performance.now() - w0;
      const c = process.cpuUsage(c0);
      const t = totals.get(n)!;
      t.server += serverNs() - s0;
      t.client += (c.user + c.system) * 1000;
      t.wall += w * 1e6;
      t.ops += N / ROUNDS;
    }
  }
  const us = (ns: number, ops: number) => (ns / ops / 1000).toFixed(1).padStart(7);
  console.log(`per op (BEGIN; take; COMMIT), µs, ${N} ops each in ${ROUNDS} rounds:`);
  console.log('variant           server  client     sum    wall');
  for (const [n, t] of totals) {
    const cells = [t.server, t.client, t.server + t.client, t.wall].map((ns) => us(ns, t.ops));
    console.log(`${n.padEnd(16)} ${cells.join(' ')}`);
  }
  client.release();
  await ordo.close();
  await pool.end();
} finally {
  await admin.query(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`);
  await admin.end();
}
