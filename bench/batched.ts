import { type ChildProcess, spawn } from 'node:child_process';
import { availableParallelism } from 'node:os';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import type { Surreal } from 'surrealdb';
import { createOrdo, type Ordo } from '../src/index.js';
import { MAX_RANGES_PER_RESERVATION } from '../src/sequences/batched.js';
import {
  type BenchContext,
  countQueries,
  fmt,
  type LoadOptions,
  Measurement,
  openPool,
  ratioCell,
  runLoad,
  type Suite,
  type Table,
  type Verified,
  verifyPostgres,
} from './harness.js';

/**
 * Batched sequences: `await ordo.nextval()` in a tight loop, served from the node's ranges in
 * memory, in one process (BATCH 1000, 10000, 100000) and in four processes at once (each its
 * own node), against PostgreSQL's nextval() per call (CACHE 1 and CACHE 100) and SurrealDB's
 * own sequence::nextval per query (embedded in-memory engine). The in-process scenarios
 * alternate in rounds, as gapless's do. Reservations are counted on the node's pool, and
 * every scenario checks the values it got (see the notes of the table).
 */

const BATCHES = [1000, 10_000, 100_000] as const;
const MULTI_BATCHES = [1000, 100_000] as const;
const PROCESSES = 4;
const PG_CONNECTIONS = 16;
/** The ordo loop reads the clock once per block of calls: a clock read costs about a call. */
export const BLOCK = 1024;
const GOAL = { perProcess: 5_000_000, vsPostgres: 300, vsSurreal: 1000 };
const SURREAL_BATCH = 1000;
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const WORKER = 'bench/batched-worker.ts';

// ─── shared with the worker ──────────────────────────────────────────────────────────────

/** Statements a node sent on its pool: its reservations, and everything else. */
export interface StatementCount {
  reserve: number;
  other: number;
}

/**
 * A pool whose connections count the statements they send, reservations apart. Counting on the
 * connection class covers the pool's connections and the one a node keeps for its reservations
 * (created from `pool.Client`).
 */
export function countedPool(
  url: string,
  max: number,
  applicationName: string,
): { pool: pg.Pool; statements: StatementCount } {
  const statements: StatementCount = { reserve: 0, other: 0 };
  class CountingClient extends pg.Client {
    override query(...args: any[]): any {
      const text: unknown = typeof args[0] === 'string' ? args[0] : args[0]?.text;
      if (typeof text === 'string' && text.includes('.reserve(')) statements.reserve++;
      else if (typeof text === 'string' && !/^\s*(LISTEN|SELECT 1\b)/.test(text)) statements.other++;
      return (super.query as (...a: any[]) => any)(...args);
    }
  }
  const pool = new pg.Pool({
    connectionString: url,
    max,
    application_name: applicationName,
    Client: CountingClient,
  });
  pool.on('error', () => undefined);
  return { pool, statements };
}

/**
 * The values one node took, kept as runs of consecutive values (a range, or adjacent ranges),
 * and the cost per call of each measured block.
 */
export class Drain {
  /** Every value taken, warm-ups included. */
  total = 0;
  /** Values taken in measured blocks, and the time those blocks took. */
  measured = 0;
  seconds = 0;
  /** Values not above the one before. */
  disorder = 0;
  readonly firsts: number[] = [];
  readonly lasts: number[] = [];
  /** Nanoseconds per call, averaged over each measured block. */
  readonly blockNs: number[] = [];
  private prev = Number.NEGATIVE_INFINITY;

  /** One block of calls; the values are checked and kept as runs as they come. */
  async block(ordo: Ordo, name: string): Promise<void> {
    let prev = this.prev;
    for (let i = 0; i < BLOCK; i++) {
      const v = await ordo.nextval(name);
      if (v !== prev + 1) {
        if (v <= prev) this.disorder++;
        if (this.firsts.length > 0) this.lasts.push(prev);
        this.firsts.push(v);
      }
      prev = v;
    }
    this.prev = prev;
    this.total += BLOCK;
  }

