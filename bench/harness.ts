import { cpus } from 'node:os';
import { createHistogram, performance, type RecordableHistogram } from 'node:perf_hooks';
import pg from 'pg';

/** What a suite gets from the runner: a scratch database of its own and the run's settings. */
export interface BenchContext {
  /** URL of a database created for this run and dropped after it. */
  url: string;
  /** Measured seconds per scenario (after the warm-up), in total over its rounds. */
  seconds: number;
  warmupSeconds: number;
  /** Competing scenarios alternate in this many windows (see interleave). */
  rounds: number;
  /** Aborted on Ctrl-C: loads stop early and throw, so that the runner can clean up. */
  signal: AbortSignal;
  /** Progress line (stderr), so that stdout holds only the tables. */
  log(message: string): void;
}

export interface Table {
  title: string;
  columns: Column[];
  /** A row per line; null draws a separator. */
  rows: (string[] | null)[];
  notes?: string[];
  /** Checks that failed (wrong results, not missed goals): the run then exits with status 1. */
  failures?: string[];
}

export interface Column {
  header: string;
  align?: 'left' | 'right';
}

export interface Suite {
  name: string;
  run(ctx: BenchContext): Promise<Table[]>;
}

/** BENCH_SECONDS (default 4) and BENCH_ROUNDS (default 4) from the environment. */
export function settings(
  env: NodeJS.ProcessEnv = process.env,
): Pick<BenchContext, 'seconds' | 'warmupSeconds' | 'rounds'> {
  const seconds = number(env, 'BENCH_SECONDS', 4, 0, 600);
  const rounds = number(env, 'BENCH_ROUNDS', 4, 0, 100);
  if (!Number.isInteger(rounds)) throw new Error('BENCH_ROUNDS must be a whole number');
  return { seconds, warmupSeconds: Math.min(1, seconds / 4), rounds };
}

function number(env: NodeJS.ProcessEnv, name: string, fallback: number, min: number, max: number): number {
  const raw = env[name];
  const n = raw === undefined || raw === '' ? fallback : Number(raw);
  if (!Number.isFinite(n) || n <= min || n > max) {
    throw new Error(`${name} must be a number in (${min}, ${max}] (got ${JSON.stringify(raw)})`);
  }
  return n;
}

export interface LoadOptions {
  /** Concurrent loops. */
  workers: number;
  seconds: number;
  warmupSeconds: number;
  /** One operation of worker `w`; its latency is what the percentiles describe. */
  op(w: number): Promise<void>;
  /** Statements sent so far (a running total); the run's share is added to the measurement. */
  statements?: () => number;
  /** Stops the loops early; the run then throws the abort reason. */
  signal?: AbortSignal;
}

export interface LoadResult {
  /** Operations completed inside the measured windows. */
  ops: number;
  opsPerSecond: number;
  p50Ms: number;
  p99Ms: number;
  maxMs: number;
  /** Every operation, warm-ups and the last ones finishing after a window included. */
  total: number;
  /** Statements sent for all `total` operations, when counted. */
  statements: number;
}

/** Latencies and counts of one scenario, possibly measured in several windows. */
export class Measurement {
  readonly histogram: RecordableHistogram = createHistogram();
  seconds = 0;
  total = 0;
  statements = 0;

  result(): LoadResult {
    const h = this.histogram;
    const ms = (ns: number) => ns / 1e6;
    return {
      ops: h.count,
      opsPerSecond: this.seconds > 0 ? h.count / this.seconds : 0,
      p50Ms: ms(h.percentile(50)),
      p99Ms: ms(h.percentile(99)),
      maxMs: ms(h.max),
      total: this.total,
      statements: this.statements,
    };
  }
}

/**
 * Runs `workers` loops of `op` for the warm-up and then the measured window, recording into
 * `into`. An operation counts when it completes inside the window, so the rate is unbiased in
 * steady state; the loops stop starting operations when the window closes and the call
 * returns once all have finished. The first failure stops every loop and is thrown.
 */
export async function runLoad(o: LoadOptions, into = new Measurement()): Promise<Measurement> {
  const from = performance.now() + o.warmupSeconds * 1000;
  const until = from + o.seconds * 1000;
  const statementsBefore = o.statements?.() ?? 0;
  let failed = false;
  const loop = async (w: number) => {
    while (!failed && !o.signal?.aborted && performance.now() < until) {
      const t0 = process.hrtime.bigint();
      try {
        await o.op(w);
      } catch (e) {
        failed = true;
        throw e;
      }
      into.total++;
      const now = performance.now();
      if (now >= from && now < until) {
        const ns = process.hrtime.bigint() - t0;
        into.histogram.record(ns > 0n ? ns : 1n);
      }
    }
  };
  const results = await Promise.allSettled(Array.from({ length: o.workers }, (_, w) => loop(w)));
  const failure = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failure) throw failure.reason;
  o.signal?.throwIfAborted();
  into.seconds += o.seconds;
  into.statements += (o.statements?.() ?? 0) - statementsBefore;
  return into;
}

/**
 * Measures competing scenarios in `rounds` alternating windows of `seconds / rounds` each,
 * rotating their order every round, so that a burst of load elsewhere on the machine (or a
 * checkpoint) weighs on all of them alike rather than on whichever ran at that moment. Only
 * the first window of each scenario has a warm-up.
 */
