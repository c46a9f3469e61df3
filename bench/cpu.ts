import { readFileSync } from 'node:fs';
import pg from 'pg';

/**
 * What bench/take-cpu.ts and bench/throttle-cpu.ts share: CPU per operation, the server's and
 * Node's apart, variants alternating in rounds so that a machine whose speed drifts treats them
 * alike. The server's CPU is a backend's /proc/<pid>/schedstat: the server must run on this
 * machine, readable by this user.
 */

/** Runs `work` on a database of its own on the server at `url`, dropped afterwards. */
export async function withScratchDatabase(prefix: string, url: string, work: (url: string) => Promise<void>) {
  const db = `${prefix}_${process.pid}`;
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${db}`);
  const target = new URL(url);
  target.pathname = `/${db}`;
  try {
    await work(target.toString());
  } finally {
    await admin.query(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`);
    await admin.end();
  }
}

/** The CPU time, in ns, that the backend answering `query` has used so far. */
export async function backendCpu(query: (text: string) => Promise<{ rows: any[] }>): Promise<() => number> {
  const pid = (await query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
  return () => Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[0]);
}

export interface CpuVariant {
  /** Operations one call of `run` makes. */
  ops: number;
  /** One call; `i` counts the operations made so far in this round (or the warm-up). */
  run(i: number): Promise<unknown>;
  /** The CPU time of the backend that serves it (backendCpu()). */
  server(): number;
}

/**
 * Each call as a variant of one operation: `BEGIN; call(i); COMMIT` on `client`, whose backend's
 * CPU is `server`.
 */
export function inTransactions(
  client: { query(text: string): Promise<unknown> },
  server: () => number,
  calls: Record<string, (i: number) => Promise<unknown>>,
): Record<string, CpuVariant> {
  return Object.fromEntries(
    Object.entries(calls).map(([name, call]) => [
      name,
      {
        ops: 1,
        server,
        run: async (i: number) => {
          await client.query('BEGIN');
          await call(i);
          await client.query('COMMIT');
        },
      },
    ]),
  );
}

export interface CpuRounds {
  /** Operations per variant, in all rounds. */
  ops: number;
  rounds: number;
  /** Operations per variant before measuring. */
  warmup: number;
  /** Before each variant's round, unmeasured (a VACUUM where autovacuum is off). */
  beforeRound?: () => Promise<unknown>;
  /** What one operation is, for the printed title. */
  what: string;
}

/** Measures the variants in alternating rounds and prints µs per operation of each. */
export async function measureCpu(variants: Record<string, CpuVariant>, o: CpuRounds): Promise<void> {
  const only = process.env.VARIANTS?.split(',');
  const names = Object.keys(variants).filter((v) => !only || only.includes(v));
  const totals = new Map(names.map((n) => [n, { server: 0, client: 0, wall: 0, ops: 0 }]));
  const repeat = async (v: CpuVariant, ops: number) => {
    let done = 0;
    while (done < ops) {
      await v.run(done);
      done += v.ops;
    }
    return done;
  };
  for (const n of names) await repeat(variants[n]!, o.warmup);
  for (let r = 0; r < o.rounds; r++) {
    for (const n of names) {
      const v = variants[n]!;
      await o.beforeRound?.();
      const s0 = v.server();
      const c0 = process.cpuUsage();
      const w0 = performance.now();
      const ops = await repeat(v, o.ops / o.rounds);
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
  const width = Math.max(...names.map((n) => n.length)) + 1;
  console.log(`per op (${o.what}), µs, ${o.ops} ops each in ${o.rounds} rounds:`);
  console.log(`${'variant'.padEnd(width)}  server  client     sum    wall`);
  for (const [n, t] of totals) {
    const cells = [t.server, t.client, t.server + t.client, t.wall].map((ns) => us(ns, t.ops));
    console.log(`${n.padEnd(width)} ${cells.join(' ')}`);
  }
}
