import { spawn } from 'node:child_process';
import { createHistogram, performance, type RecordableHistogram } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { createOrdo, type Ordo, type OutboxMessage, type Subscription } from '../src/index.js';
import {
  type BenchContext,
  fmt,
  forgottenSession,
  interleave,
  type LoadResult,
  openPool,
  ratioCell,
  type Suite,
  type Table,
  type Verified,
} from './harness.js';

/**
 * The transactional outbox. (a) appends in the business transaction against the same rows
 * INSERTed into a plain table with a BIGSERIAL position; (b) a consumer draining a prefilled
 * topic; (c) commit-to-handler latency at a steady rate, woken by NOTIFY only; (d) writers
 * committing out of order, read at once by ordo and by the naive `position > last` cursor.
 * Every scenario checks what it stored or received (see the notes of each table).
 */

const WORKERS = 16;
const PER_TXN = [1, 10] as const;
const PREFILL = 200_000;
const PREFILL_CHUNK = 10_000;
const CONSUME_BATCHES = [1000, 100] as const;
const CONSUME_RUNS = 2;
const RATE = 1000;
const RATE_CONNECTIONS = 8;
const PAIRS = 3;
const CHAOS_WRITERS = 8;
const GOAL = { appendRatio: 0.9, consume: 150_000, consumeBatch: 1000, p99Ms: 50 };
const APP = 'ordo-bench';
/** The (a) payload; bench/instructions.ts appends it too. */
export const PAYLOAD = {
  orderId: 'ord_7f3a9c2e',
  customer: 'ACME Corporation',
  lines: 3,
  amount: '1234.50',
  currency: 'EUR',
};

/** The plain table (a) compares with, and bench/instructions.ts and bench/pgbench.ts too. */
export const PLAIN_DDL = `
  CREATE TABLE bench_plain_outbox (
    position    bigserial PRIMARY KEY,
    topic       text NOT NULL,
    type        text NOT NULL,
    key         text,
    message_id  text,
    data        jsonb NOT NULL,
    headers     jsonb NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now());
  CREATE INDEX bench_plain_outbox_order ON bench_plain_outbox (topic, position);
  CREATE UNIQUE INDEX bench_plain_outbox_message_id ON bench_plain_outbox (topic, message_id)
    WHERE message_id IS NOT NULL;`;
/** (a)'s plain append: $1 the topic, $2 the types, $3 the keys, $4 the data (as JSON texts). */
export const PLAIN_APPEND = `INSERT INTO bench_plain_outbox (topic, type, key, data)
  SELECT $1, t.type, t.key, t.data FROM unnest($2::text[], $3::text[], $4::jsonb[]) AS t (type, key, data)
  RETURNING position`;

interface Ref {
  transactionId: string;
  position: number;
}

/** Messages of one transaction must come in append (position) order; none twice. */
class OrderCheck {
  count = 0;
  disorder = 0;
  private readonly last = new Map<string, number>();

  add(m: Ref): void {
    this.count++;
    if ((this.last.get(m.transactionId) ?? 0) >= m.position) this.disorder++;
    this.last.set(m.transactionId, m.position);
  }
}

const random = (min: number, max: number) => min + Math.floor(Math.random() * (max - min + 1));
const ms = (h: RecordableHistogram, p: number) => (h.count === 0 ? 0 : h.percentile(p) / 1e6);

/** A pool of ordo-bench connections and an ordo on it (its LISTEN connection included). */
async function ordoOn(ctx: BenchContext, max: number, role: string): Promise<{ ordo: Ordo; pool: pg.Pool }> {
  const pool = await openPool(ctx.url, max, `${APP}-${role}`);
  return { ordo: await createOrdo({ pool }), pool };
}

async function connect(url: string, role: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url, application_name: `${APP}-${role}` });
  client.on('error', () => undefined);
  await client.connect();
  return client;
}

/** Waits until `sub` has passed every message committed so far; false after `timeoutMs`. */
async function drained(sub: Subscription, timeoutMs: number, signal: AbortSignal): Promise<boolean> {
  const until = performance.now() + timeoutMs;
  while (performance.now() < until) {
    signal.throwIfAborted();
    if ((await sub.lag()).messagesBehind === 0) return true;
    await sleep(20);
  }
  return false;
}

// ─── other sessions on the server ──────────────────────────────────────────────────────────

interface Others {
  open: number;
  withXid: number;
  oldestSeconds: number;
  prepared: number;
  /** Who holds them: database · application_name of the sessions holding an xid. */
  holders: string[];
  /** How long the oldest of those has been open. */
  xidHeldMs: number;
}

/**
 * Transactions of other sessions, anywhere on the server: a consumer reads only what every
 * running transaction (a session's with an xid, or a prepared one) cannot precede, so these
 * hold every outbox consumer of the cluster back.
 */