  /** Blocks for the warm-up, then for the measured window. */
  async window(ordo: Ordo, name: string, seconds: number, warmupSeconds: number, signal?: AbortSignal) {
    const from = performance.now() + warmupSeconds * 1000;
    const until = from + seconds * 1000;
    let start: number | undefined;
    let end = 0;
    for (;;) {
      signal?.throwIfAborted();
      const t0 = performance.now();
      if (t0 >= until) break;
      await this.block(ordo, name);
      if (t0 >= from) {
        const t1 = performance.now();
        start ??= t0;
        end = t1;
        this.measured += BLOCK;
        this.blockNs.push(((t1 - t0) * 1e6) / BLOCK);
      }
    }
    if (start !== undefined) this.seconds += (end - start) / 1000;
  }

  /** The runs as [first, last] pairs, the last one closed. */
  runs(): { firsts: number[]; lasts: number[] } {
    const lasts = [...this.lasts];
    if (this.firsts.length > lasts.length) lasts.push(this.prev);
    return { firsts: [...this.firsts], lasts };
  }
}

/** What a worker process reports. */
export interface WorkerResult {
  nodeId: string;
  total: number;
  measured: number;
  seconds: number;
  disorder: number;
  firsts: number[];
  lasts: number[];
  blockNs: number[];
  statements: StatementCount;
  /** Ranges the node reserved (several per statement when it needs them). */
  ranges: number;
}

// ─── the suite ───────────────────────────────────────────────────────────────────────────

interface Row {
  label: string;
  config: string;
  processes: number;
  /** Values per second, all processes together. */
  rate: number;
  p50Us: number | null;
  p99Us: number | null;
  maxMs: number | null;
  trips: string;
  perTrip: string;
  verified: Verified;
  /** Reservations beyond one per range used (plus the one prefetched): none expected. */
  excessTrips?: number;
}

/** One node's run, as checked against the ranges recorded in sequence_batches. */
interface NodeRun {
  nodeId: string;
  total: number;
  disorder: number;
  firsts: number[];
  lasts: number[];
  statements: StatementCount;
  ranges: number;
}

/** A scenario measured in alternating windows with the others. */
interface Windowed {
  window(seconds: number, warmupSeconds: number): Promise<void>;
}

