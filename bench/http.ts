import { type ChildProcess, fork, spawn } from 'node:child_process';
import { closeSync, createReadStream, openSync } from 'node:fs';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath, pathToFileURL } from 'node:url';
import pg from 'pg';
import { createOrdo } from '../src/index.js';
import { ensureSystemPrograms, SYSTEM_PROGRAMS } from '../test/support/system-packages.js';
import {
  type BenchContext,
  fmt,
  type LoadResult,
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
 * The HTTP API under load: `POST /v1/sequences/<name>/next` with `{}` and with `{ "count": 100 }`,
 * on a batched and on a gapless sequence (one hot scope), against `ordo serve` in child processes
 * (one process, and `--workers` as many as the machine has cores), driven by wrk in a process of
 * its own; beside them, from another process of its own on as many connections, PostgreSQL's
 * nextval() and ordo's SQL function nextval() on a gapless sequence, one statement per value.
 * Scenarios alternate in rounds, as the other suites' do. Every value answered is kept and
 * checked afterwards (see the notes of the table).
 */

const CONNECTIONS = 32;
const MANY = 100;
const BATCH = 1000;
/** `ordo serve --workers`: one per core. */
const WORKERS = availableParallelism();
const WRK_THREADS = 2;
/** wrk, from Debian's packages (installed when missing). */
const WRK = SYSTEM_PROGRAMS.find((p) => p.debianPackage === 'wrk')!.path;
/** Goals: batched {} over HTTP against PostgreSQL's nextval(); gapless {} against ordo.nextval() in SQL. */
const GOAL = { batched: 2, gapless: 1 };
const PG_SEQUENCE = 'bench_http_pg';
const SQL_GAPLESS = 'bench_http_gapless_sql';
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const CLI = 'test/support/ordo-cli.ts';
/** wrk runs this long after its window closes, for the requests in flight then to be answered. */
const GRACE_SECONDS = 2;
/** Between starting wrk and its window (or warm-up): its connections open. */
const STARTUP_MS = 300;
/** The argument that makes this module the process that runs the SQL loads. */
const SQL_LOAD = 'sql-load';

type ServerKind = 'single' | 'workers';

/** One HTTP scenario: a sequence of its own, one request body, one server, and everything answered. */
class HttpScenario {
  readonly path: string;
  readonly body: string;
  /** Measured seconds, over every window. */
  seconds = 0;
  /** 200 answers completed inside the measured windows. */
  inWindow = 0;
  /** Every 200 answer, warm-ups and the answers finishing after a window included. */
  answered = 0;
  /** Every value answered with 200. */
  readonly values: number[] = [];
  /** 200 answers whose body was not `{ value, values: [count values] }`. */
  malformed = 0;
  readonly statuses = new Map<number, number>();
  firstError: string | undefined;
  /** wrk's socket errors and timeouts. */
  errors = 0;
  timeouts = 0;
  /** wrk's latency of each window, µs, with the answers it covers. */
  readonly latencies: { p50: number; p99: number; n: number }[] = [];

  constructor(
    readonly label: string,
    readonly kind: 'batched' | 'gapless',
    readonly server: ServerKind,
    readonly name: string,
    readonly count: number,
  ) {
    this.path = `/v1/sequences/${name}/next`;
    this.body = count === 1 ? '{}' : JSON.stringify({ count });
  }

  get non2xx(): number {
    let n = 0;
    for (const k of this.statuses.values()) n += k;
    return n;
  }

  /** One answer, as the wrk script wrote it: its status and body. */
  answer(status: number, body: string): void {
    if (status !== 200) {
      this.statuses.set(status, (this.statuses.get(status) ?? 0) + 1);
      this.firstError ??= `${status} ${body.slice(0, 200)}`;
      return;
    }
    this.answered++;
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
  server: string;
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
  ensureSystemPrograms(ctx.log, ['wrk']);
  const admin = new pg.Pool({ connectionString: ctx.url, max: 2, application_name: 'ordo-bench-admin' });
  admin.on('error', () => undefined);
  const closers: (() => Promise<unknown>)[] = [];
  const dir = await mkdtemp(join(tmpdir(), 'ordo-bench-http-'));
  try {
    const ordo = await createOrdo({ pool: admin });
    closers.push(() => ordo.close());
    const workers = `${WORKERS} workers`;
    const scenarios = [
      new HttpScenario('ordo HTTP next, batched', 'batched', 'single', 'bench_http_batched_single', 1),
      new HttpScenario('ordo HTTP next, batched', 'batched', 'workers', 'bench_http_batched_one', 1),
      new HttpScenario('ordo HTTP next, batched', 'batched', 'workers', `bench_http_batched_${MANY}`, MANY),
      new HttpScenario('ordo HTTP next, gapless (hot)', 'gapless', 'single', 'bench_http_gapless_single', 1),
      new HttpScenario('ordo HTTP next, gapless (hot)', 'gapless', 'workers', 'bench_http_gapless_one', 1),
      new HttpScenario(
        'ordo HTTP next, gapless (hot)',
        'gapless',
        'workers',
        `bench_http_gapless_${MANY}`,
        MANY,
      ),
    ];
    for (const s of scenarios) {
      await ordo.sequences.define(
        s.kind === 'batched' ? { name: s.name, kind: 'batched', batch: BATCH } : { name: s.name },
      );
    }
    await ordo.sequences.define({ name: SQL_GAPLESS });
    await admin.query(`CREATE SEQUENCE ${PG_SEQUENCE} CACHE 1`);
    const script = join(dir, 'next.lua');
    await writeFile(script, WRK_SCRIPT);

    ctx.log('http     starting the SQL load process and ordo serve, alone and with --workers');
    const sql = await SqlLoad.start(ctx);
    closers.push(() => sql.stop());
    const servers = {
      single: await startServer(ctx, join(dir, 'single.log'), []),
      workers: await startServer(ctx, join(dir, 'workers.log'), ['--workers', String(WORKERS)]),
    };
    closers.push(
      () => servers.single.stop(),
      () => servers.workers.stop(),
    );
    ctx.log(`http     ordo serve at ${servers.single.base}, --workers ${WORKERS} at ${servers.workers.base}`);

    const sqlScenarios = [
      { label: 'PostgreSQL nextval() per call', text: 'SELECT nextval($1) AS v', name: PG_SEQUENCE },
      {
        label: 'ordo.nextval() per call, gapless (hot)',
        text: `SELECT ${ordo.schema}.nextval($1) AS v`,
        name: SQL_GAPLESS,
      },
    ];
    let window = 0;
    const windows: ((seconds: number, warmupSeconds: number) => Promise<void>)[] = [
      ...scenarios.map(
        (s) => (seconds: number, warmupSeconds: number) =>
          wrk(
            servers[s.server].base,
            s,
            seconds,
            warmupSeconds,
            script,
            join(dir, `w${window++}`),
            ctx.signal,
          ),
      ),
      ...sqlScenarios.map(
        (q) => (seconds: number, warmupSeconds: number) =>
          sql.run(q.label, q.text, [q.name], seconds, warmupSeconds),
      ),
    ];
    ctx.log(`http     ${windows.length} scenarios, ${ctx.rounds} rounds`);
    for (let r = 0; r < ctx.rounds; r++) {
      for (let i = 0; i < windows.length; i++) {
        await windows[(i + r) % windows.length]!(ctx.seconds / ctx.rounds, r === 0 ? ctx.warmupSeconds : 0);
      }
    }
    const sqlResults = await sql.finish();

    // The servers stop before the checks, so that their logs are complete.
    const failures: string[] = [];
    const logs = {} as Record<ServerKind, ServerLog>;
    for (const kind of ['single', 'workers'] as const) {
      const exit = await servers[kind].stop();
      logs[kind] = await readServerLog(servers[kind].logPath);
      const what = kind === 'single' ? 'ordo serve' : `ordo serve --workers ${WORKERS}`;
      if (exit.code !== 0) failures.push(`${what} exited with ${exit.signal ?? `code ${exit.code}`}`);
      if (logs[kind].errors > 0) {
        const n = logs[kind].errors;
        failures.push(`${what} logged ${n} error${n === 1 ? '' : 's'}: ${logs[kind].firstError}`);
      }
    }

    const rows: Row[] = [];
    const serverText = (s: HttpScenario) => (s.server === 'single' ? '1 process' : workers);
    for (const s of scenarios) {
      const answered = logs[s.server].answered.get(s.path) ?? 0;
      const verified =
        s.kind === 'gapless'
          ? await verifyGapless(admin, ordo.schema, s.name, s.values, answerProblems(s, answered))
          : await verifyBatched(admin, ordo.schema, s, answered);
      const n = s.latencies.reduce((a, l) => a + l.n, 0);
      const row = logged(ctx, {
        label: s.label,
        server: serverText(s),
        body: s.body,
        requestsPerSecond: s.seconds > 0 ? s.inWindow / s.seconds : 0,
        valuesPerSecond: s.seconds > 0 ? (s.inWindow * s.count) / s.seconds : 0,
        p50Ms: n > 0 ? s.latencies.reduce((a, l) => a + l.p50 * l.n, 0) / n / 1000 : 0,
        p99Ms: Math.max(0, ...s.latencies.map((l) => l.p99)) / 1000,
        non2xx:
          s.non2xx === 0
            ? '0'
            : `${fmt.int(s.non2xx)} (${[...s.statuses].map(([k, c]) => `${c}× ${k}`).join(', ')})`,
        errors: s.errors === 0 ? '0' : `${fmt.int(s.errors)} (${s.timeouts} timeouts)`,
        verified,
      });
      rows.push(row);
      const what = `${s.label} ${s.body}, ${serverText(s)}`;
      if (s.non2xx > 0) failures.push(`${what}: ${s.non2xx} non-2xx, first: ${s.firstError}`);
      if (s.errors > 0) failures.push(`${what}: ${s.errors} errors (${s.timeouts} timeouts)`);
      if (!verified.ok) failures.push(`${what}: ${verified.text}`);
    }
    const sqlRow = (q: (typeof sqlScenarios)[number], verified: Verified): Row => {
      const load = sqlResults[q.label]!.load;
      return logged(ctx, {
        label: q.label,
        server: `${CONNECTIONS} connections`,
        body: q.name === PG_SEQUENCE ? 'CACHE 1' : 'standalone',
        requestsPerSecond: load.opsPerSecond,
        valuesPerSecond: load.opsPerSecond,
        p50Ms: load.p50Ms,
        p99Ms: load.p99Ms,
        non2xx: '—',
        errors: '0',
        verified,
      });
    };
    const pgRow = sqlRow(sqlScenarios[0]!, verifyPostgres(sqlResults[sqlScenarios[0]!.label]!.values));
    const naiveRow = sqlRow(
      sqlScenarios[1]!,
      await verifyGapless(
        admin,
        ordo.schema,
        SQL_GAPLESS,
        sqlResults[sqlScenarios[1]!.label]!.values.flat(),
        [],
      ),
    );
    for (const r of [pgRow, naiveRow]) if (!r.verified.ok) failures.push(`${r.label}: ${r.verified.text}`);

    const cell = (r: Row) => [
      r.label,
      r.server,
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
    const goal = (text: string, r: Row, ratio: string) => [
      `goal ${text}`,
      r.server,
      r.body,
      '',
      '',
      '',
      '',
      '',
      '',
      '',
      ratio,
    ];
    const one = (kind: 'batched' | 'gapless') =>
      rows.filter((r, i) => scenarios[i]!.kind === kind && scenarios[i]!.count === 1);
    const goals = [
      ...one('batched').map((r) =>
        goal(
          `batched {} req/s ≥ ${GOAL.batched} × PostgreSQL nextval()/s`,
          r,
          ratioCell(r.requestsPerSecond / pgRow.requestsPerSecond, GOAL.batched),
        ),
      ),
      ...one('gapless').map((r) =>
        goal(
          `gapless {} req/s ≥ ${GOAL.gapless} × ordo.nextval() in SQL/s`,
          r,
          ratioCell(r.requestsPerSecond / naiveRow.requestsPerSecond, GOAL.gapless),
        ),
      ),
    ];
    return [
      {
        title: `http — ${ctx.seconds} s per scenario in ${ctx.rounds} alternating rounds, after ${ctx.warmupSeconds} s warm-up; ${CONNECTIONS} connections from a process of their own (wrk; node and pg for SQL)`,
        columns: [
          { header: 'scenario' },
          { header: 'server' },
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
        rows: [...rows.map(cell), null, cell(pgRow), cell(naiveRow), null, ...goals],
        failures,
        notes: [
          `ordo: POST /v1/sequences/<name>/next, a sequence per row (batched: BATCH ${fmt.int(BATCH)}; gapless: one scope, never`,
          `  reset, no Idempotency-Key), to \`ordo serve --port 0\` and \`ordo serve --port 0 --workers ${WORKERS}\` (${CLI}:`,
          '  a pool of 10 per process, one pino log line per request, to a file), both running throughout, one loaded at a',
          `  time, from wrk (${WRK_THREADS} threads) in a process of its own: ${CONNECTIONS} keep-alive connections, one request in`,
          "  flight each. req/s and values/s count the 200s completed inside the measured windows; p50/p99 are wrk's",
          '  (request written to answer read) over each window with its warm-up, averaged over windows (p50, weighted by',
          '  answers) or the highest (p99). When a window closes, wrk sends nothing more and the requests in flight are',
          '  answered, so that every request sent is answered.',
          `  This machine has ${availableParallelism()} cores, shared by the load, the servers and PostgreSQL.`,
          '  verified: gapless: the values of every 200 answer (warm-ups included) are exactly 1..n, n being the',
          '  counter in ordo.counters (nothing taken and not answered, no gap, no duplicate); batched: every value',
          "  unique and inside a range recorded in sequence_batches; both: the server's log has as many 200s for the",
          '  route as wrk received, and every answer held `count` values.',
          `SQL: ${CONNECTIONS} loops in a node process of their own (pg), a connection each, one autocommitted statement per`,
          `  value: PostgreSQL's SELECT nextval($1) (CACHE 1; verified: all values unique, increasing per connection), and`,
          `  ordo's SELECT ${ordo.schema}.nextval($1) on a gapless sequence of its own, one scope (verified as above: 1..n = counter).`,
          'goals: req/s of batched {} against PostgreSQL nextval() per second; of gapless {} against ordo.nextval() in SQL.',
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
    `http     ${r.label} · ${r.body} · ${r.server}: ${fmt.int(r.requestsPerSecond)} req/s, ${fmt.int(r.valuesPerSecond)} values/s, p99 ${fmt.ms(r.p99Ms)} ms, ${r.verified.text}`,
  );
  return r;
}

// ─── HTTP load: wrk ──────────────────────────────────────────────────────────────────────

/**
 * wrk's script (LuaJIT): POSTs the body given, writes every answer to a file of its thread
 * (`<status> <body>` a line) and counts the 200s completing inside the window. Once the window
 * has closed it sends nothing more (delay() holds each connection's next request for an hour),
 * so the requests in flight then are answered before wrk stops. Its arguments: window start and
 * end (ms since the epoch), the files' prefix, the body.
 */
const WRK_SCRIPT = `
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } ordo_timespec;
int clock_gettime(int clock, ordo_timespec *ts);
]]
local ts = ffi.new("ordo_timespec")
local function now()
  ffi.C.clock_gettime(0, ts)
  return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end

local threads = {}
function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end

function init(args)
  from, till = tonumber(args[1]), tonumber(args[2])
  out = io.open(args[3] .. "-" .. id .. ".txt", "w")
  wrk.method = "POST"
  wrk.body = args[4]
  wrk.headers["Content-Type"] = "application/json"
  req = wrk.format()
  inWindow = 0
end

function delay()
  if now() >= till then return 3600000 end
  return 0
end

function request()
  return req
end

function response(status, headers, body)
  out:write(status, " ", body, "\\n")
  local t = now()
  if status == 200 and t >= from and t < till then inWindow = inWindow + 1 end
  if t >= till then out:flush() end
end

function done(summary, latency, requests)
  local n = 0
  for _, t in ipairs(threads) do n = n + t:get("inWindow") end
  local e = summary.errors
  io.write(string.format('\\n{"inWindow":%d,"connect":%d,"read":%d,"write":%d,"timeout":%d,"requests":%d,"p50":%d,"p99":%d}\\n',
    n, e.connect, e.read, e.write, e.timeout, summary.requests, latency:percentile(50), latency:percentile(99)))
end
`;

/** One window of `s`: wrk for the warm-up and `seconds` measured, then the answers it wrote. */
async function wrk(
  base: string,
  s: HttpScenario,
  seconds: number,
  warmupSeconds: number,
  script: string,
  prefix: string,
  signal: AbortSignal,
): Promise<void> {
  const from = Date.now() + STARTUP_MS + warmupSeconds * 1000;
  const until = from + seconds * 1000;
  const duration = Math.ceil((until - Date.now()) / 1000 + GRACE_SECONDS);
  const args = [
    '-t',
    String(WRK_THREADS),
    '-c',
    String(CONNECTIONS),
    '-d',
    `${duration}s`,
    '--timeout',
    '10s',
  ];
  args.push('-s', script, `${base}${s.path}`, '--', String(from), String(until), prefix, s.body);
  const child = spawn(WRK, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (err += chunk.toString()));
  const stop = () => child.kill('SIGKILL');
  signal.addEventListener('abort', stop, { once: true });
  const code = await new Promise<number | null>((resolve, reject) => {
    child.on('error', reject);
    child.on('exit', (c) => resolve(c));
  }).finally(() => signal.removeEventListener('abort', stop));
  signal.throwIfAborted();
  const summary = out
    .split('\n')
    .reverse()
    .find((l) => l.startsWith('{'));
  if (code !== 0 || !summary) throw new Error(`wrk exited with code ${code}: ${err || out}`);
  const r = JSON.parse(summary) as Record<
    'inWindow' | 'connect' | 'read' | 'write' | 'timeout' | 'requests' | 'p50' | 'p99',
    number
  >;
  s.inWindow += r.inWindow;
  s.seconds += seconds;
  s.errors += r.connect + r.read + r.write + r.timeout;
  s.timeouts += r.timeout;
  s.latencies.push({ p50: r.p50, p99: r.p99, n: r.requests });
  const dir = join(prefix, '..');
  const name = prefix.slice(dir.length + 1);
  for (const file of (await readdir(dir)).filter((f) => f.startsWith(`${name}-`))) {
    const lines = createInterface({ input: createReadStream(join(dir, file), 'utf8'), crlfDelay: Infinity });
    for await (const line of lines) {
      if (line === '') continue;
      const space = line.indexOf(' ');
      s.answer(Number(line.slice(0, space)), line.slice(space + 1));
    }
    await rm(join(dir, file));
  }
}

// ─── SQL load: a process of its own ──────────────────────────────────────────────────────

interface SqlResult {
  load: LoadResult;
  /** The values each connection took, in order. */
  values: number[][];
}

type SqlMessage =
  | { type: 'ready' }
  | { type: 'ran' }
  | { type: 'results'; results: Record<string, SqlResult> }
  | { type: 'error'; message: string };

/**
 * The SQL loads run in a child process (this module, given SQL_LOAD), so that PostgreSQL's
 * clients have a process of their own as the HTTP load has: `CONNECTIONS` connections opened
 * once, a statement per value on each, scenarios measured across windows as runLoad() does.
 */
class SqlLoad {
  private waiting: { resolve: (m: SqlMessage) => void; reject: (e: Error) => void } | undefined;

  private constructor(private readonly child: ChildProcess) {
    child.on('message', (m: SqlMessage) => {
      const w = this.waiting;
      this.waiting = undefined;
      if (m.type === 'error') w?.reject(new Error(`the SQL load process: ${m.message}`));
      else w?.resolve(m);
    });
    child.on('exit', (code, signal) => {
      this.waiting?.reject(new Error(`the SQL load process exited (${signal ?? code})`));
      this.waiting = undefined;
    });
  }

  static async start(ctx: BenchContext): Promise<SqlLoad> {
    const child = fork(fileURLToPath(import.meta.url), [SQL_LOAD, ctx.url], { stdio: 'inherit' });
    const load = new SqlLoad(child);
    const kill = () => child.kill('SIGKILL');
    ctx.signal.addEventListener('abort', kill, { once: true });
    child.on('exit', () => ctx.signal.removeEventListener('abort', kill));
    await load.next();
    return load;
  }

  private next(send?: object): Promise<SqlMessage> {
    return new Promise((resolve, reject) => {
      this.waiting = { resolve, reject };
      if (send) this.child.send(send);
    });
  }

  async run(label: string, text: string, values: string[], seconds: number, warmupSeconds: number) {
    await this.next({ type: 'run', label, text, values, seconds, warmupSeconds });
  }

  async finish(): Promise<Record<string, SqlResult>> {
    const m = await this.next({ type: 'finish' });
    if (m.type !== 'results') throw new Error(`the SQL load process answered ${m.type}`);
    return m.results;
  }

  /** Ends the process: its connections are closed once it has answered finish(). */
  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise((resolve) => this.child.once('exit', resolve));
    if (this.child.connected) this.child.disconnect();
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 10_000);
    await exited;
    clearTimeout(timer);
  }
}

/** The child's side of SqlLoad. */
async function sqlLoadProcess(url: string): Promise<void> {
  const send = (m: SqlMessage) => process.send!(m);
  const pool = await openPool(url, CONNECTIONS, 'ordo-bench');
  const clients = await Promise.all(Array.from({ length: CONNECTIONS }, () => pool.connect()));
  for (const c of clients) c.on('error', () => undefined);
  const scenarios = new Map<string, { measurement: Measurement; values: number[][] }>();
  process.on(
    'message',
    (m: {
      type: string;
      label: string;
      text: string;
      values: string[];
      seconds: number;
      warmupSeconds: number;
    }) => {
      (async () => {
        if (m.type === 'finish') {
          const results: Record<string, SqlResult> = {};
          for (const [label, s] of scenarios)
            results[label] = { load: s.measurement.result(), values: s.values };
          // The parent disconnects once it has them: a disconnect from here could drop them unsent.
          send({ type: 'results', results });
          for (const c of clients) c.release();
          await pool.end();
          return;
        }
        let s = scenarios.get(m.label);
        if (!s)
          scenarios.set(m.label, (s = { measurement: new Measurement(), values: clients.map(() => []) }));
        const values = s.values;
        await runLoad(
          {
            workers: CONNECTIONS,
            seconds: m.seconds,
            warmupSeconds: m.warmupSeconds,
            op: async (w) => {
              const { rows } = await clients[w]!.query(m.text, m.values);
              values[w]!.push(Number(rows[0].v));
            },
          },
          s.measurement,
        );
        send({ type: 'ran' });
      })().catch((e: Error) => send({ type: 'error', message: e.message }));
    },
  );
  send({ type: 'ready' });
}

// ─── the server ──────────────────────────────────────────────────────────────────────────

interface Server {
  base: string;
  logPath: string;
  /** SIGTERM, then its exit (SIGKILL when it has not exited after 20 s). Idempotent. */
  stop(): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/**
 * `ordo serve --port 0 …args` as a child process, its log (stdout) going to a file so that this
 * process never has to read it under load; the port comes from its 'ordo is listening' line.
 */
async function startServer(ctx: BenchContext, logPath: string, args: string[]): Promise<Server> {
  const env = { ...process.env };
  // Open routes: the bench sends no token. The database is the one given on the command line.
  for (const key of ['ORDO_TOKENS', 'DATABASE_URL', 'ORDO_DATABASE_URL']) delete env[key];
  const out = openSync(logPath, 'w');
  let child: ChildProcess;
  try {
    child = spawn(
      process.execPath,
      ['--import', 'tsx', CLI, 'serve', '--port', '0', '--database-url', ctx.url, ...args],
      { cwd: ROOT, env, stdio: ['ignore', out, 'pipe'] },
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

  const deadline = performance.now() + 60_000;
  try {
    for (;;) {
      ctx.signal.throwIfAborted();
      const text = await readFile(logPath, 'utf8');
      const line = text.split('\n').find((l) => l.includes('"msg":"ordo is listening"'));
      if (line) {
        const url = new URL(JSON.parse(line).url as string);
        return { base: `http://127.0.0.1:${url.port}`, logPath, stop };
      }
      if (child.exitCode !== null || child.signalCode !== null) {
        throw new Error(`ordo serve exited before listening:\n${text}${stderr}`);
      }
      if (performance.now() > deadline)
        throw new Error(`ordo serve did not listen within 60 s:\n${text}${stderr}`);
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

/** Problems common to both kinds: malformed answers, and answers the server logged but wrk did not get. */
function answerProblems(s: HttpScenario, answeredByServer: number): string[] {
  const problems: string[] = [];
  if (s.malformed) problems.push(`${s.malformed} malformed answers`);
  if (answeredByServer !== s.answered) {
    problems.push(`server logged ${fmt.int(answeredByServer)} × 200, received ${fmt.int(s.answered)}`);
  }
  return problems;
}

/** Gapless: the values answered are exactly 1..n, and n is the stored counter. */
async function verifyGapless(
  admin: pg.Pool,
  schema: string,
  name: string,
  values: number[],
  problems: string[],
): Promise<Verified> {
  const { rows } = await admin.query(`SELECT scope, value FROM ${schema}.counters WHERE sequence = $1`, [
    name,
  ]);
  const counter = rows.reduce((n, r) => n + Number(r.value), 0);
  const sorted = Float64Array.from(values).sort();
  let duplicates = 0;
  let outOfRange = 0;
  let distinct = 0;
  for (let i = 0; i < sorted.length; i++) {
    if (sorted[i]! < 1 || !Number.isInteger(sorted[i])) outOfRange++;
    else if (i > 0 && sorted[i] === sorted[i - 1]) duplicates++;
    else distinct++;
  }
  const hi = sorted.length ? sorted[sorted.length - 1]! : 0;
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

if (
  process.argv[2] === SQL_LOAD &&
  process.argv[1] &&
  import.meta.url === pathToFileURL(process.argv[1]).href
) {
  sqlLoadProcess(process.argv[3]!).catch((e: Error) => {
    process.send?.({ type: 'error', message: e.message });
    process.exitCode = 1;
  });
}