async function others(admin: pg.Pool): Promise<Others> {
  const { rows } = await admin.query(
    `SELECT count(*)::int AS open, count(*) FILTER (WHERE backend_xid IS NOT NULL)::int AS with_xid,
            coalesce(extract(epoch FROM max(clock_timestamp() - xact_start)), 0)::float8 AS oldest,
            (SELECT count(*)::int FROM pg_prepared_xacts) AS prepared,
            coalesce(array_agg(DISTINCT datname || ' · ' || coalesce(nullif(application_name, ''), '(no name)'))
                     FILTER (WHERE backend_xid IS NOT NULL), '{}') AS holders,
            coalesce(extract(epoch FROM max(clock_timestamp() - xact_start) FILTER (WHERE backend_xid IS NOT NULL)), 0)
              ::float8 * 1000 AS xid_held_ms
       FROM pg_stat_activity
      WHERE xact_start IS NOT NULL AND pid <> pg_backend_pid() AND backend_type = 'client backend'
        AND coalesce(application_name, '') NOT LIKE $1`,
    [`${APP}%`],
  );
  const r = rows[0];
  return {
    open: r.open,
    withXid: r.with_xid,
    oldestSeconds: r.oldest,
    prepared: r.prepared,
    holders: r.holders,
    xidHeldMs: r.xid_held_ms,
  };
}

function describeOthers(when: string, o: Others): string {
  if (o.open === 0 && o.prepared === 0) return `${when}: no other session had a transaction open.`;
  return (
    `${when}: ${o.open} other session${o.open === 1 ? '' : 's'} with a transaction open (${o.withXid} holding an xid, ` +
    `the oldest open for ${fmt.fixed(o.oldestSeconds)} s), ${o.prepared} prepared transaction${o.prepared === 1 ? '' : 's'}` +
    `${o.holders.length ? `; held by ${o.holders.join(', ')}` : ''}.`
  );
}

/** Samples, while a scenario runs, the transactions of other sessions that hold consumers back. */
class Watch {
  samples = 0;
  held = 0;
  private readonly holders = new Set<string>();
  private longestMs = 0;
  private timer: NodeJS.Timeout | undefined;
  private busy = false;

  constructor(private readonly admin: pg.Pool) {}

  start(): this {
    this.timer = setInterval(() => {
      if (this.busy) return;
      this.busy = true;
      others(this.admin)
        .then((o) => {
          this.samples++;
          if (o.withXid > 0 || o.prepared > 0) this.held++;
          for (const h of o.holders) this.holders.add(h);
          this.longestMs = Math.max(this.longestMs, o.xidHeldMs);
        })
        .catch(() => undefined)
        .finally(() => {
          this.busy = false;
        });
    }, 100);
    return this;
  }

  stop(): string {
    clearInterval(this.timer);
    if (this.samples === 0) return 'not sampled';
    if (this.held === 0) return 'none';
    const who = [...this.holders];
    const names = who.slice(0, 3).join(', ') + (who.length > 3 ? `, … (${who.length})` : '');
    return (
      `in ${fmt.int((100 * this.held) / this.samples)}% of ${this.samples} samples, one open for up to ` +
      `${fmt.int(this.longestMs)} ms (${names})`
    );
  }
}

// ─── (a) append throughput ───────────────────────────────────────────────────────────────

interface AppendRow {
  label: string;
  perTxn: number;
  load: LoadResult;
  verified: Verified;
}

function messages(n: number) {
  return Array.from({ length: n }, () => ({
    type: 'OrderPlaced',
    key: `order-${random(1, 1_000_000)}`,
    data: PAYLOAD,
  }));
}