async function run(ctx: BenchContext): Promise<Table[]> {
  const admin = new pg.Pool({ connectionString: ctx.url, max: 2, application_name: 'ordo-bench-admin' });
  admin.on('error', () => undefined);
  const ordo = await createOrdo({ pool: admin });
  const closers: (() => Promise<unknown>)[] = [];
  try {
    // ordo: one node (ordo instance, pool and counter) per batch size, in this process.
    const nodes = [];
    for (const batch of BATCHES) {
      const name = `bench_batched_${batch}`;
      await ordo.sequences.define({ name, kind: 'batched', batch, start: 0 });
      const { pool, statements } = countedPool(ctx.url, 2, 'ordo-bench');
      const node = await createOrdo({ pool });
      closers.push(
        () => pool.end(),
        () => node.close(),
      );
      statements.reserve = 0;
      statements.other = 0;
      const drain = new Drain();
      nodes.push({ batch, name, node, statements, drain });
    }

    // PostgreSQL: a sequence per cache size, values per connection kept to check them.
    const pgPool = await openPool(ctx.url, PG_CONNECTIONS, 'ordo-bench');
    closers.push(() => pgPool.end());
    const clients = await Promise.all(Array.from({ length: PG_CONNECTIONS }, () => pgPool.connect()));
    closers.push(async () => {
      for (const c of clients) c.release();
    });
    for (const c of clients) c.on('error', () => undefined);
    const counted = clients.map((c) => countQueries(c));
    const pgStatements = () => counted.reduce((n, c) => n + c.count, 0);
    const caches = [1, 100] as const;
    const postgres = caches.map((cache) => ({
      cache,
      name: `bench_pg_cache${cache}`,
      values: clients.map((): number[] => []),
      measurement: new Measurement(),
    }));
    for (const p of postgres) await admin.query(`CREATE SEQUENCE ${p.name} CACHE ${p.cache}`);

    // SurrealDB, embedded, or the reason it is not there.
    const surreal = await openSurreal(ctx);
    if ('db' in surreal) closers.push(() => surreal.db.close());
    const surrealValues: number[] = [];
    const surrealMeasurement = new Measurement();

    const load = (o: Omit<LoadOptions, 'seconds' | 'warmupSeconds' | 'signal'>, into: Measurement) =>
      ((seconds: number, warmupSeconds: number) =>
        runLoad({ ...o, seconds, warmupSeconds, signal: ctx.signal }, into).then(
          () => undefined,
        )) satisfies Windowed['window'];
    const scenarios: Windowed[] = [
      ...nodes.map((n) => ({
        window: (seconds: number, warmupSeconds: number) =>
          n.drain.window(n.node, n.name, seconds, warmupSeconds, ctx.signal),
      })),
      ...postgres.map((p) => ({
        window: load(
          {
            workers: PG_CONNECTIONS,
            statements: pgStatements,
            op: async (w) => {
              const { rows } = await clients[w]!.query('SELECT nextval($1) AS v', [p.name]);
              p.values[w]!.push(Number(rows[0].v));
            },
          },
          p.measurement,
        ),
      })),
    ];
    if ('db' in surreal) {
      const db = surreal.db;
      scenarios.push({
        window: load(
          {
            workers: 1,
            op: async () => {
              const [v] = await db.query<[number]>(`RETURN sequence::nextval('s');`);
              surrealValues.push(Number(v));
            },
          },
          surrealMeasurement,
        ),
      });
    }
    ctx.log(`batched  ${scenarios.length} in-process scenarios, ${ctx.rounds} rounds`);
    for (let r = 0; r < ctx.rounds; r++) {
      for (let i = 0; i < scenarios.length; i++) {
        const s = scenarios[(i + r) % scenarios.length]!;
        await s.window(ctx.seconds / ctx.rounds, r === 0 ? ctx.warmupSeconds : 0);
      }
    }
    // Reservations still in flight are counted with their ranges.
    for (const n of nodes) await n.node.sequences.idle();

    const rows: (Row | null)[] = [];
    const single: Row[] = [];
    for (const n of nodes) {
      const row = await nodeRow(
        ctx,
        admin,
        ordo.schema,
        n.name,
        n.batch,
        1,
        n.drain.measured / n.drain.seconds,
        n.drain.blockNs,
        [
          {
            nodeId: n.node.nodeId,
            ...n.drain.runs(),
            total: n.drain.total,
            disorder: n.drain.disorder,
            statements: { ...n.statements },
            ranges: n.node.sequences.reservations.get(n.name) ?? 0,
          },
        ],
      );
      single.push(row);
      rows.push(row);
    }
    const multi: Row[] = [];
    for (const batch of MULTI_BATCHES) {
      const row = await processes(ctx, admin, ordo, batch);
      multi.push(row);
      rows.push(row);
    }
    rows.push(null);
    const pgRows = postgres.map((p) =>
      logged(ctx, {
        label: 'PostgreSQL nextval() per call',
        config: `CACHE ${p.cache}, ${PG_CONNECTIONS} connections`,
        processes: 1,
        ...latencies(p.measurement),
        trips: `${fmt.int(p.measurement.statements)} nextval`,
        perTrip: fmt.fixed(p.measurement.total / p.measurement.statements, 1),
        verified: verifyPostgres(p.values),
      }),
    );
    rows.push(...pgRows);
    const surrealRow: Row =
      'db' in surreal
        ? logged(ctx, {
            label: `SurrealDB ${surreal.version} sequence::nextval()`,
            config: `BATCH ${SURREAL_BATCH}, embedded mem://`,
            processes: 1,
            ...latencies(surrealMeasurement),
            trips: `${fmt.int(surrealMeasurement.total)} queries`,
            perTrip: fmt.fixed(1, 1),
            verified: verifyIncreasing(surrealValues),
          })
        : logged(ctx, {
            label: 'SurrealDB sequence::nextval()',
            config: 'embedded mem://',
            processes: 1,
            rate: Number.NaN,
            p50Us: null,
            p99Us: null,
            maxMs: null,
            trips: '',
            perTrip: '',
            verified: { ok: true, text: 'skipped: the engine did not load (see below)' },
          });
    rows.push(surrealRow, null);

    const bestPostgres = Math.max(...pgRows.map((r) => r.rate));
    const best = pgRows.find((r) => r.rate === bestPostgres)!;
    const goals: string[][] = [];
    for (const r of [...single, ...multi]) {
      goals.push(
        goal(
          `≥ ${GOAL.perProcess / 1e6}M values/s per process`,
          r,
          ratioCell(r.rate / r.processes / GOAL.perProcess, 1),
        ),
      );
    }
    for (const r of single) {
      goals.push(
        goal(
          `≥ ${GOAL.vsPostgres} × PostgreSQL (${best.config.split(',')[0]})`,
          r,
          ratioCell(r.rate / bestPostgres, GOAL.vsPostgres),
        ),
      );
    }
    for (const r of single) {
      const cell = Number.isFinite(surrealRow.rate)
        ? ratioCell(r.rate / surrealRow.rate, GOAL.vsSurreal)
        : 'skipped';
      goals.push(goal(`≥ ${GOAL.vsSurreal} × SurrealDB per query`, r, cell));
    }
    const ordoRows = [...single, ...multi];
    const excess = ordoRows.reduce((n, r) => n + (r.excessTrips ?? 0), 0);
    goals.push([
      'goal ≤ 1 round trip per batch',
      'every ordo row',
      '',
      '',
      '',
      '',
      '',
      '',
      '',
      '',
      excess === 0 ? '0 extra ✓' : `${excess} extra ✗`,
    ]);

    return [
      {
        title: `batched — ${ctx.seconds} s per in-process scenario in ${ctx.rounds} alternating rounds, after ${ctx.warmupSeconds} s warm-up; ${PROCESSES} processes: ${ctx.seconds} s together, after ${ctx.warmupSeconds} s warm-up`,
        columns: [
          { header: 'scenario' },
          { header: 'config' },
          { header: 'values/s', align: 'right' },
          { header: 'per process', align: 'right' },
          { header: 'p50 µs', align: 'right' },
          { header: 'p99 µs', align: 'right' },
          { header: 'max ms', align: 'right' },
          { header: 'round trips', align: 'right' },
          { header: 'values/trip', align: 'right' },
          { header: 'verified' },
          { header: 'ratio' },
        ],
        rows: [...rows.map((r) => (r ? cells(r) : null)), ...goals],
        failures: rows
          .filter((r): r is Row => r !== null && !r.verified.ok)
          .map((r) => `${r.label} · ${r.config}: ${r.verified.text}`),
        notes: [
          'ordo: a tight loop of `await ordo.nextval(name)`, start 0, each node its own ordo instance and pg pool; the next range is',
          '  reserved in the background (one reserve() statement in flight, asking for as many ranges as the node used during the',
          '  last one, twice over, up to 64). Calls are timed per block of',
          `  ${BLOCK}: p50/p99 µs are per call averaged over a block, max ms is the slowest block (≥ the longest wait for a range).`,
          `  round trips: reserve() statements counted on the node's connections + any other (definition lookup, epoch checks every`,
          '  2 s, the hourly clean-up); values/trip = values taken / reservations. The LISTEN connection is not counted.',
          '  The reservation goes out on a connection the node keeps, written at once, so the server works on the next ranges',
          '  while the loop consumes those held (each reservation commits, and its commit is flushed).',
          `  ${PROCESSES} processes: child processes started together, each its own node; values/s is their sum. This machine has`,
          `  ${availableParallelism()} cores, so ${PROCESSES} busy processes get at most ${availableParallelism()}/${PROCESSES} of a core each.`,
          '  verified: values strictly increasing per node, every one inside a range recorded in sequence_batches for that',
          '  node, ranges of all nodes disjoint, and the runs of different nodes disjoint (hence unique across processes).',
          `PostgreSQL: ${PG_CONNECTIONS} loops, a connection each, one autocommitted SELECT nextval($1) per value; verified: all`,
          '  values unique, increasing per connection. SurrealDB: one loop, one query per value, through the JS SDK on the',
          '  @surrealdb/node engine in this process; verified: strictly increasing.',
          `≥ ${GOAL.vsPostgres} × PostgreSQL: against the faster of CACHE 1 and CACHE 100; ≤ 1 round trip per batch: per node,`,
          '  reservations counted ≤ ranges that handed out a value + 1 (the range prefetched when the run stopped,',
          '  deleted whole by the clean close that gives back what a node did not use).',
          ...('skipped' in surreal ? [`SurrealDB skipped: ${surreal.skipped}`] : []),
        ],
      },
    ];
  } finally {
    for (const close of closers.reverse()) await close().catch(() => undefined);
    await ordo.close();
    await admin.end();
  }
}

