import { type ChildProcess, spawn } from 'node:child_process';
import { closeSync, createReadStream, openSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import autocannon from 'autocannon';
import pg from 'pg';
import { createOrdo } from '../src/index.js';
import {
  type BenchContext,
  fmt,
  Measurement,
  openPool,
  runLoad,
  type Suite,
  type Table,
  type Verified,
  verifyPostgres,
} from './harness.js';

/**
 * The HTTP API under load: `POST /v1/sequences/<name>/next` with `{}` and with `{ "count": 100 }`,
 * on a batched and on a gapless sequence (one hot scope), against `ordo serve` running in a
 * child process, driven by autocannon from this process; beside it, PostgreSQL's nextval() per
 * call on as many connections. Scenarios alternate in rounds, as the other suites' do. Every
 * value answered is kept and checked afterwards (see the notes of the table).
 */

const CONNECTIONS = 32;
const MANY = 100;
const BATCH = 1000;
const PG_SEQUENCE = 'bench_http_pg';
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const CLI = 'test/support/ordo-cli.ts';
/** A window that has not finished this long after its end is stopped (a request hangs). */
const GRACE_SECONDS = 30;

/** One HTTP scenario: a sequence of its own, one request body, and everything answered. */
class HttpScenario {
  readonly measurement = new Measurement();
  readonly path: string;
  readonly body: string;
  /** Values in the 2xx answers completed inside the measured windows. */
  windowValues = 0;
  /** Every value answered with 200, warm-ups and the answers finishing after a window included. */
  readonly values: number[] = [];
  /** 200 answers whose body was not `{ value, values: [count values] }`. */
  malformed = 0;
  non2xx = 0;
  readonly statuses = new Map<number, number>();
  firstError: string | undefined;
  errors = 0;
  timeouts = 0;

  constructor(
    readonly label: string,
    readonly kind: 'batched' | 'gapless',
    readonly name: string,
    readonly count: number,
  ) {
    this.path = `/v1/sequences/${name}/next`;
    this.body = count === 1 ? '{}' : JSON.stringify({ count });
  }

  /** A response's status and body (autocannon calls this before its 'response' event). */
  answer(status: number, body: string): void {
    if (status !== 200) {
      this.statuses.set(status, (this.statuses.get(status) ?? 0) + 1);
      this.firstError ??= `${status} ${body.slice(0, 200)}`;
      return;
    }
    let reply: { value?: unknown; values?: unknown };
    try {
      reply = JSON.parse(body);
    } catch {
      this.malformed++;
      return;
    }
    const values = reply.values;
    if (!Array.isArray(values) || values.length !== this.count || reply.value !== values[0]) {
      this.malformed++;
    }
    if (Array.isArray(values)) for (const v of values) this.values.push(Number(v));
  }
}

interface Row {
  label: string;
  body: string;
  requestsPerSecond: number;
  valuesPerSecond: number;
  p50Ms: number;
  p99Ms: number;
  non2xx: string;
  errors: string;
  verified: Verified;
}

async function run(ctx: BenchContext): Promise<Table[]> {
  const admin = new pg.Pool({ connectionString: ctx.url, max: 2, application_name: 'ordo-bench-admin' });
  admin.on('error', () => undefined);
  const closers: (() => Promise<unknown>)[] = [];
  const dir = await mkdtemp(join(tmpdir(), 'ordo-bench-http-'));
  try {
    const ordo = await createOrdo({ pool: admin });
    closers.push(() => ordo.close());
    const scenarios = [
      new HttpScenario('ordo HTTP next, batched', 'batched', 'bench_http_batched_one', 1),
      new HttpScenario('ordo HTTP next, batched', 'batched', `bench_http_batched_${MANY}`, MANY),
      new HttpScenario('ordo HTTP next, gapless (hot)', 'gapless', 'bench_http_gapless_one', 1),
      new HttpScenario('ordo HTTP next, gapless (hot)', 'gapless', `bench_http_gapless_${MANY}`, MANY),
    ];
    for (const s of scenarios) {
      await ordo.sequences.define(
        s.kind === 'batched' ? { name: s.name, kind: 'batched', batch: BATCH } : { name: s.name },
      );
    }
    await admin.query(`CREATE SEQUENCE ${PG_SEQUENCE} CACHE 1`);

    // PostgreSQL: one loop per connection, the values of each kept to check them.
    const pgPool = await openPool(ctx.url, CONNECTIONS, 'ordo-bench');
    closers.push(() => pgPool.end());
    const clients = await Promise.all(Array.from({ length: CONNECTIONS }, () => pgPool.connect()));
    closers.push(async () => {
      for (const c of clients) c.release();
    });
    for (const c of clients) c.on('error', () => undefined);
    const pgValues = clients.map((): number[] => []);
    const pgMeasurement = new Measurement();

    ctx.log('http     starting ordo serve');
    const server = await startServer(ctx, join(dir, 'serve.log'));
    closers.push(() => server.stop());
    ctx.log(`http     ordo serve (pid ${server.pid}) at ${server.base}`);

    const windows: ((seconds: number, warmupSeconds: number) => Promise<void>)[] = [
      ...scenarios.map(
        (s) => (seconds: number, warmupSeconds: number) =>
          cannon(server.base, s, seconds, warmupSeconds, ctx.signal),
      ),
      async (seconds: number, warmupSeconds: number) => {
        await runLoad(
          {
            workers: CONNECTIONS,
            seconds,
            warmupSeconds,
            signal: ctx.signal,
            op: async (w) => {
              const { rows } = await clients[w]!.query('SELECT nextval($1) AS v', [PG_SEQUENCE]);
              pgValues[w]!.push(Number(rows[0].v));
            },
          },
          pgMeasurement,
        );
      },
    ];
    ctx.log(`http     ${windows.length} scenarios, ${ctx.rounds} rounds`);
    for (let r = 0; r < ctx.rounds; r++) {
      for (let i = 0; i < windows.length; i++) {
        await windows[(i + r) % windows.length]!(ctx.seconds / ctx.rounds, r === 0 ? ctx.warmupSeconds : 0);
      }
    }

    // The server stops before the checks, so that its log is complete.
    const exit = await server.stop();
    const log = await readServerLog(server.logPath);
    const failures: string[] = [];
    if (exit.code !== 0) failures.push(`ordo serve exited with ${exit.signal ?? `code ${exit.code}`}`);
    if (log.errors > 0) {
      failures.push(`ordo serve logged ${log.errors} error${log.errors === 1 ? '' : 's'}: ${log.firstError}`);
    }

    const rows: Row[] = [];
    for (const s of scenarios) {
      const answered = log.answered.get(s.path) ?? 0;
      const verified =
        s.kind === 'gapless'
          ? await verifyGapless(admin, ordo.schema, s, answered)
          : await verifyBatched(admin, ordo.schema, s, answered);
      const load = s.measurement.result();
      const row = logged(ctx, {
        label: s.label,
        body: s.body,
        requestsPerSecond: load.opsPerSecond,
        valuesPerSecond: s.measurement.seconds > 0 ? s.windowValues / s.measurement.seconds : 0,
        p50Ms: load.p50Ms,
        p99Ms: load.p99Ms,
        non2xx:
          s.non2xx === 0
            ? '0'
            : `${fmt.int(s.non2xx)} (${[...s.statuses].map(([k, n]) => `${n}× ${k}`).join(', ')})`,
        errors: s.errors === 0 ? '0' : `${fmt.int(s.errors)} (${s.timeouts} timeouts)`,
        verified,
      });
      rows.push(row);
      if (s.non2xx > 0) failures.push(`${s.label} ${s.body}: ${s.non2xx} non-2xx, first: ${s.firstError}`);
      if (s.errors > 0) failures.push(`${s.label} ${s.body}: ${s.errors} errors (${s.timeouts} timeouts)`);
      if (!verified.ok) failures.push(`${s.label} ${s.body}: ${verified.text}`);
    }
    const pgLoad = pgMeasurement.result();
    const pgRow = logged(ctx, {
      label: 'PostgreSQL nextval() per call',
      body: `CACHE 1, ${CONNECTIONS} connections`,
      requestsPerSecond: pgLoad.opsPerSecond,
      valuesPerSecond: pgLoad.opsPerSecond,
      p50Ms: pgLoad.p50Ms,
      p99Ms: pgLoad.p99Ms,
      non2xx: '—',
      errors: '0',
      verified: verifyPostgres(pgValues),
    });
    if (!pgRow.verified.ok) failures.push(`${pgRow.label}: ${pgRow.verified.text}`);

    const cell = (r: Row) => [
      r.label,
      r.body,
      fmt.int(r.requestsPerSecond),
      fmt.int(r.valuesPerSecond),
      fmt.ms(r.p50Ms),
      fmt.ms(r.p99Ms),
      r.non2xx,
      r.errors,
      r.verified.text,
      r === pgRow ? '1.00×' : `${fmt.fixed(r.valuesPerSecond / pgRow.valuesPerSecond, 2)}×`,
    ];
    return [
      {
        title: `http — ${ctx.seconds} s per scenario in ${ctx.rounds} alternating rounds, after ${ctx.warmupSeconds} s warm-up; ${CONNECTIONS} connections, pipelining 1, against \`ordo serve\` in a child process`,
        columns: [
          { header: 'scenario' },
          { header: 'body' },
          { header: 'req/s', align: 'right' },
          { header: 'values/s', align: 'right' },
          { header: 'p50 ms', align: 'right' },
          { header: 'p99 ms', align: 'right' },
          { header: 'non-2xx', align: 'right' },
          { header: 'errors', align: 'right' },
          { header: 'verified' },
          { header: 'values/s vs PG', align: 'right' },
        ],
        rows: [...rows.map(cell), null, cell(pgRow)],
        failures,
        notes: [
          `ordo: POST /v1/sequences/<name>/next, a sequence per row (batched: BATCH ${fmt.int(BATCH)}; gapless: one scope, never`,
          `  reset), to \`ordo serve --port 0\` (${CLI}: default pool of 10, one pino log line per request, to a file),`,
          `  from autocannon in this process: ${CONNECTIONS} keep-alive connections, one request in flight each. req/s and`,
          '  values/s count the 2xx answers completed inside the measured windows; p50/p99 are their latencies as',
          '  autocannon measures them (request written to response parsed). When a window closes, every connection',
          '  finishes the request it has in flight and sends no other, so that every request sent is answered.',
          `  This machine has ${availableParallelism()} cores, shared by autocannon, the server and PostgreSQL.`,
          '  verified: gapless: the values of every 200 answer (warm-ups included) are exactly 1..n, n being the',
          '  counter in ordo.counters (nothing taken and not answered, no gap, no duplicate); batched: every value',
          "  unique and inside a range recorded in sequence_batches; both: the server's log has as many 200s for the",
          '  route as autocannon received, and every answer held `count` values.',
          `PostgreSQL: ${CONNECTIONS} loops in this process, a connection each, one autocommitted SELECT nextval($1) per`,
          '  value (CACHE 1); verified: all values unique, increasing per connection.',
        ],
      },
    ];
  } finally {
    for (const close of closers.reverse()) await close().catch(() => undefined);
    await admin.end();
    await rm(dir, { recursive: true, force: true });
  }
}

function logged(ctx: BenchContext, r: Row): Row {
  ctx.log(
    `http     ${r.label} · ${r.body}: ${fmt.int(r.requestsPerSecond)} req/s, ${fmt.int(r.valuesPerSecond)} values/s, p99 ${fmt.ms(r.p99Ms)} ms, ${r.verified.text}`,
  );
  return r;
}

// ─── load ────────────────────────────────────────────────────────────────────────────────

/** What autocannon's Client holds and its typings leave out. */
interface ClientState {
  destroyed: boolean;
  reqsMade: number;
  responseMax: number | undefined;
}

/**
 * One window of `s`: autocannon for the warm-up and `seconds` measured. At the end of the
 * window each connection gets a request limit of what it has sent, so that it stops after
 * the answer in flight (autocannon's own stop would drop those answers, whose numbers the
 * server has taken). Answers completing inside the measured part are timed and counted.
 */
function cannon(
  base: string,
  s: HttpScenario,
  seconds: number,
  warmupSeconds: number,
  signal: AbortSignal,
): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const clients: ClientState[] = [];
    const from = performance.now() + warmupSeconds * 1000;
    const until = from + seconds * 1000;
    const drain = () => {
      for (const c of clients) if (!c.destroyed) c.responseMax = Math.max(1, c.reqsMade);
    };
    const timer = setTimeout(drain, until - performance.now());
    const instance = autocannon(
      {
        url: base,
        connections: CONNECTIONS,
        pipelining: 1,
        duration: warmupSeconds + seconds + GRACE_SECONDS,
        // autocannon checks for its end at each sample: often, so that a window ends soon after its last answer.
        sampleInt: 50,
        timeout: 10,
        requests: [
          {
            method: 'POST',
            path: s.path,
            headers: { 'content-type': 'application/json' },
            body: s.body,
            onResponse: (status, body) => s.answer(status, body),
          },
        ],
        setupClient: (client) => {
          clients.push(client as unknown as ClientState);
        },
      },
      (error, result) => {
        clearTimeout(timer);
        signal.removeEventListener('abort', stop);
        if (error) return reject(error);
        s.errors += result.errors;
        s.timeouts += result.timeouts;
        if (signal.aborted) return reject(signal.reason);
        s.measurement.seconds += seconds;
        resolve();
      },
    );
    const stop = () => instance.stop();
    signal.addEventListener('abort', stop, { once: true });
    instance.on('response', (_client, status, _bytes, ms) => {
      if (status < 200 || status >= 300) {
        s.non2xx++;
        return;
      }
      s.measurement.total++;
      const now = performance.now();
      if (now >= from && now < until) {
        s.measurement.histogram.record(Math.max(1, Math.round(ms * 1e6)));
        s.windowValues += s.count;
      }
    });
  });
}