async function appendThroughput(ctx: BenchContext, admin: pg.Pool, ordo: Ordo): Promise<Table> {
  const pool = await openPool(ctx.url, WORKERS, `${APP}-append`);
  const clients = await Promise.all(Array.from({ length: WORKERS }, () => pool.connect()));
  for (const c of clients) c.on('error', () => undefined);
  const rows: (AppendRow | null)[] = [];
  const goals: string[][] = [];
  const inTransaction = async (client: pg.PoolClient, work: () => Promise<unknown>) => {
    await client.query('BEGIN');
    try {
      await work();
      await client.query('COMMIT');
    } catch (e) {
      await client.query('ROLLBACK').catch(() => undefined);
      throw e;
    }
  };
  try {
    for (const n of PER_TXN) {
      await admin.query('TRUNCATE ordo.messages, bench_plain_outbox');
      await admin.query('CHECKPOINT').catch(() => undefined);
      const topic = `bench-append-${n}`;
      const measured = await interleave(
        {
          ordo: {
            workers: WORKERS,
            op: (w) =>
              inTransaction(clients[w]!, () => ordo.outbox.append(topic, messages(n), { tx: clients[w] })),
          },
          plain: {
            workers: WORKERS,
            op: (w) =>
              inTransaction(clients[w]!, () => {
                const batch = messages(n);
                return clients[w]!.query(PLAIN_APPEND, [
                  topic,
                  batch.map((m) => m.type),
                  batch.map((m) => m.key),
                  batch.map((m) => JSON.stringify(m.data)),
                ]);
              }),
          },
        },
        ctx,
      );
      const stored = async (table: string) =>
        Number((await admin.query(`SELECT count(*) AS n FROM ${table} WHERE topic = $1`, [topic])).rows[0].n);
      const check = (count: number, total: number): Verified => {
        const ok = count === total * n && count > 0;
        return {
          ok,
          text: ok
            ? `✓ ${fmt.int(count)} rows = ${fmt.int(total)} txns × ${n}`
            : `✗ ${fmt.int(count)} rows, ${fmt.int(total * n)} appended`,
        };
      };
      const o = measured.ordo.result();
      const p = measured.plain.result();
      const ordoRow = {
        label: '(a) ordo append({ tx })',
        perTxn: n,
        load: o,
        verified: check(await stored('ordo.messages'), o.total),
      };
      const plainRow = {
        label: '(a) INSERT, BIGSERIAL table',
        perTxn: n,
        load: p,
        verified: check(await stored('bench_plain_outbox'), p.total),
      };
      for (const r of [ordoRow, plainRow]) {
        ctx.log(
          `outbox  ${r.label} × ${n}: ${fmt.int(r.load.opsPerSecond)} txn/s, p99 ${fmt.ms(r.load.p99Ms)} ms, ${r.verified.text}`,
        );
      }
      rows.push(ordoRow, plainRow, null);
      goals.push([
        `goal ordo ≥ ${GOAL.appendRatio} × INSERT`,
        String(n),
        '',
        '',
        '',
        '',
        '',
        ratioCell(o.opsPerSecond / p.opsPerSecond, GOAL.appendRatio),
      ]);
    }
  } finally {
    for (const c of clients) c.release();
    await pool.end();
  }
  return {
    title: `outbox (a) append throughput — ${ctx.seconds} s per scenario in ${ctx.rounds} alternating rounds, after ${ctx.warmupSeconds} s warm-up; ${WORKERS} workers, a connection each`,
    columns: [
      { header: 'scenario' },
      { header: 'msgs/txn', align: 'right' },
      { header: 'txn/s', align: 'right' },
      { header: 'msgs/s', align: 'right' },
      { header: 'p50 ms', align: 'right' },
      { header: 'p99 ms', align: 'right' },
      { header: 'verified' },
      { header: 'ratio' },
    ],
    rows: [
      ...rows.map((r) =>
        r
          ? [
              r.label,
              String(r.perTxn),
              fmt.int(r.load.opsPerSecond),
              fmt.int(r.load.opsPerSecond * r.perTxn),
              fmt.ms(r.load.p50Ms),
              fmt.ms(r.load.p99Ms),
              r.verified.text,
              '',
            ]
          : null,
      ),
      ...goals,
    ],
    failures: rows
      .filter((r): r is AppendRow => r !== null && !r.verified.ok)
      .map((r) => `${r.label} × ${r.perTxn}: ${r.verified.text}`),
    notes: [
      'one op = BEGIN; append 1 or 10 messages (type, key, the same jsonb payload) in one statement; COMMIT.',
      '  ordo: ordo.outbox.append(topic, messages, { tx }) = SELECT ordo.append_answer(…) (the transaction id kept per row,',
      '  the primary key (topic, transaction_id, position) and an index (topic, position), a shared advisory lock marking the',
      '  open appender, NOTIFY from one open transaction per topic at a time).',
      '  INSERT: INSERT … SELECT FROM unnest(…) RETURNING position into a table with the same columns but transaction_id,',
      '  a BIGSERIAL position and indexes (position), (topic, position), unique (topic, message_id) WHERE message_id IS NOT NULL.',
      'verified: the rows stored = transactions committed (warm-up included) × messages per transaction.',
    ],
  };
}

// ─── (b) consumer throughput ─────────────────────────────────────────────────────────────

interface ConsumeRow {
  batchSize: number;
  messages: number;
  seconds: number;
  calls: number;
  verified: Verified;
}

async function prefill(admin: pg.Pool, topic: string): Promise<void> {
  for (let done = 0; done < PREFILL; done += PREFILL_CHUNK) {
    const n = Math.min(PREFILL_CHUNK, PREFILL - done);
    await admin.query(
      `SELECT count(*) FROM ordo.append_many($1,
         array_fill('OrderPlaced'::text, ARRAY[$2::int]),
         ARRAY(SELECT $3::jsonb || jsonb_build_object('n', $4::int + i) FROM generate_series(1, $2::int) AS i),
         ARRAY(SELECT 'order-' || ($4::int + i) FROM generate_series(1, $2::int) AS i),
         array_fill(NULL::text, ARRAY[$2::int]),
         array_fill('{}'::jsonb, ARRAY[$2::int]))`,
      [topic, n, JSON.stringify(PAYLOAD), done],
    );
  }
  await admin.query('VACUUM ANALYZE ordo.messages');
  // The writes of (a) and of the prefill are flushed now, not by a checkpoint during the drain.
  await admin.query('CHECKPOINT').catch(() => undefined);
}