function latencies(m: Measurement): Pick<Row, 'rate' | 'p50Us' | 'p99Us' | 'maxMs'> {
  const r = m.result();
  return { rate: r.opsPerSecond, p50Us: r.p50Ms * 1000, p99Us: r.p99Ms * 1000, maxMs: r.maxMs };
}

function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
}

/** A row for one or more ordo nodes, with their values checked against the recorded ranges. */
async function nodeRow(
  ctx: BenchContext,
  admin: pg.Pool,
  schema: string,
  name: string,
  batch: number,
  processes: number,
  rate: number,
  blockNs: number[],
  runs: NodeRun[],
): Promise<Row> {
  const sorted = Float64Array.from(blockNs).sort();
  const blocks = [...sorted];
  const checked = await verifyNodes(admin, schema, name, runs);
  const reserve = runs.reduce((n, r) => n + r.statements.reserve, 0);
  const other = runs.reduce((n, r) => n + r.statements.other, 0);
  const total = runs.reduce((n, r) => n + r.total, 0);
  return logged(ctx, {
    label: `ordo nextval(), ${processes} process${processes === 1 ? '' : 'es'}`,
    config: `BATCH ${fmt.int(batch)}`,
    processes,
    rate,
    p50Us: percentile(blocks, 50) / 1000,
    p99Us: percentile(blocks, 99) / 1000,
    maxMs: ((blocks[blocks.length - 1] ?? Number.NaN) * BLOCK) / 1e6,
    trips: `${fmt.int(reserve)} reserve + ${other}`,
    perTrip: fmt.int(total / reserve),
    verified: checked.verified,
    excessTrips: checked.excessTrips,
  });
}