// ─── the server ──────────────────────────────────────────────────────────────────────────

interface Server {
  base: string;
  pid: number;
  logPath: string;
  /** SIGTERM, then its exit (SIGKILL when it has not exited after 20 s). Idempotent. */
  stop(): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/**
 * `ordo serve --port 0` as a child process, its log (stdout) going to a file so that this
 * process, busy with the load, never has to read it; the port comes from its
 * 'ordo is listening' line.
 */
async function startServer(ctx: BenchContext, logPath: string): Promise<Server> {
  const env = { ...process.env };
  // Open routes: the bench sends no token. The database is the one given on the command line.
  for (const key of ['ORDO_TOKENS', 'DATABASE_URL', 'ORDO_DATABASE_URL']) delete env[key];
  const out = openSync(logPath, 'w');
  let child: ChildProcess;
  try {
    child = spawn(
      process.execPath,
      ['--import', 'tsx', CLI, 'serve', '--port', '0', '--database-url', ctx.url],
      {
        cwd: ROOT,
        env,
        stdio: ['ignore', out, 'pipe'],
      },
    );
  } finally {
    closeSync(out);
  }
  let stderr = '';
  child.stderr!.on('data', (chunk: Buffer) => {
    if (stderr.length < 64 * 1024) stderr += chunk.toString();
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    child.on('exit', (code, signal) => resolve({ code, signal }));
    child.on('error', () => resolve({ code: null, signal: null }));
  });
  let stopping: Promise<{ code: number | null; signal: NodeJS.Signals | null }> | undefined;
  const stop = () => {
    stopping ??= (async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<'late'>((resolve) => {
        timer = setTimeout(() => resolve('late'), 20_000);
      });
      const first = await Promise.race([exited, late]);
      clearTimeout(timer);
      if (first !== 'late') return first;
      child.kill('SIGKILL');
      return exited;
    })();
    return stopping;
  };
  const kill = () => void stop();
  ctx.signal.addEventListener('abort', kill, { once: true });
  exited.then(() => ctx.signal.removeEventListener('abort', kill));