async function consumerThroughput(ctx: BenchContext, admin: pg.Pool): Promise<Table> {
  const topic = 'bench-consume';
  await admin.query('TRUNCATE ordo.messages');
  ctx.log(`outbox  (b) prefilling ${fmt.int(PREFILL)} messages`);
  await prefill(admin, topic);
  const { ordo, pool } = await ordoOn(ctx, 4, 'consumer');
  const watch = new Watch(admin).start();
  const runs = new Map<number, ConsumeRow>(
    CONSUME_BATCHES.map((b) => [
      b,
      { batchSize: b, messages: 0, seconds: 0, calls: 0, verified: { ok: true, text: '' } },
    ]),
  );
  const problems = new Map<number, string[]>();
  try {
    for (let run = 0; run < CONSUME_RUNS; run++) {
      // Alternate which batch size goes first.
      const order = run % 2 === 0 ? [...CONSUME_BATCHES] : [...CONSUME_BATCHES].reverse();
      for (const batchSize of order) {
        ctx.signal.throwIfAborted();
        const check = new OrderCheck();
        let calls = 0;
        let finish!: () => void;
        const finished = new Promise<void>((resolve) => {
          finish = resolve;
        });
        const started = performance.now();
        const sub = await ordo.outbox.subscribe({
          name: `bench-consume-${batchSize}-${run}`,
          topic,
          batchSize,
          pollInterval: '10s',
          handler: (batch: OutboxMessage[]) => {
            calls++;
            for (const m of batch) check.add(m);
            if (check.count >= PREFILL) finish();
          },
        });
        const timedOut = await Promise.race([
          finished.then(() => false),
          sleep(120_000, true, { signal: ctx.signal, ref: false }),
        ]);
        const seconds = (performance.now() - started) / 1000;
        // The last batch's checkpoint commits after its handler returned.
        let lag = await sub.lag();
        for (let waited = 0; lag.delivered < check.count && waited < 5_000; waited += 10) {
          await sleep(10);
          lag = await sub.lag();
        }
        await sub.stop();
        const row = runs.get(batchSize)!;
        row.messages += check.count;
        row.seconds += seconds;
        row.calls += calls;
        const wrong = [
          timedOut && `run ${run}: ${fmt.int(check.count)} of ${fmt.int(PREFILL)} within 120 s`,
          check.count !== PREFILL && `run ${run}: ${fmt.int(check.count)} delivered`,
          check.disorder > 0 && `run ${run}: ${check.disorder} out of order`,
          lag.delivered !== PREFILL && `run ${run}: ${fmt.int(lag.delivered)} checkpointed`,
        ].filter((x): x is string => typeof x === 'string');
        problems.set(batchSize, [...(problems.get(batchSize) ?? []), ...wrong]);
        ctx.log(`outbox  (b) batch ${batchSize}: ${fmt.int(check.count / seconds)} msgs/s`);
      }
    }
  } finally {
    await ordo.close();
    await pool.end();
  }
  const held = watch.stop();
  const rows = [...runs.values()].map((r) => {
    const wrong = problems.get(r.batchSize) ?? [];
    r.verified =
      wrong.length === 0
        ? { ok: true, text: `✓ ${CONSUME_RUNS} × ${fmt.int(PREFILL)}, once each, in order` }
        : { ok: false, text: `✗ ${wrong.join('; ')}` };
    return r;
  });
  return {
    title: `outbox (b) consumer throughput — ${fmt.int(PREFILL)} messages prefilled, drained ${CONSUME_RUNS} times per batch size (a new subscription each time), alternating`,
    columns: [
      { header: 'scenario' },
      { header: 'batchSize', align: 'right' },
      { header: 'msgs/s', align: 'right' },
      { header: 'ms/batch', align: 'right' },
      { header: 'verified' },
      { header: 'goal' },
    ],
    rows: rows.map((r) => {
      const rate = r.messages / r.seconds;
      return [
        '(b) subscribe, no-op handler',
        String(r.batchSize),
        fmt.int(rate),
        fmt.ms((r.seconds * 1000) / Math.max(1, r.calls)),
        r.verified.text,
        r.batchSize === GOAL.consumeBatch
          ? `≥ ${fmt.int(GOAL.consume)}/s: ${ratioCell(rate / GOAL.consume, 1)}`
          : '',
      ];
    }),
    failures: rows.filter((r) => !r.verified.ok).map((r) => `(b) batch ${r.batchSize}: ${r.verified.text}`),
    notes: [
      `prefill: ${PREFILL / PREFILL_CHUNK} transactions of ${fmt.int(PREFILL_CHUNK)} messages (ordo.append_many, the (a) payload + a number), then VACUUM ANALYZE and CHECKPOINT.`,
      "one batch = receive(…, batchSize); the handler; ack() (in the handler's transaction, begun by its first statement: none here), on a pool of 4; the time runs from",
      '  subscribe() to the handler receiving the last message (after its checkpoint and commit the subscription is stopped).',
      `verified: every message once, each transaction's in append order, and the subscription's delivered count = ${fmt.int(PREFILL)}.`,
      `other sessions' transactions holding an xid while (b) ran: ${held}.`,
    ],
  };
}

// ─── (c) commit-to-handler latency ───────────────────────────────────────────────────────

interface LatencyRow {
  label: string;
  rate: string;
  histogram: RecordableHistogram;
  late: number;
  verified: Verified;
  /** Other sessions' transactions seen while it ran. */
  held?: string;
}

/**
 * RATE messages/s, each appended in its own transaction, paced by the clock over
 * RATE_CONNECTIONS connections; a subscription woken by NOTIFY alone (pollInterval 10 s)
 * records, per message, handler time − time just before its COMMIT was sent.
 */