export async function interleave<K extends string>(
  scenarios: Record<K, Omit<LoadOptions, 'seconds' | 'warmupSeconds'>>,
  o: { seconds: number; warmupSeconds: number; rounds: number; signal?: AbortSignal },
): Promise<Record<K, Measurement>> {
  const keys = Object.keys(scenarios) as K[];
  const out = Object.fromEntries(keys.map((k) => [k, new Measurement()])) as Record<K, Measurement>;
  for (let r = 0; r < o.rounds; r++) {
    for (let i = 0; i < keys.length; i++) {
      const k = keys[(i + r) % keys.length]!;
      const warmupSeconds = r === 0 ? o.warmupSeconds : 0;
      const seconds = o.seconds / o.rounds;
      await runLoad({ ...scenarios[k], seconds, warmupSeconds, signal: o.signal }, out[k]);
    }
  }
  return out;
}

/** A pool whose connections are opened before the clock starts. */
export async function openPool(url: string, max: number, applicationName: string): Promise<pg.Pool> {
  const pool = new pg.Pool({ connectionString: url, max, application_name: applicationName });
  pool.on('error', () => undefined);
  const clients = await Promise.all(Array.from({ length: max }, () => pool.connect()));
  for (const c of clients) c.release();
  return pool;
}

/**
 * A session idle in a transaction that holds an id, as a forgotten psql leaves one: until it
 * ends, nothing written after it began can be vacuumed away, and it is in every snapshot.
 */
export async function forgottenSession(url: string, applicationName: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url, application_name: applicationName });
  client.on('error', () => undefined);
  await client.connect();
  await client.query('BEGIN');
  await client.query('SELECT pg_current_xact_id()');
  return client;
}

export interface QueryCounter {
  readonly count: number;
  reset(): void;
}

/** Counts the `query` calls made on `target` (a pg Pool, Client or PoolClient) from now on. */
export function countQueries(target: { query: (...args: any[]) => any }): QueryCounter {
  const original = target.query.bind(target);
  let count = 0;
  target.query = (...args: any[]) => {
    count++;
    return original(...args);
  };
  return {
    get count() {
      return count;
    },
    reset() {
      count = 0;
    },
  };
}

/**
 * A statement with its parameters written in as SQL expressions (`values[0]` for $1, …), for a
 * client that sends no parameters: single-user mode, pgbench. Benches that compare with what
 * the library or another bench sends take that statement's own text this way.
 */
export function inline(text: string, values: string[]): string {
  return text.replace(/\$(\d+)/g, (_, n: string) => values[Number(n) - 1] ?? `$${n}`);
}

/** A goal `ratio ≥ min`, as '1.23× ✓' (or ✗). */
export function ratioCell(ratio: number, min: number): string {
  return `${ratio.toFixed(2)}× ${ratio >= min ? '✓' : '✗'}`;
}

const integer = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 });
const decimal = new Intl.NumberFormat('en-US', { minimumFractionDigits: 2, maximumFractionDigits: 2 });
export const fmt = {
  int: (n: number) => integer.format(n),
  ms: (n: number) => decimal.format(n),
  fixed: (n: number, digits = 1) => n.toFixed(digits),
};

export function renderTable(t: Table): string {
  const width = (s: string) => [...s].length;
  const rows = t.rows;
  const widths = t.columns.map((c, i) =>
    Math.max(width(c.header), ...rows.map((r) => (r ? width(r[i] ?? '') : 0))),
  );
  const cell = (s: string, i: number) => {
    const pad = ' '.repeat(widths[i]! - width(s));
    return t.columns[i]!.align === 'right' ? pad + s : s + pad;
  };
  const line = (r: string[]) => `│ ${r.map(cell).join(' │ ')} │`;
  const rule = (l: string, m: string, r: string) => `${l}${widths.map((w) => '─'.repeat(w + 2)).join(m)}${r}`;
  const out = [
    t.title,
    rule('┌', '┬', '┐'),
    line(t.columns.map((c) => c.header)),
    rule('├', '┼', '┤'),
    ...rows.map((r) => (r ? line(r) : rule('├', '┼', '┤'))),
    rule('└', '┴', '┘'),
    ...(t.notes ?? []),
  ];
  return out.join('\n');
}

export function machine(): string {
  const cpu = cpus();
  return `node ${process.version}, ${cpu.length} × ${cpu[0]?.model.trim() ?? 'cpu'}`;
}

/** What a scenario's check found: shown in its table row; a ✗ fails the run. */
export interface Verified {
  ok: boolean;
  text: string;
}

/** PostgreSQL nextval() per call: every value unique, increasing within each connection. */
export function verifyPostgres(perConnection: number[][]): Verified {
  let disorder = 0;
  for (const values of perConnection) {
    for (let i = 1; i < values.length; i++) if (values[i]! <= values[i - 1]!) disorder++;
  }
  const all = Float64Array.from(perConnection.flat()).sort();
  let duplicates = 0;
  for (let i = 1; i < all.length; i++) if (all[i] === all[i - 1]) duplicates++;
  const problems = [disorder && `${disorder} not increasing`, duplicates && `${duplicates} dup`].filter(
    Boolean,
  );
  const ok = problems.length === 0 && all.length > 0;
  return {
    ok,
    text: ok
      ? `✓ ${fmt.int(all.length)} unique, increasing per connection`
      : `✗ ${problems.join(', ') || 'nothing taken'}`,
  };
}