/**
 * Checks the values of ordo nodes: increasing per node; each run of consecutive values inside
 * the node's recorded ranges; the recorded ranges of all nodes disjoint; the runs of all nodes
 * disjoint. Also counts, per node, the reservations beyond one per range used, plus one.
 */
async function verifyNodes(
  admin: pg.Pool,
  schema: string,
  name: string,
  nodes: NodeRun[],
): Promise<{ verified: Verified; excessTrips: number }> {
  const { rows } = await admin.query(
    `SELECT node_id::text AS node, first, last FROM ${schema}.sequence_batches WHERE sequence = $1 ORDER BY first`,
    [name],
  );
  const ranges = rows.map((r) => ({ node: r.node as string, first: Number(r.first), last: Number(r.last) }));
  const problems: string[] = [];
  let overlapping = 0;
  for (let i = 1; i < ranges.length; i++) if (ranges[i]!.first <= ranges[i - 1]!.last) overlapping++;
  if (overlapping) problems.push(`${overlapping} ranges overlap`);

  let values = 0;
  let disorder = 0;
  let outside = 0;
  let excessTrips = 0;
  let unrecorded = 0;
  const all: [number, number][] = [];
  for (const n of nodes) {
    disorder += n.disorder;
    const own = ranges.filter((r) => r.node === n.nodeId);
    // A node's clean close gives back what it did not use (give_back): the ranges it reserved
    // ahead and never drew from are deleted whole, at most what its last two statements brought.
    const givenBack = n.ranges - own.length;
    if (givenBack < 0 || givenBack > 2 * MAX_RANGES_PER_RESERVATION) unrecorded += Math.abs(givenBack);
    let counted = 0;
    const used = new Set<number>();
    // Runs and ranges both ascend (a run is checked increasing above): walk them together.
    let j = 0;
    for (let i = 0; i < n.firsts.length; i++) {
      const first = n.firsts[i]!;
      const last = n.lasts[i]!;
      counted += last - first + 1;
      all.push([first, last]);
      while (j < own.length && own[j]!.last < first) j++;
      // A run may span adjacent ranges of this node.
      let covered = first - 1;
      for (let k = j; k < own.length && own[k]!.first <= covered + 1 && covered < last; k++) {
        used.add(k);
        covered = Math.max(covered, own[k]!.last);
      }
      if (covered < last) outside++;
    }
    if (counted !== n.total) problems.push(`runs hold ${counted} values, ${n.total} taken`);
    values += n.total;
    excessTrips += Math.max(0, n.statements.reserve - (used.size + 1));
  }
  all.sort((a, b) => a[0] - b[0]);
  let shared = 0;
  for (let i = 1; i < all.length; i++) if (all[i]![0] <= all[i - 1]![1]) shared++;
  if (disorder) problems.push(`${disorder} not increasing`);
  if (outside) problems.push(`${outside} runs outside own ranges`);
  if (shared) problems.push(`${shared} runs shared between nodes`);
  if (unrecorded) problems.push(`${unrecorded} reservations counted ≠ recorded`);
  const where = nodes.length === 1 ? 'increasing, in own ranges' : `across ${nodes.length} nodes, no overlap`;
  const ok = problems.length === 0 && values > 0;
  return {
    verified: {
      ok,
      text: ok ? `✓ ${fmt.int(values)} unique, ${where}` : `✗ ${problems.join(', ') || 'nothing taken'}`,
    },
    excessTrips,
  };
}