async function steadyLatency(
  ctx: BenchContext,
  admin: pg.Pool,
  ordo: Ordo,
  idle: boolean,
): Promise<LatencyRow> {
  const topic = idle ? 'bench-latency-idle' : 'bench-latency';
  // Open for the whole run.
  const forgotten = idle ? await forgottenSession(ctx.url, `${APP}-forgotten-psql`) : undefined;
  const consumer = await ordoOn(ctx, 4, 'latency-consumer');
  const producers = await Promise.all(
    Array.from({ length: RATE_CONNECTIONS }, (_, i) => connect(ctx.url, `latency-${i}`)),
  );
  const sentAt = new Map<number, { at: number; measured: boolean }>();
  const histogram = createHistogram();
  const seen = new Map<number, number>();
  const check = new OrderCheck();
  let late = 0;
  const warmupSlots = Math.round(ctx.warmupSeconds * RATE);
  const total = warmupSlots + Math.round(ctx.seconds * RATE);
  const watch = new Watch(admin).start();
  try {
    const sub = await consumer.ordo.outbox.subscribe({
      name: topic,
      topic,
      pollInterval: '10s',
      handler: (batch: OutboxMessage[]) => {
        const now = performance.now();
        for (const m of batch) {
          check.add(m);
          seen.set(m.position, (seen.get(m.position) ?? 0) + 1);
          const sent = sentAt.get(m.position);
          if (!sent?.measured) continue;
          const latency = now - sent.at;
          if (latency > 100) late++;
          histogram.record(Math.max(1, Math.round(latency * 1e6)));
        }
      },
    });
    // The listener connects in the background: let it, and the consumer, settle first.
    await ordo.outbox.append(topic, { type: 'Warm', data: {} });
    await sleep(500);
    seen.clear();
    const t0 = performance.now() + 50;
    let firstLate = 0;
    await Promise.all(
      producers.map(async (client, k) => {
        for (let slot = k; slot < total; slot += RATE_CONNECTIONS) {
          ctx.signal.throwIfAborted();
          const due = t0 + (slot * 1000) / RATE;
          const wait = due - performance.now();
          if (wait >= 1) await sleep(wait);
          else if (wait < -5) firstLate++;
          await client.query('BEGIN');
          const [appended] = await ordo.outbox.append(
            topic,
            { type: 'Tick', data: { slot } },
            { tx: client },
          );
          sentAt.set(appended!.position!, { at: performance.now(), measured: slot >= warmupSlots });
          await client.query('COMMIT');
        }
      }),
    );
    const produced = performance.now() - t0;
    const caughtUp = await drained(sub, 15_000, ctx.signal);
    await sub.stop();
    const duplicates = [...seen.values()].filter((n) => n > 1).length;
    const missing = [...sentAt.keys()].filter((p) => !seen.has(p)).length;
    const ok = caughtUp && duplicates === 0 && missing === 0 && check.disorder === 0;
    const behind = firstLate > total / 100 ? ` (${fmt.int(firstLate)} sent > 5 ms late)` : '';
    return {
      held: watch.stop(),
      label: `(c) ${RATE_CONNECTIONS} connections, paced${idle ? ', a session idle in transaction' : ''}`,
      rate: `${fmt.int((total * 1000) / produced)}/s${behind}`,
      histogram,
      late,
      verified: {
        ok,
        text: ok
          ? `✓ ${fmt.int(sentAt.size)} once each, in order`
          : `✗ ${[!caughtUp && 'not drained in 15 s', missing && `${missing} missing`, duplicates && `${duplicates} dup`, check.disorder && `${check.disorder} out of order`].filter(Boolean).join(', ')}`,
      },
    };
  } finally {
    watch.stop();
    await forgotten?.end();
    await Promise.all(producers.map((c) => c.end()));
    await consumer.ordo.close();
    await consumer.pool.end();
  }
}

/**
 * The wake-up a message can miss: transactions A and B append to the same topic, A (which
 * took the per-topic advisory lock, so it sends the NOTIFY and B does not) commits, and B
 * commits 50 ms later. PAIRS such pairs, one after the other, read by a subscription with
 * pollInterval 1 s.
 */
async function pairLatency(ctx: BenchContext, ordo: Ordo): Promise<LatencyRow> {
  const topic = 'bench-pairs';
  const consumer = await ordoOn(ctx, 4, 'pairs-consumer');
  const histogram = createHistogram();
  const firsts = createHistogram();
  const [a, b] = await Promise.all([connect(ctx.url, 'pairs-a'), connect(ctx.url, 'pairs-b')]);
  const received = new Map<string, number>();
  let sub: Subscription | undefined;
  try {
    sub = await consumer.ordo.outbox.subscribe({
      name: 'bench-pairs',
      topic,
      pollInterval: '1s',
      handler: (batch: OutboxMessage[]) => {
        for (const m of batch) received.set((m.data as { id: string }).id, performance.now());
      },
    });
    await ordo.outbox.append(topic, { type: 'Warm', data: { id: 'warm' } });
    for (let waited = 0; !received.has('warm') && waited < 5_000; waited += 5) await sleep(5);
    for (let pair = 0; pair < PAIRS; pair++) {
      ctx.signal.throwIfAborted();
      await a.query('BEGIN');
      await b.query('BEGIN');
      await ordo.outbox.append(topic, { type: 'A', data: { id: `a${pair}` } }, { tx: a });
      await ordo.outbox.append(topic, { type: 'B', data: { id: `b${pair}` } }, { tx: b });
      const aAt = performance.now();
      await a.query('COMMIT');
      await sleep(50);
      const bAt = performance.now();
      await b.query('COMMIT');
      for (let waited = 0; !received.has(`b${pair}`) && waited < 5_000; waited += 2) await sleep(2);
      const at = (id: string) => received.get(id);
      if (at(`a${pair}`)) firsts.record(Math.max(1, Math.round((at(`a${pair}`)! - aAt) * 1e6)));
      if (at(`b${pair}`)) histogram.record(Math.max(1, Math.round((at(`b${pair}`)! - bAt) * 1e6)));
    }
  } finally {
    await sub?.stop();
    await Promise.all([a.end(), b.end()]);
    await consumer.ordo.close();
    await consumer.pool.end();
  }
  const ok = histogram.count === PAIRS && firsts.count === PAIRS;
  return {
    label: "(c) overlapping pair: B's message",
    rate: `${PAIRS} pairs`,
    histogram,
    late: 0,
    verified: {
      ok,
      text: ok
        ? `✓ ${PAIRS * 2} delivered; A's: max ${fmt.ms(firsts.max / 1e6)} ms`
        : `✗ ${firsts.count} A and ${histogram.count} B of ${PAIRS} each delivered within 5 s`,
    },
  };
}

