import { readFileSync } from 'node:fs';
import pg from 'pg';
import { RateLimiterPostgres } from 'rate-limiter-flexible';
import { createOrdo } from '../src/index.js';

/**
 * CPU per throttle decision, the server's and Node's apart, against rate-limiter-flexible's
 * consume(): what `npm run bench -- throttles` compares on 1,000 keys, measured so that other
 * work on the machine does not decide the result (its wall-clock throughput on 2 shared cores
 * moves by a third between runs). Each variant runs on one connection, the variants alternating
 * in rounds; the server's CPU is read from that backend's /proc/<pid>/schedstat (the server must
 * run on this machine, readable by this user), Node's from process.cpuUsage().
 *
 * - RateLimiterPostgres: consume(key), one INSERT … ON CONFLICT and one commit per op.
 * - ordo × 1: acquire(key), then complete(): two statements per op.
 * - ordo × 16: sixteen callers at once, each acquire(key) then complete(); the batcher shares
 *   the sixteen acquires, then the sixteen completes, among statements, as in the throughput
 *   bench (where 32 callers on two statement slots make batches of about 16).
 *
 * Keys are drawn from 1,000, as in the throughput bench. VARIANTS=… (comma-separated labels)
 * runs only those.
 *
 *   DATABASE_URL=… npx tsx bench/throttle-cpu.ts [ops] [rounds]
 */
const url = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const N = Number(process.argv[2] ?? 32000);
const ROUNDS = Number(process.argv[3] ?? 20);
const KEYS = 1000;
const THROTTLE = 'cpu_throttle';

const db = `ordo_throttle_cpu_${process.pid}`;
const admin = new pg.Client({ connectionString: url });
await admin.connect();
await admin.query(`CREATE DATABASE ${db}`);
const target = new URL(url);
target.pathname = `/${db}`;
const key = () => `k${Math.floor(Math.random() * KEYS)}`;

/** One connection's backend: its CPU time so far, in ns. */
async function backend(query: (text: string) => Promise<{ rows: any[] }>): Promise<() => number> {
  const pid = (await query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
  return () => Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[0]);
}

try {
  const pools = [0, 1].map(() => new pg.Pool({ connectionString: target.toString(), max: 1 }));
  const [one, sixteen] = await Promise.all(pools.map((pool) => createOrdo({ pool })));
  await one!.throttles.define({ name: THROTTLE, limit: 1_000_000, per: '1s', lease: '1m' });
  const rlfClient = new pg.Client({ connectionString: target.toString() });
  await rlfClient.connect();
  const limiter = await new Promise<RateLimiterPostgres>((resolve, reject) => {
    const created: RateLimiterPostgres = new RateLimiterPostgres(
      { storeClient: rlfClient, storeType: 'client', tableName: 'cpu_rlf', points: 1e9, duration: 3600 },
      (error?: Error) => (error ? reject(error) : resolve(created)),
    );
  });
  const acquireComplete = async (ordo: typeof one) => {
    const permit = await ordo!.throttles.acquire(THROTTLE, { key: key() });
    if (!permit.granted) throw new Error(`refused: ${permit.reason}`);
    await permit.complete();
  };
  interface Variant {
    ops: number; // per call of run
    run: () => Promise<unknown>;
    server: () => number;
  }
  const variants: Record<string, Variant> = {
    RateLimiterPostgres: {
      ops: 1,
      run: () => limiter.consume(key()),
      server: await backend((t) => rlfClient.query(t)),
    },
    'ordo × 1': { ops: 1, run: () => acquireComplete(one), server: await backend((t) => pools[0]!.query(t)) },
    'ordo × 16': {
      ops: 16,
      run: () => Promise.all(Array.from({ length: 16 }, () => acquireComplete(sixteen))),
      server: await backend((t) => pools[1]!.query(t)),
    },
  };
  const only = process.env.VARIANTS?.split(',');
  const names = Object.keys(variants).filter((v) => !only || only.includes(v));
  const totals = new Map(names.map((n) => [n, { server: 0, client: 0, wall: 0, ops: 0 }]));
  for (const n of names) for (let i = 0; i < 1000; i += variants[n]!.ops) await variants[n]!.run(); // warm-up
  for (let r = 0; r < ROUNDS; r++) {
    for (const n of names) {
      const v = variants[n]!;
      await admin.query(`VACUUM`).catch(() => undefined);
      const s0 = v.server();
      const c0 = process.cpuUsage();
      const w0 = performance.now();
      let ops = 0;
      while (ops < N / ROUNDS) {
        await v.run();
        ops += v.ops;
      }
      const w = performance.now() - w0;
      const c = process.cpuUsage(c0);
      const t = totals.get(n)!;
      t.server += v.server() - s0;
      t.client += (c.user + c.system) * 1000;
      t.wall += w * 1e6;
      t.ops += ops;
    }
  }
  const us = (ns: number, ops: number) => (ns / ops / 1000).toFixed(1).padStart(7);
  console.log(
    `per op (a decision, and for ordo its permit's completion), µs, ${N} ops each in ${ROUNDS} rounds:`,
  );
  console.log('variant               server  client     sum    wall');
  for (const [n, t] of totals) {
    const cells = [t.server, t.client, t.server + t.client, t.wall].map((ns) => us(ns, t.ops));
    console.log(`${n.padEnd(20)} ${cells.join(' ')}`);
  }
  await Promise.all([one!.close(), sixteen!.close(), rlfClient.end(), ...pools.map((p) => p.end())]);
} finally {
  await admin.query(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`);
  await admin.end();
}