function verifyIncreasing(values: number[]): Verified {
  let disorder = 0;
  for (let i = 1; i < values.length; i++) if (!(values[i]! > values[i - 1]!)) disorder++;
  const ok = disorder === 0 && values.length > 0;
  return {
    ok,
    text: ok
      ? `✓ ${fmt.int(values.length)} unique, increasing`
      : `✗ ${disorder ? `${disorder} not increasing` : 'nothing taken'}`,
  };
}

type SurrealHandle = { db: Surreal; version: string } | { skipped: string };

/** The embedded SurrealDB engine with `DEFINE SEQUENCE s`, or why it could not run here. */
async function openSurreal(ctx: BenchContext): Promise<SurrealHandle> {
  let db: Surreal | undefined;
  try {
    const [{ Surreal }, { createNodeEngines }] = await Promise.all([
      import('surrealdb'),
      import('@surrealdb/node'),
    ]);
    db = new Surreal({ engines: createNodeEngines() });
    await db.connect('mem://');
    await db.use({ namespace: 'bench', database: 'bench' });
    await db.query(`DEFINE SEQUENCE s BATCH ${SURREAL_BATCH} START 0;`);
    const { version } = await db.version();
    return { db, version: version.replace(/^surrealdb-/, '') };
  } catch (e) {
    await db?.close().catch(() => undefined);
    const reason = (e as Error).message.split('\n')[0]!;
    ctx.log(`batched  SurrealDB skipped: ${reason}`);
    return { skipped: reason };
  }
}