async function latency(ctx: BenchContext, admin: pg.Pool, ordo: Ordo): Promise<Table> {
  const steady = await steadyLatency(ctx, admin, ordo, false);
  ctx.log(
    `outbox  (c) steady: p99 ${fmt.ms(ms(steady.histogram, 99))} ms, max ${fmt.ms(steady.histogram.max / 1e6)} ms`,
  );
  const idle = await steadyLatency(ctx, admin, ordo, true);
  ctx.log(`outbox  (c) steady, idle session open: p99 ${fmt.ms(ms(idle.histogram, 99))} ms`);
  const pairs = await pairLatency(ctx, ordo);
  ctx.log(`outbox  (c) overlapping pairs: B's message p50 ${fmt.ms(ms(pairs.histogram, 50))} ms`);
  const row = (r: LatencyRow, lateCell: string): string[] => [
    r.label,
    r.rate,
    fmt.int(r.histogram.count),
    fmt.ms(ms(r.histogram, 50)),
    fmt.ms(ms(r.histogram, 99)),
    fmt.ms(ms(r.histogram, 99.9)),
    fmt.ms(r.histogram.count === 0 ? 0 : r.histogram.max / 1e6),
    lateCell,
    r.verified.text,
  ];
  const p99 = Math.max(ms(steady.histogram, 99), ms(idle.histogram, 99));
  return {
    title: `outbox (c) commit-to-handler latency — NOTIFY wake-up (pollInterval 10 s); ${ctx.seconds} s at ${fmt.int(RATE)} messages/s after ${ctx.warmupSeconds} s warm-up`,
    columns: [
      { header: 'scenario' },
      { header: 'rate', align: 'right' },
      { header: 'measured', align: 'right' },
      { header: 'p50 ms', align: 'right' },
      { header: 'p99 ms', align: 'right' },
      { header: 'p99.9 ms', align: 'right' },
      { header: 'max ms', align: 'right' },
      { header: '> 100 ms', align: 'right' },
      { header: 'verified' },
    ],
    rows: [
      row(steady, fmt.int(steady.late)),
      row(idle, fmt.int(idle.late)),
      row(pairs, ''),
      null,
      [
        `goal p99 ≤ ${GOAL.p99Ms} ms (both steady runs)`,
        '',
        '',
        '',
        `${fmt.ms(p99)} ${p99 <= GOAL.p99Ms ? '✓' : '✗'}`,
        '',
        '',
        '',
        '',
      ],
    ],
    failures: [steady, idle, pairs]
      .filter((r) => !r.verified.ok)
      .map((r) => `${r.label}: ${r.verified.text}`),
    notes: [
      `steady: slot i is due at start + i ms; ${RATE_CONNECTIONS} connections take the slots in turn, each BEGIN; append one message; COMMIT.`,
      '  latency = the handler receiving the message − the moment just before its COMMIT was sent (batchSize 100).',
      '  The consumer (pool of 4 + its LISTEN connection) reads only on a notification: pollInterval 10 s.',
      'overlapping pair: A and B each append one message to one topic; A took the per-topic advisory lock, so A sends the',
      `  NOTIFY and B does not; A commits, B commits 50 ms later. ${PAIRS} pairs in turn, pollInterval 1 s; latency of B's message.`,
      'the second steady run has a session idle in a transaction that holds an id (BEGIN; SELECT pg_current_xact_id())',
      '  open from before the first message to after the last: it appended nothing, so it holds nothing back.',
      `other sessions' transactions holding an xid while the steady run went: ${steady.held}.`,
    ],
  };
}

// ─── (e) partitions ──────────────────────────────────────────────────────────────────────

const PARTITION_BACKLOG = 1_000;
const PARTITION_WORKER = 'bench/outbox-partition-worker.ts';
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const SLOW_HANDLER_MS = 50;

/**
 * A slow handler (SLOW_HANDLER_MS per batch of 10): the same backlog read by a subscription of
 * one partition and by one of four, each with two instances in processes of their own
 * (bench/outbox-partition-worker.ts) sharing it.
 */
