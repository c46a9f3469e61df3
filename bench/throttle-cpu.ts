import pg from 'pg';
import { RateLimiterPostgres } from 'rate-limiter-flexible';
import { createOrdo, type Ordo } from '../src/index.js';
import { backendCpu, type CpuVariant, measureCpu, withScratchDatabase } from './cpu.js';

/**
 * CPU per throttle decision, the server's and Node's apart, against rate-limiter-flexible's
 * consume(): what `npm run bench -- throttles` compares on 1,000 keys, measured so that other
 * work on the machine does not decide the result (its wall-clock throughput moves with that
 * work). Each variant runs on one connection, the variants alternating
 * in rounds; the server's CPU is read from that backend's /proc/<pid>/schedstat (the server must
 * run on this machine, readable by this user), Node's from process.cpuUsage().
 *
 * - RateLimiterPostgres: consume(key), one INSERT … ON CONFLICT and one commit per op.
 * - ordo × 1: acquire(key), then complete(): two statements per op.
 * - ordo × 16: sixteen callers at once, each acquire(key) then complete(); the batcher shares
 *   the sixteen acquires, then the sixteen completes, among statements, as in the throughput
 *   bench (where 32 callers share two statement slots).
 * - permits: false × 16: the same on a throttle without permits (complete() sends nothing).
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
const PLAIN = 'cpu_plain';
const key = () => `k${Math.floor(Math.random() * KEYS)}`;

await withScratchDatabase('ordo_throttle_cpu', url, async (target) => {
  const pools = [0, 1, 2].map(() => new pg.Pool({ connectionString: target, max: 1 }));
  const [one, sixteen, plain] = await Promise.all(pools.map((pool) => createOrdo({ pool })));
  await one!.throttles.define({ name: THROTTLE, limit: 1_000_000, per: '1s', lease: '1m' });
  await one!.throttles.define({ name: PLAIN, limit: 1_000_000, per: '1s', permits: false });
  const rlfClient = new pg.Client({ connectionString: target });
  await rlfClient.connect();
  const limiter = await new Promise<RateLimiterPostgres>((resolve, reject) => {
    const created: RateLimiterPostgres = new RateLimiterPostgres(
      { storeClient: rlfClient, storeType: 'client', tableName: 'cpu_rlf', points: 1e9, duration: 3600 },
      (error?: Error) => (error ? reject(error) : resolve(created)),
    );
  });
  const acquireComplete = async (ordo: Ordo, name = THROTTLE) => {
    const permit = await ordo.throttles.acquire(name, { key: key() });
    if (!permit.granted) throw new Error(`refused: ${permit.reason}`);
    await permit.complete();
  };
  const variants: Record<string, CpuVariant> = {
    RateLimiterPostgres: {
      ops: 1,
      run: () => limiter.consume(key()),
      server: await backendCpu((t) => rlfClient.query(t)),
    },
    'ordo × 1': {
      ops: 1,
      run: () => acquireComplete(one!),
      server: await backendCpu((t) => pools[0]!.query(t)),
    },
    'ordo × 16': {
      ops: 16,
      run: () => Promise.all(Array.from({ length: 16 }, () => acquireComplete(sixteen!))),
      server: await backendCpu((t) => pools[1]!.query(t)),
    },
    'permits: false × 16': {
      ops: 16,
      run: () => Promise.all(Array.from({ length: 16 }, () => acquireComplete(plain!, PLAIN))),
      server: await backendCpu((t) => pools[2]!.query(t)),
    },
  };
  // Autovacuum may be off (CI's setting): permits are written, ended and deleted by every op.
  const vacuum = new pg.Client({ connectionString: target });
  await vacuum.connect();
  await measureCpu(variants, {
    ops: N,
    rounds: ROUNDS,
    warmup: 1000,
    beforeRound: () => vacuum.query('VACUUM'),
    what: "a decision, and for ordo its permit's completion",
  });
  await Promise.all([
    one!.close(),
    sixteen!.close(),
    plain!.close(),
    rlfClient.end(),
    vacuum.end(),
    ...pools.map((p) => p.end()),
  ]);
});