/** `PROCESSES` child processes, each its own node, started together; their values checked together. */
async function processes(ctx: BenchContext, admin: pg.Pool, ordo: Ordo, batch: number): Promise<Row> {
  const name = `bench_multi_${batch}`;
  await ordo.sequences.define({ name, kind: 'batched', batch, start: 0 });
  ctx.log(`batched  starting ${PROCESSES} processes, BATCH ${batch}`);
  const children: ChildProcess[] = [];
  const kill = () => {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill();
  };
  ctx.signal.addEventListener('abort', kill, { once: true });
  try {
    const workers = Array.from({ length: PROCESSES }, () => {
      const child = spawn(
        process.execPath,
        [
          '--import',
          'tsx',
          WORKER,
          ctx.url,
          name,
          String(batch),
          String(ctx.seconds),
          String(ctx.warmupSeconds),
        ],
        { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit', 'ipc'] },
      );
      children.push(child);
      return worker(child);
    });
    await Promise.all(workers.map((w) => w.ready));
    for (const c of children) c.send('go');
    const results = await Promise.all(workers.map((w) => w.result));
    await Promise.all(workers.map((w) => w.exited));
    const rate = results.reduce((n, r) => n + r.measured / r.seconds, 0);
    return nodeRow(
      ctx,
      admin,
      ordo.schema,
      name,
      batch,
      PROCESSES,
      rate,
      results.flatMap((r) => r.blockNs),
      results,
    );
  } finally {
    ctx.signal.removeEventListener('abort', kill);
    kill();
  }
}

/** A worker's messages: 'ready' once its node took a first value, then its result. */
function worker(child: ChildProcess): {
  ready: Promise<void>;
  result: Promise<WorkerResult>;
  exited: Promise<void>;
} {
  let onReady!: () => void;
  let onResult!: (r: WorkerResult) => void;
  let fail!: (e: Error) => void;
  let failResult!: (e: Error) => void;
  const ready = new Promise<void>((resolve, reject) => {
    onReady = resolve;
    fail = reject;
  });
  const result = new Promise<WorkerResult>((resolve, reject) => {
    onResult = resolve;
    failResult = reject;
  });
  // Whichever is not awaited yet must not become an unhandled rejection.
  ready.catch(() => undefined);
  result.catch(() => undefined);
  child.on('message', (m: { type: string; result?: WorkerResult }) => {
    if (m.type === 'ready') onReady();
    else if (m.type === 'result' && m.result) onResult(m.result);
  });
  const exited = new Promise<void>((resolve, reject) => {
    child.on('error', reject);
    child.on('exit', (code, signal) => {
      const e = new Error(`batched worker ${child.pid} exited with ${signal ?? `code ${code}`}`);
      fail(e);
      failResult(e);
      if (code === 0) resolve();
      else reject(e);
    });
  });
  exited.catch(() => undefined);
  return { ready, result, exited };
}

function cells(r: Row): string[] {
  const num = (n: number | null, f: (n: number) => string) =>
    n === null || !Number.isFinite(n) ? '—' : f(n);
  return [
    r.label,
    r.config,
    num(r.rate, fmt.int),
    num(r.rate / r.processes, fmt.int),
    num(r.p50Us, micros),
    num(r.p99Us, micros),
    num(r.maxMs, fmt.ms),
    r.trips,
    r.perTrip,
    r.verified.text,
    '',
  ];
}

/** Three significant digits below 1000 µs (0.0712, 3.83, 374), whole numbers above. */
function micros(n: number): string {
  return n < 1000 ? n.toPrecision(3) : fmt.int(n);
}

function goal(text: string, r: Row, cell: string): string[] {
  const who = `${r.config}, ${r.processes} process${r.processes === 1 ? '' : 'es'}`;
  return [`goal ${text}`, who, '', '', '', '', '', '', '', '', cell];
}

function logged(ctx: BenchContext, r: Row): Row {
  ctx.log(
    `batched  ${r.label} · ${r.config}: ${Number.isFinite(r.rate) ? fmt.int(r.rate) : '—'} values/s, ${r.verified.text}`,
  );
  return r;
}

export const batched: Suite = { name: 'batched', run };
