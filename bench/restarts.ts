import { randomUUID } from 'node:crypto';
import { connect, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import type { Agent } from 'undici-types';
import {
  type RestartablePostgres,
  restartablePostgres,
  restartablePostgresAvailable,
} from '../test/support/restartable-postgres.js';
import { newAgent, type ServerProcess, startServer } from '../test/support/server-process.js';
import { type BenchContext, fmt, Measurement, runLoad, type Suite, type Table } from './harness.js';

/**
 * `ordo serve` when PostgreSQL restarts, and when thousands of sockets sit on it.
 *
 * (1) 32 HTTP clients take numbers of a gapless sequence with an Idempotency-Key each, sending
 * the same key again after a 503 or a connection error, while PostgreSQL is restarted with
 * `pg_ctl -m immediate` (every process killed, WAL replayed) once per round: answers by status
 * (goal: no 500), the longest request, and how long after the restart the first 200 came. The
 * numbers the clients hold must be exactly 1..n.
 * (2) GET /healthz and POST …/next latency with 2,000 idle sockets and 500 sockets sending a body
 * a byte a second held open on the server (raw `net` sockets, replaced as the server closes them),
 * against the same load without them.
 *
 * Restarts need a PostgreSQL of the suite's own on a fixed port (test/support/restartable-postgres.ts,
 * Debian's PostgreSQL 15 binaries): this suite does not use the run's DATABASE_URL or embedded server.
 */

const CLIENTS = 32;
/** Retry-After (1 s) is honoured up to this, so that the recovery time measures the server, not the wait. */
const RETRY_AFTER_CAP_MS = 100;
/** A request not answered within this counts as hung. */
const REQUEST_TIMEOUT_MS = 30_000;
const IDLE_SOCKETS = 2_000;
const SLOW_SOCKETS = 500;
/** Concurrent requests of the latency loads. */
const LATENCY_WORKERS = 8;

export const restarts: Suite = {
  name: 'restarts',
  async run(ctx) {
    if (!restartablePostgresAvailable()) {
      return [
        {
          title: 'restarts — skipped',
          columns: [{ header: 'why' }],
          rows: [['PostgreSQL binaries not found (apt-get install postgresql-15, or PG_BINDIR)']],
        },
      ];
    }
    ctx.log('restarts starting a restartable PostgreSQL');
    const pgs = await restartablePostgres();
    let serve: ServerProcess | undefined;
    let agent: Agent | undefined;
    try {
      serve = await startServer({ databaseUrl: pgs.url });
      ctx.log(`restarts ordo serve (pid ${serve.pid}) at ${serve.url}, PostgreSQL at port ${pgs.port}`);
      agent = newAgent({ connections: CLIENTS * 2 });
      for (const name of ['restarts', 'sockets']) {
        const r = await fetch(`${serve.url}/v1/sequences/${name}`, {
          method: 'PUT',
          headers: { 'content-type': 'application/json' },
          body: '{}',
          dispatcher: agent,
        } as RequestInit);
        if (r.status !== 200) throw new Error(`PUT /v1/sequences/${name}: ${r.status} ${await r.text()}`);
      }
      const restartTable = await underRestarts(ctx, pgs, serve, agent);
      const socketTable = await underSockets(ctx, serve, agent);
      return [restartTable, socketTable];
    } finally {
      await agent?.close().catch(() => undefined);
      await serve?.stop().catch(() => undefined);
      await pgs.cleanup();
    }
  },
};

// ─── (1) immediate restarts ──────────────────────────────────────────────────────────────

interface Answer {
  /** performance.now() when the answer (or the failure) came. */
  at: number;
  ms: number;
  /** 0: no answer (connection error or timeout). */
  status: number;
}

async function underRestarts(
  ctx: BenchContext,
  pgs: RestartablePostgres,
  serve: ServerProcess,
  agent: Agent,
): Promise<Table> {
  const answers: Answer[] = [];
  const held: number[] = [];
  let withoutRetryAfter = 0;
  let abandoned = 0;
  let firstUnexpected: string | undefined;
  let running = true;

  const client = async () => {
    while (running && !ctx.signal.aborted) {
      const key = randomUUID();
      const giveUpAt = performance.now() + 60_000;
      for (;;) {
        if (performance.now() > giveUpAt || ctx.signal.aborted) {
          abandoned++;
          break;
        }
        const started = performance.now();
        let status: number;
        let body = '';
        let retryAfter: string | null = null;
        try {
          const r = await fetch(`${serve.url}/v1/sequences/restarts/next`, {
            method: 'POST',
            headers: { 'content-type': 'application/json', 'idempotency-key': key },
            body: '{}',
            signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
            dispatcher: agent,
          } as RequestInit);
          status = r.status;
          retryAfter = r.headers.get('retry-after');
          body = await r.text();
        } catch {
          status = 0;
        }
        const now = performance.now();
        answers.push({ at: now, ms: now - started, status });
        if (status === 200) {
          held.push(...(JSON.parse(body) as { values: number[] }).values);
          break;
        }
        if (status === 503) {
          if (retryAfter === null) withoutRetryAfter++;
          await sleep(Math.min(Number(retryAfter ?? 1) * 1000 || 1000, RETRY_AFTER_CAP_MS));
        } else if (status === 0) {
          await sleep(20);
        } else {
          firstUnexpected ??= `${status} ${body.slice(0, 300)}`;
          await sleep(50);
        }
      }
    }
  };

  const rounds = Math.max(1, ctx.rounds);
  const gapMs = Math.max(1_000, (ctx.seconds * 1000) / rounds);
  const restarts: { at: number; ready: number }[] = [];
  const clients = Array.from({ length: CLIENTS }, client);
  try {
    await sleep(Math.max(500, ctx.warmupSeconds * 1000));
    for (let r = 0; r < rounds && !ctx.signal.aborted; r++) {
      const at = performance.now();
      await pgs.restart('immediate');
      restarts.push({ at, ready: performance.now() });
      ctx.log(`restarts immediate restart ${r + 1}/${rounds}`);
      await sleep(gapMs);
    }
  } finally {
    running = false;
    await Promise.all(clients);
  }
  ctx.signal.throwIfAborted();

  // The numbers held against the counter: exactly 1..n, whatever was retried.
  const admin = new pg.Client({ connectionString: pgs.url });
  await admin.connect();
  let committed: number;
  try {
    const { rows } = await admin.query(
      `SELECT coalesce(max(value), 0)::int AS n FROM ordo.counters WHERE sequence = 'restarts'`,
    );
    committed = rows[0].n;
  } finally {
    await admin.end();
  }
  const distinct = new Set(held);
  let missing = 0;
  for (let v = 1; v <= committed; v++) if (!distinct.has(v)) missing++;
  const duplicates = held.length - distinct.size;

  const rows: (string[] | null)[] = [];
  const statusCell = (list: Answer[]) => {
    const by = new Map<number, number>();
    for (const a of list) by.set(a.status, (by.get(a.status) ?? 0) + 1);
    return [...by]
      .sort(([a], [b]) => a - b)
      .map(([s, n]) => `${fmt.int(n)}× ${s === 0 ? 'no answer' : s}`)
      .join(', ');
  };
  const count = (list: Answer[], status: number) => list.filter((a) => a.status === status).length;
  for (let i = 0; i < restarts.length; i++) {
    const { at, ready } = restarts[i]!;
    const end = restarts[i + 1]?.at ?? Infinity;
    const window = answers.filter((a) => a.at >= at && a.at < end);
    // The first 200 after the restart was felt (the first failure after it): a request already
    // answered by the old server before it died does not count as a recovery.
    const firstFailure = window.find((a) => a.status !== 200);
    const firstOk = firstFailure ? window.find((a) => a.status === 200 && a.at > firstFailure.at) : undefined;
    rows.push([
      `immediate restart ${i + 1}`,
      statusCell(window),
      String(count(window, 500)),
      fmt.int(Math.max(0, ...window.map((a) => a.ms))),
      fmt.int(ready - at),
      firstFailure === undefined ? 'not felt' : firstOk ? fmt.int(firstOk.at - at) : 'never',
    ]);
  }
  const total500 = count(answers, 500);
  rows.push(null);
  rows.push([
    'whole run',
    statusCell(answers),
    `${total500} ${total500 === 0 ? '✓' : '✗'}`,
    fmt.int(Math.max(0, ...answers.map((a) => a.ms))),
    '',
    '',
  ]);

  const failures: string[] = [];
  if (total500 > 0) failures.push(`restarts: ${total500} answers 500 (first: ${firstUnexpected})`);
  if (withoutRetryAfter > 0) failures.push(`restarts: ${withoutRetryAfter} answers 503 without Retry-After`);
  if (missing > 0 || duplicates > 0 || held.length !== committed) {
    failures.push(
      `restarts: the numbers held are not exactly 1..${committed}: ${missing} missing, ${duplicates} duplicated, ${held.length} held`,
    );
  }
  if (abandoned > 0) failures.push(`restarts: ${abandoned} calls given up after 60 s of retries`);
  const ok = failures.length === 0;
  return {
    title: `restarts — ${CLIENTS} HTTP clients with Idempotency-Key through ${restarts.length} immediate restarts of PostgreSQL, ${fmt.int(gapMs)} ms apart`,
    columns: [
      { header: 'window' },
      { header: 'answers by status' },
      { header: '500s (goal 0)', align: 'right' },
      { header: 'longest ms', align: 'right' },
      { header: 'pg_ctl restart ms', align: 'right' },
      { header: 'restart → first 200 ms', align: 'right' },
    ],
    rows,
    failures,
    notes: [
      `ordo serve (a child process, default settings) against a PostgreSQL 15 of this suite's own (fsync off,`,
      '  synchronous_commit on), restarted with `pg_ctl -m immediate restart -w`: every backend is killed at once,',
      '  as in a crash, and the start replays the WAL. A window runs from one restart to the next.',
      `Each client: POST /v1/sequences/restarts/next (gapless) with a fresh Idempotency-Key per number; after a 503 the`,
      `  same key again once Retry-After has passed (capped at ${RETRY_AFTER_CAP_MS} ms), after a connection error after 20 ms.`,
      '  "no answer" counts requests that failed without an HTTP answer (or took over 30 s).',
      'restart → first 200: from `pg_ctl restart` issued to the first 200 answered after the first failure it caused.',
      '  pg_ctl restart ms: until `pg_ctl -w` returned and a session worked; pg_ctl polls, so it may end after the first 200.',
      `verified: ${ok ? '✓' : '✗'} ${fmt.int(held.length)} numbers held, ${fmt.int(committed)} committed (ordo.counters): ${missing} missing, ${duplicates} duplicated; ${withoutRetryAfter} 503s without Retry-After.`,
    ],
  };
}

// ─── (2) idle and slow sockets ───────────────────────────────────────────────────────────

/** Raw sockets kept open on the server: replaced as soon as the server closes one. */
class SocketCrowd {
  private readonly open = new Set<Socket>();
  private stopped = false;
  private drip: NodeJS.Timeout | undefined;
  /** Sockets the server closed (and that were replaced), and what it answered on them. */
  closedByServer = 0;
  readonly answers = new Map<string, number>();

  constructor(
    private readonly port: number,
    private readonly idle: number,
    private readonly slow: number,
  ) {}

  get size(): number {
    return this.open.size;
  }

  /** Opens every socket, 100 at a time (the listen backlog is finite), and starts the drip. */
  async fill(): Promise<void> {
    const kinds = [
      ...Array.from({ length: this.idle }, () => 'idle' as const),
      ...Array.from({ length: this.slow }, () => 'slow' as const),
    ];
    for (let i = 0; i < kinds.length; i += 100) {
      await Promise.all(kinds.slice(i, i + 100).map((k) => this.add(k)));
    }
    // A slow body: one more byte every second, never the whole body.
    this.drip = setInterval(() => {
      for (const s of this.open) if ((s as Socket & { slow?: boolean }).slow) s.write(' ');
    }, 1_000);
  }

  async close(): Promise<void> {
    this.stopped = true;
    clearInterval(this.drip);
    for (const s of this.open) s.destroy();
    this.open.clear();
  }

  private add(kind: 'idle' | 'slow'): Promise<void> {
    return new Promise((resolve) => {
      const socket = connect(this.port, '127.0.0.1') as Socket & { slow?: boolean };
      socket.slow = kind === 'slow';
      let received = '';
      socket.on('data', (chunk) => {
        if (received.length < 200) received += chunk.toString();
      });
      socket.on('error', () => undefined);
      socket.once('connect', () => {
        this.open.add(socket);
        if (kind === 'slow') {
          socket.write(
            'POST /v1/sequences/sockets/next HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{',
          );
        }
        resolve();
      });
      socket.once('close', () => {
        resolve();
        if (!this.open.delete(socket) || this.stopped) return;
        this.closedByServer++;
        const status = /^HTTP\/1\.1 (\d+)/.exec(received)?.[1] ?? 'closed without an answer';
        const label = `${kind}: ${status}`;
        this.answers.set(label, (this.answers.get(label) ?? 0) + 1);
        void this.add(kind);
      });
    });
  }
}

interface LatencyRow {
  label: string;
  load: ReturnType<Measurement['result']>;
  failed: Map<string, number>;
}

async function underSockets(ctx: BenchContext, serve: ServerProcess, agent: Agent): Promise<Table> {
  const latency = async (label: string, path: string, method: 'GET' | 'POST'): Promise<LatencyRow> => {
    const failed = new Map<string, number>();
    const measurement = await runLoad(
      {
        workers: LATENCY_WORKERS,
        seconds: ctx.seconds,
        warmupSeconds: ctx.warmupSeconds,
        signal: ctx.signal,
        op: async () => {
          let outcome: string;
          try {
            const r = await fetch(`${serve.url}${path}`, {
              method,
              ...(method === 'POST' ? { headers: { 'content-type': 'application/json' }, body: '{}' } : {}),
              signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
              dispatcher: agent,
            } as RequestInit);
            await r.arrayBuffer();
            outcome = String(r.status);
          } catch (e) {
            outcome = (e as Error).name;
          }
          if (outcome !== '200') failed.set(outcome, (failed.get(outcome) ?? 0) + 1);
        },
      },
      new Measurement(),
    );
    ctx.log(`restarts ${label}: p99 ${fmt.ms(measurement.result().p99Ms)} ms`);
    return { label, load: measurement.result(), failed };
  };

  const scenarios = [
    ['GET /healthz', '/healthz', 'GET'],
    ['POST /v1/sequences/sockets/next', '/v1/sequences/sockets/next', 'POST'],
  ] as const;
  const baseline: LatencyRow[] = [];
  for (const [label, path, method] of scenarios) baseline.push(await latency(label, path, method));

  const crowd = new SocketCrowd(serve.port, IDLE_SOCKETS, SLOW_SOCKETS);
  const crowded: LatencyRow[] = [];
  let openDuring = 0;
  try {
    ctx.log(`restarts opening ${IDLE_SOCKETS} idle and ${SLOW_SOCKETS} slow sockets`);
    await crowd.fill();
    for (const [label, path, method] of scenarios) {
      crowded.push(await latency(label, path, method));
      openDuring = Math.max(openDuring, crowd.size);
    }
  } finally {
    await crowd.close();
  }

  const failures: string[] = [];
  const cell = (r: LatencyRow, sockets: string, base?: LatencyRow) => {
    const failed = [...r.failed].map(([k, n]) => `${fmt.int(n)}× ${k}`).join(', ') || '0';
    if (r.failed.size > 0) failures.push(`${r.label} with ${sockets}: ${failed}`);
    return [
      r.label,
      sockets,
      fmt.int(r.load.opsPerSecond),
      fmt.ms(r.load.p50Ms),
      fmt.ms(r.load.p99Ms),
      fmt.ms(r.load.maxMs),
      base ? `${fmt.fixed(r.load.p99Ms / base.load.p99Ms, 2)}×` : '1.00×',
      failed,
    ];
  };
  const churn = [...crowd.answers].map(([k, n]) => `${fmt.int(n)}× ${k}`).join(', ') || 'none';
  return {
    title: `restarts — latency with ${fmt.int(IDLE_SOCKETS)} idle and ${SLOW_SOCKETS} slow-body sockets open on \`ordo serve\`; ${LATENCY_WORKERS} concurrent requests, ${ctx.seconds} s each after ${ctx.warmupSeconds} s warm-up`,
    columns: [
      { header: 'request' },
      { header: 'other sockets' },
      { header: 'req/s', align: 'right' },
      { header: 'p50 ms', align: 'right' },
      { header: 'p99 ms', align: 'right' },
      { header: 'max ms', align: 'right' },
      { header: 'p99 vs none', align: 'right' },
      { header: 'not 200', align: 'right' },
    ],
    rows: [
      ...baseline.map((r) => cell(r, 'none')),
      null,
      ...crowded.map((r, i) => cell(r, `${fmt.int(IDLE_SOCKETS)} idle + ${SLOW_SOCKETS} slow`, baseline[i])),
    ],
    failures,
    notes: [
      `Idle: connected, nothing sent. Slow: a POST whose headers announce a 1,000-byte body, of which one byte comes`,
      '  every second. Each is replaced as soon as the server closes it, so that the crowd stays whole while measured.',
      `  Most sockets open at once: ${fmt.int(openDuring)}. Closed by the server meanwhile: ${fmt.int(crowd.closedByServer)} (${churn}).`,
      `The load: ${LATENCY_WORKERS} loops in this process (Node fetch, keep-alive), one request in flight each; POST next takes`,
      '  a number of a gapless sequence (no key: concurrent calls share a statement).',
    ],
  };
}