async function partitionRate(ctx: BenchContext, ordo: Ordo, partitions: number): Promise<number> {
  const topic = `bench-partitions-${partitions}`;
  let handled = 0;
  let done!: () => void;
  const finished = new Promise<void>((resolve) => {
    done = resolve;
  });
  const children = [0, 1].map(() =>
    spawn(
      process.execPath,
      ['--import', 'tsx', PARTITION_WORKER, ctx.url, topic, String(partitions), String(SLOW_HANDLER_MS)],
      { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit', 'ipc'] },
    ),
  );
  const kill = () => {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill();
  };
  ctx.signal.addEventListener('abort', kill, { once: true });
  try {
    await Promise.all(
      children.map(
        (child) =>
          new Promise<void>((resolve, reject) => {
            child.once('exit', (code) =>
              reject(new Error(`a partitions worker exited (${code}) before it was ready`)),
            );
            child.on('message', (m: { ready?: boolean; handled?: number }) => {
              if (m.ready) resolve();
              handled += m.handled ?? 0;
              if (handled >= PARTITION_BACKLOG) done();
            });
          }),
      ),
    );
    // Let the instances share the partitions out (a heartbeat is a third of the lease).
    await sleep(2_500);
    for (let i = 0; i < PARTITION_BACKLOG; i += 200) {
      await ordo.outbox.append(
        topic,
        Array.from({ length: 200 }, (_, j) => ({ type: 'Job', key: `k${i + j}`, data: { n: i + j } })),
      );
    }
    const started = performance.now();
    await Promise.race([finished, sleep(120_000, undefined, { signal: ctx.signal, ref: false })]);
    return (handled * 1000) / (performance.now() - started);
  } finally {
    ctx.signal.removeEventListener('abort', kill);
    await Promise.all(
      children.map(
        (c) =>
          new Promise<void>((resolve) => {
            if (c.exitCode !== null || c.signalCode !== null) return resolve();
            c.once('exit', () => resolve());
            c.send('stop');
          }),
      ),
    );
  }
}

async function partitionThroughput(ctx: BenchContext, ordo: Ordo): Promise<Table> {
  const one = await partitionRate(ctx, ordo, 1);
  const four = await partitionRate(ctx, ordo, 4);
  ctx.log(`outbox  (e) partitions: 1 → ${fmt.int(one)}/s, 4 → ${fmt.int(four)}/s`);
  const ratio = four / one;
  return {
    title: `outbox (e) partitions by key — a slow handler (${SLOW_HANDLER_MS} ms per batch of 10), ${fmt.int(PARTITION_BACKLOG)} messages, 2 instances`,
    columns: [
      { header: 'partitions' },
      { header: 'messages/s', align: 'right' },
      { header: 'vs one', align: 'right' },
    ],
    rows: [
      ['1', fmt.int(one), '1.00×'],
      ['4', fmt.int(four), `${ratio.toFixed(2)}× ${ratio >= 3.5 ? '✓' : '✗'} (goal ≥ 3.5×)`],
    ],
    notes: [
      'every message its own key; two instances (two processes, each with its own pool and LISTEN connection) subscribe to one',
      '  subscription; with one partition one of them reads, with four each takes two. Timed from the last append to the',
      '  last message handled; the backlog is appended after the instances have shared the partitions out.',
    ],
  };
}

// ─── (d) naive cursor vs ordo ─────────────────────────────────────────────────────────────

async function chaos(ctx: BenchContext, admin: pg.Pool, ordo: Ordo): Promise<Table> {
  const topic = 'bench-chaos';
  const consumer = await ordoOn(ctx, 4, 'chaos-consumer');
  const committed = new Set<number>();
  const rolledBack = new Set<number>();
  const delivered = new Map<number, number>();
  const check = new OrderCheck();
  const naiveSeen = new Set<number>();
  let naiveLast = 0;
  const naiveClient = await connect(ctx.url, 'naive');
  const naivePoll = async () => {
    for (;;) {
      const { rows } = await naiveClient.query(
        'SELECT position FROM ordo.messages WHERE topic = $1 AND position > $2 ORDER BY position LIMIT 100',
        [topic, naiveLast],
      );
      for (const r of rows) {
        const p = Number(r.position);
        naiveSeen.add(p);
        naiveLast = Math.max(naiveLast, p);
      }
      if (rows.length < 100) return;
    }
  };
  const watch = new Watch(admin).start();
  let transactions = 0;
  let sub: Subscription | undefined;
  try {
    sub = await consumer.ordo.outbox.subscribe({
      name: 'bench-chaos',
      topic,
      pollInterval: '100ms',
      handler: (batch: OutboxMessage[]) => {
        for (const m of batch) {
          check.add(m);
          delivered.set(m.position, (delivered.get(m.position) ?? 0) + 1);
        }
      },
    });
    const until = performance.now() + (ctx.warmupSeconds + ctx.seconds) * 1000;
    const writer = async (id: number, rollback: boolean) => {
      const client = await connect(ctx.url, `chaos-${id}`);
      try {
        while (performance.now() < until && !ctx.signal.aborted) {
          await client.query('BEGIN');
          await client.query('SELECT pg_current_xact_id()');
          await sleep(random(0, 10));
          const appended = await ordo.outbox.append(
            topic,
            Array.from({ length: random(1, 5) }, (_, i) => ({ type: 'Chaos', data: { writer: id, i } })),
            { tx: client },
          );
          await sleep(random(0, 10));
          await client.query(rollback ? 'ROLLBACK' : 'COMMIT');
          for (const a of appended) (rollback ? rolledBack : committed).add(a.position!);
          if (!rollback) transactions++;
        }
      } finally {
        await client.end();
      }
    };
    let polling = true;
    const naive = (async () => {
      while (polling) {
        await naivePoll();
        await sleep(5);
      }
    })();
    await Promise.all(Array.from({ length: CHAOS_WRITERS + 1 }, (_, id) => writer(id, id === CHAOS_WRITERS)));
    ctx.signal.throwIfAborted();
    polling = false;
    await naive;
    await naivePoll();
    const caughtUp = await drained(sub, 30_000, ctx.signal);
    const naiveLost = [...committed].filter((p) => !naiveSeen.has(p)).length;
    const ordoLost = [...committed].filter((p) => !delivered.has(p)).length;
    const duplicates = [...delivered.values()].filter((n) => n > 1).length;
    const ghosts = [...delivered.keys()].filter((p) => rolledBack.has(p)).length;
    const ok =
      caughtUp &&
      ordoLost === 0 &&
      duplicates === 0 &&
      ghosts === 0 &&
      check.disorder === 0 &&
      committed.size > 0;
    const pct = (n: number) => `${fmt.fixed((100 * n) / Math.max(1, committed.size), 2)}%`;
    ctx.log(
      `outbox  (d) ${fmt.int(committed.size)} committed: naive lost ${naiveLost}, ordo lost ${ordoLost}`,
    );
    const verified: Verified = {
      ok,
      text: ok
        ? `✓ every committed message once, in order; none rolled back`
        : `✗ ${[!caughtUp && 'not drained in 30 s', ordoLost && `${ordoLost} lost`, duplicates && `${duplicates} dup`, ghosts && `${ghosts} rolled-back delivered`, check.disorder && `${check.disorder} out of order`].filter(Boolean).join(', ')}`,
    };
    return {
      title: `outbox (d) writers committing out of order — ${CHAOS_WRITERS} writers + 1 rolling back, ${ctx.warmupSeconds + ctx.seconds} s; read at once by the naive cursor and by ordo`,
      columns: [
        { header: 'reader' },
        { header: 'committed', align: 'right' },
        { header: 'delivered', align: 'right' },
        { header: 'lost', align: 'right' },
        { header: 'lost %', align: 'right' },
        { header: 'duplicates', align: 'right' },
        { header: 'verified' },
      ],
      rows: [
        [
          'naive: position > last, every 5 ms',
          fmt.int(committed.size),
          fmt.int(naiveSeen.size),
          fmt.int(naiveLost),
          pct(naiveLost),
          '0',
          '',
        ],
        [
          'ordo subscription',
          fmt.int(committed.size),
          fmt.int(delivered.size),
          fmt.int(ordoLost),
          pct(ordoLost),
          fmt.int(duplicates),
          verified.text,
        ],
        null,
        ['goal: ordo loses 0', '', '', ordoLost === 0 ? '0 ✓' : `${ordoLost} ✗`, '', '', ''],
      ],
      failures: ok ? [] : [`(d) ordo: ${verified.text}`],
      notes: [
        `writer: BEGIN; SELECT pg_current_xact_id(); sleep 0–10 ms; append 1–5 messages; sleep 0–10 ms; COMMIT (the last writer: ROLLBACK).`,
        `  ${fmt.int(transactions)} transactions committed, ${fmt.int(rolledBack.size)} messages rolled back.`,
        '  naive: SELECT position FROM ordo.messages WHERE topic = $1 AND position > $last ORDER BY position LIMIT 100, $last =',
        '  the largest position seen; a position given to a transaction that commits after a later one has been read is never read.',
        '  ordo: a subscription (pollInterval 100 ms); delivered = distinct positions received by the handler.',
        `other sessions' transactions holding an xid while (d) ran: ${watch.stop()}.`,
      ],
    };
  } finally {
    watch.stop();
    await sub?.stop();
    await naiveClient.end();
    await consumer.ordo.close();
    await consumer.pool.end();
  }
}

// ─── the suite ───────────────────────────────────────────────────────────────────────────

async function run(ctx: BenchContext): Promise<Table[]> {
  const admin = await openPool(ctx.url, 4, `${APP}-admin`);
  const ordo = await createOrdo({ pool: admin });
  try {
    const before = await others(admin);
    await admin.query(PLAIN_DDL);
    const tables = [await appendThroughput(ctx, admin, ordo)];
    tables.push(await consumerThroughput(ctx, admin));
    tables.push(await latency(ctx, admin, ordo));
    tables.push(await chaos(ctx, admin, ordo));
    tables.push(await partitionThroughput(ctx, ordo));
    const after = await others(admin);
    tables[0]!.notes!.push(describeOthers('at the start', before), describeOthers('at the end', after));
    return tables;
  } finally {
    await ordo.close();
    await admin.end();
  }
}

export const outbox: Suite = { name: 'outbox', run };
