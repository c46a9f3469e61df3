import { readFileSync } from 'node:fs';
import pg from 'pg';
import { createOrdo } from '../src/index.js';
import { withScratchDatabase } from './cpu.js';

/**
 * Acquire + complete throughput of ordo alone: 32 callers on one pool of 32, for `seconds` after
 * a second of warm-up, on one key or on keys drawn from `keys`; the ops per second and Node's
 * share of a core. `npm run bench -- throttles` alternates ordo with RateLimiterPostgres on the
 * same server, which moves each side's numbers with the other's (its tables, its vacuums); this
 * is the A/B of a change to ordo's own statements on a quiet server. Two runs each way at least:
 * on shared cores one run moves with other work on the machine.
 *
 *   DATABASE_URL=… npx tsx bench/throttle-load.ts [keys] [seconds]   (default: 1 key, 8 s)
 *   PERMITS=false …   a throttle without permits: acquire only (complete() sends nothing)
 */
const url = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const KEYS = Number(process.argv[2] ?? 1);
const SECONDS = Number(process.argv[3] ?? 8);
const CALLERS = 32;
const PERMITS = process.env.PERMITS !== 'false';
/** The machine's idle and total CPU time so far, in clock ticks (/proc/stat). */
const machineCpu = () => {
  const ticks = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
  return { idle: ticks[3]! + ticks[4]!, total: ticks.reduce((a, b) => a + b, 0) };
};

await withScratchDatabase('ordo_throttle_load', url, async (target) => {
  const pool = new pg.Pool({ connectionString: target, max: CALLERS });
  // The scratch database is dropped WITH (FORCE) at the end: a connection still open then ends.
  pool.on('error', () => undefined);
  const ordo = await createOrdo({ pool });
  await ordo.throttles.define(
    PERMITS
      ? { name: 'load', limit: 1_000_000, per: '1s', lease: '1m' }
      : { name: 'load', limit: 1_000_000, per: '1s', permits: false },
  );
  const key = () => (KEYS === 1 ? 'hot' : `k${Math.floor(Math.random() * KEYS)}`);
  let ops = 0;
  let stop = false;
  const caller = async () => {
    while (!stop) {
      const permit = await ordo.throttles.acquire('load', { key: key() });
      if (!permit.granted) throw new Error(`refused: ${permit.reason}`);
      await permit.complete();
      ops++;
    }
  };
  const callers = Array.from({ length: CALLERS }, caller);
  await new Promise((resolve) => setTimeout(resolve, 1000));
  ops = 0;
  const started = performance.now();
  const cpu = process.cpuUsage();
  const machine = machineCpu();
  await new Promise((resolve) => setTimeout(resolve, SECONDS * 1000));
  const done = ops;
  const seconds = (performance.now() - started) / 1000;
  const used = process.cpuUsage(cpu);
  const after = machineCpu();
  const idle = (after.idle - machine.idle) / (after.total - machine.total);
  stop = true;
  await Promise.all(callers);
  console.log(
    `${KEYS === 1 ? 'one key' : `${KEYS} keys`}: ${Math.round(done / seconds)} acquire + complete a second; ` +
      `Node ${((used.user + used.system) / 1e6 / seconds).toFixed(2)} of a core; the machine ${Math.round(idle * 100)}% idle` +
      (PERMITS ? '' : ' (permits: false)'),
  );
  await ordo.close();
  await pool.end();
});