  const deadline = performance.now() + 30_000;
  try {
    for (;;) {
      ctx.signal.throwIfAborted();
      const text = await readFile(logPath, 'utf8');
      const line = text.split('\n').find((l) => l.includes('"msg":"ordo is listening"'));
      if (line) {
        const url = new URL(JSON.parse(line).url as string);
        return { base: `http://127.0.0.1:${url.port}`, pid: child.pid!, logPath, stop };
      }
      if (child.exitCode !== null || child.signalCode !== null) {
        throw new Error(`ordo serve exited before listening:\n${text}${stderr}`);
      }
      if (performance.now() > deadline)
        throw new Error(`ordo serve did not listen within 30 s:\n${text}${stderr}`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  } catch (e) {
    await stop();
    throw e;
  }
}

interface ServerLog {
  /** 'request' lines with status 200, per url. */
  answered: Map<string, number>;
  /** Lines at level error or above. */
  errors: number;
  firstError: string | undefined;
}

async function readServerLog(path: string): Promise<ServerLog> {
  const log: ServerLog = { answered: new Map(), errors: 0, firstError: undefined };
  const lines = createInterface({
    input: createReadStream(path, 'utf8'),
    crlfDelay: Number.POSITIVE_INFINITY,
  });
  for await (const line of lines) {
    if (!line.startsWith('{')) continue;
    let entry: { level?: number; msg?: string; url?: string; status?: number; err?: { message?: string } };
    try {
      entry = JSON.parse(line);
    } catch {
      continue;
    }
    if ((entry.level ?? 0) >= 50) {
      log.errors++;
      log.firstError ??= `${entry.msg}${entry.err?.message ? `: ${entry.err.message}` : ''}`;
    }
    if (entry.msg === 'request' && entry.status === 200 && entry.url) {
      log.answered.set(entry.url, (log.answered.get(entry.url) ?? 0) + 1);
    }
  }
  return log;
}

// ─── checks ──────────────────────────────────────────────────────────────────────────────

/** Problems common to both kinds: malformed answers, and answers the server logged but we did not get. */
function answerProblems(s: HttpScenario, answeredByServer: number): string[] {
  const problems: string[] = [];
  if (s.malformed) problems.push(`${s.malformed} malformed answers`);
  if (answeredByServer !== s.measurement.total) {
    problems.push(
      `server logged ${fmt.int(answeredByServer)} × 200, received ${fmt.int(s.measurement.total)}`,
    );
  }
  return problems;
}

/** Gapless: the values answered are exactly 1..n, and n is the stored counter. */
async function verifyGapless(
  admin: pg.Pool,
  schema: string,
  s: HttpScenario,
  answeredByServer: number,
): Promise<Verified> {
  const { rows } = await admin.query(`SELECT scope, value FROM ${schema}.counters WHERE sequence = $1`, [
    s.name,
  ]);
  const counter = rows.reduce((n, r) => n + Number(r.value), 0);
  const sorted = Float64Array.from(s.values).sort();
  let duplicates = 0;
  let outOfRange = 0;
  let distinct = 0;
  for (let i = 0; i < sorted.length; i++) {
    if (sorted[i]! < 1 || !Number.isInteger(sorted[i])) outOfRange++;
    else if (i > 0 && sorted[i] === sorted[i - 1]) duplicates++;
    else distinct++;
  }
  const hi = sorted.length ? sorted[sorted.length - 1]! : 0;
  const problems = answerProblems(s, answeredByServer);
  if (rows.length > 1) problems.push(`${rows.length} counter rows`);
  if (duplicates) problems.push(`${duplicates} dup`);
  if (outOfRange) problems.push(`${outOfRange} below 1`);
  if (hi > distinct) problems.push(`${hi - distinct} gaps`);
  if (counter > hi) problems.push(`${counter - hi} taken, not answered`);
  if (counter < hi) problems.push(`counter ${hi - counter} behind`);
  const ok = problems.length === 0 && sorted.length > 0;
  return {
    ok,
    text: ok
      ? `✓ 1..${fmt.int(hi)}, = counter`
      : `✗ ${problems.join(', ') || 'nothing answered'} (${fmt.int(sorted.length)} values, counter ${fmt.int(counter)})`,
  };
}

/** Batched: every value unique and inside a range recorded for the sequence. */
async function verifyBatched(
  admin: pg.Pool,
  schema: string,
  s: HttpScenario,
  answeredByServer: number,
): Promise<Verified> {
  const { rows } = await admin.query(
    `SELECT first, last FROM ${schema}.sequence_batches WHERE sequence = $1 ORDER BY first`,
    [s.name],
  );
  const ranges = rows.map((r) => ({ first: Number(r.first), last: Number(r.last) }));
  const sorted = Float64Array.from(s.values).sort();
  let duplicates = 0;
  let outside = 0;
  let j = 0;
  for (let i = 0; i < sorted.length; i++) {
    const v = sorted[i]!;
    if (i > 0 && v === sorted[i - 1]) duplicates++;
    while (j < ranges.length && ranges[j]!.last < v) j++;
    if (j === ranges.length || ranges[j]!.first > v) outside++;
  }
  const problems = answerProblems(s, answeredByServer);
  if (duplicates) problems.push(`${duplicates} dup`);
  if (outside) problems.push(`${outside} outside recorded ranges`);
  const ok = problems.length === 0 && sorted.length > 0;
  return {
    ok,
    text: ok
      ? `✓ ${fmt.int(sorted.length)} unique, in ${fmt.int(ranges.length)} ranges`
      : `✗ ${problems.join(', ') || 'nothing answered'}`,
  };
}

export const http: Suite = { name: 'http', run };
