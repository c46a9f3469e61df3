// ordo behind a real PgBouncer in transaction mode (how Supabase, Neon and Heroku connect):
// 3 server connections shared by every client, so a LISTEN's server connection goes back to
// the pool as soon as the statement ends and its notifications go nowhere. Every primitive must
// keep its guarantees through it; notifications must either take the direct route (listenUrl)
// or be found lost, said once, and replaced by short polling.
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type LogEntry, type Ordo, type OrdoOptions, OrdoError } from '../src/index.js';
import { drawer, duplicates, maxOf, range } from './support/drawer.js';
import { type OwnPostgres, ownPostgres } from './support/own-postgres.js';
import { type PgBouncer, startPgBouncer } from './support/pgbouncer.js';
import { runCli, startServer } from './support/server-process.js';
import { until } from './support/until.js';

const DATABASE = 'ordo_pgbouncer';

let server: OwnPostgres;
let bouncer: PgBouncer;
/** The test database, directly. */
let directUrl: string;
/** The test database, through PgBouncer. */
let bouncerUrl: string;
/** A pool on the test database, directly, for checks. */
let direct: pg.Pool;
let opened: Ordo[] = [];
let pools: pg.Pool[] = [];

/** `url` with another database. */
function onDatabase(url: string, database: string): string {
  const u = new URL(url);
  u.pathname = `/${database}`;
  return u.toString();
}

beforeAll(async () => {
  // Without listenUrl means without: not the one of the environment.
  delete process.env.ORDO_LISTEN_URL;
  server = await ownPostgres();
  const admin = new pg.Client({ connectionString: server.url });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${DATABASE}`);
  await admin.end();
  bouncer = await startPgBouncer(server.url, { poolSize: 3 });
  directUrl = onDatabase(server.url, DATABASE);
  bouncerUrl = onDatabase(bouncer.url, DATABASE);
  direct = new pg.Pool({ connectionString: directUrl, max: 4 });
  direct.on('error', () => undefined);
});
afterEach(async () => {
  await Promise.all(opened.map((o) => o.close().catch(() => undefined)));
  opened = [];
  await Promise.all(pools.map((p) => p.end().catch(() => undefined)));
  pools = [];
});
afterAll(async () => {
  await direct?.end();
  await bouncer?.stop();
  await server?.stop();
});

/**
 * A fresh ordo through PgBouncer (unless told otherwise), its pool larger than PgBouncer's 3
 * server connections, with what it logs kept.
 */
async function open(options: OrdoOptions = {}): Promise<{ ordo: Ordo; logs: LogEntry[] }> {
  const logs: LogEntry[] = [];
  const ordo = await createOrdo({
    databaseUrl: bouncerUrl,
    poolSize: 6,
    log: (e) => logs.push(e),
    ...options,
  });
  opened.push(ordo);
  return { ordo, logs };
}

function poolOn(url: string, max: number, Client: typeof pg.Client = pg.Client): pg.Pool {
  const pool = new pg.Pool({ connectionString: url, max, Client });
  pool.on('error', () => undefined);
  pools.push(pool);
  return pool;
}

/**
 * Holds one of PgBouncer's server connections in an open transaction on a client of `pool`,
 * until release(): which one it got is `pid`. With the others held, the next transaction of
 * another client runs on the one left free.
 */
function holder(pool: pg.Pool): () => Promise<{ pid: number; release(): Promise<void> }> {
  return async () => {
    const c = await pool.connect();
    await c.query('BEGIN');
    const pid = (await c.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
    return { pid, release: async () => (await c.query('COMMIT'), c.release()) };
  };
}

const lostWarnings = (logs: LogEntry[]) => logs.filter((e) => e.code === 'notifications_lost');

const sorted = (xs: number[]) => [...xs].sort((a, b) => a - b);
const strictlyIncreasing = (xs: number[]) => xs.every((x, i) => i === 0 || x > xs[i - 1]!);
const routes = [
  { route: 'listenUrl', state: 'ok', options: () => ({ listenUrl: directUrl }) },
  { route: 'database', state: 'lost', options: () => ({}) },
] as const;

// ---------------------------------------------------------------------------------------------

describe('the PgBouncer of these tests', () => {
  it('shares 3 server connections between many clients, and a LISTEN made through it hears nothing', async () => {
    const pool = poolOn(bouncerUrl, 12);
    const answers = await Promise.all(
      range(1, 36).map(() => pool.query('SELECT pg_backend_pid() AS pid, pg_sleep(0.02)')),
    );
    const pids = new Set(answers.map((a) => a.rows[0].pid));
    expect(pids.size).toBeGreaterThan(0);
    expect(pids.size).toBeLessThanOrEqual(bouncer.poolSize);

    const heard = { bouncer: [] as string[], direct: [] as string[] };
    const clients = [] as pg.Client[];
    for (const [route, url] of [
      ['bouncer', bouncerUrl],
      ['direct', directUrl],
    ] as const) {
      const c = new pg.Client({ connectionString: url });
      c.on('error', () => undefined);
      clients.push(c);
      await c.connect();
      c.on('notification', (n) => heard[route].push(n.payload ?? ''));
      await c.query('LISTEN pgbouncer_check');
    }
    try {
      for (const i of [1, 2, 3]) await pool.query(`NOTIFY pgbouncer_check, '${i}'`);
      await until('the direct LISTEN hears all three', () => heard.direct.length === 3, 5000);
      await sleep(300);
      expect(heard.direct).toEqual(['1', '2', '3']);
      expect(heard.bouncer).toEqual([]);
    } finally {
      await Promise.all(clients.map((c) => c.end().catch(() => undefined)));
    }
    // PgBouncer refuses to run as root: as root, it runs as postgres.
    if (process.getuid?.() === 0) {
      const uid = /^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${bouncer.pid}/status`, 'utf8'))?.[1];
      expect(Number(uid)).not.toBe(0);
    }
  });

  it('6 clients started at once on an empty database through it migrate it exactly once', async () => {
    const admin = new pg.Client({ connectionString: server.url });
    await admin.connect();
    await admin.query('CREATE DATABASE ordo_pgbouncer_empty');
    await admin.end();
    const url = onDatabase(bouncer.url, 'ordo_pgbouncer_empty');
    const clients = await Promise.all(range(1, 6).map(() => open({ databaseUrl: url, poolSize: 2 })));
    await clients[0]!.ordo.sequences.define({ name: 'first', ifNotExists: true });
    const values = await Promise.all(clients.map((c) => c.ordo.nextval('first')));
    expect(sorted(values)).toEqual(range(1, 6));
    const check = poolOn(onDatabase(server.url, 'ordo_pgbouncer_empty'), 1);
    const { rows } = await check.query(
      'SELECT version, count(*)::int AS n FROM ordo.migrations GROUP BY version',
    );
    expect(rows.length).toBeGreaterThan(0);
    expect(rows.every((r) => r.n === 1)).toBe(true);
  });
});

describe('ordo.notifications()', () => {
  it("with a direct databaseUrl: route 'database', state 'ok', nothing logged", async () => {
    const { ordo, logs } = await open({ databaseUrl: directUrl });
    const status = await ordo.notifications();
    expect(status).toMatchObject({ route: 'database', state: 'ok', message: null });
    expect(status.since).toBeInstanceOf(Date);
    expect(lostWarnings(logs)).toEqual([]);
  });

  it("through PgBouncer with listenUrl: route 'listenUrl', state 'ok', nothing logged", async () => {
    const { ordo, logs } = await open({ listenUrl: directUrl });
    expect(await ordo.notifications()).toMatchObject({ route: 'listenUrl', state: 'ok', message: null });
    expect(lostWarnings(logs)).toEqual([]);
  });

  it("through PgBouncer without listenUrl: state 'lost', said once through log, naming listenUrl", async () => {
    const { ordo, logs } = await open();
    const status = await ordo.notifications();
    expect(status).toMatchObject({ route: 'database', state: 'lost' });
    expect(status.message).toContain('listenUrl');
    // Asked again, and with channels of every module in use: still said once.
    await ordo.sequences.define({ name: 'asked_twice', kind: 'batched', batch: 10 });
    await ordo.nextval('asked_twice');
    const sub = await ordo.outbox.subscribe({ name: 'asked_twice', topic: 'asked_twice', handler: () => {} });
    expect(await ordo.notifications()).toMatchObject({ route: 'database', state: 'lost' });
    await sub.stop();
    const warnings = lostWarnings(logs);
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatchObject({ level: 'warn', code: 'notifications_lost' });
    expect(warnings[0]!.message).toContain('listenUrl');
  });

  it('ordo status --json reports them as notifications, with and without --listen-url', async () => {
    const [lost, ok] = await Promise.all([
      runCli(['status', '--json', '--database-url', bouncerUrl]),
      runCli(['status', '--json', '--database-url', bouncerUrl, '--listen-url', directUrl]),
    ]);
    expect(lost.code, lost.err).toBe(0);
    expect(ok.code, ok.err).toBe(0);
    expect(JSON.parse(lost.out).notifications).toMatchObject({ route: 'database', state: 'lost' });
    expect(JSON.parse(lost.out).notifications.message).toContain('listenUrl');
    expect(JSON.parse(ok.out).notifications).toMatchObject({
      route: 'listenUrl',
      state: 'ok',
      message: null,
    });
  });

  it('ordo serve through PgBouncer logs one notifications_lost warning at start, none with --listen-url', async () => {
    const [lost, ok] = await Promise.all([
      startServer({ databaseUrl: bouncerUrl }),
      startServer({ databaseUrl: bouncerUrl, args: ['--listen-url', directUrl] }),
    ]);
    try {
      const warned = (s: typeof lost) => s.logs().filter((l) => l.code === 'notifications_lost');
      await until('the warning is logged', () => warned(lost).length > 0, 10_000);
      // Long enough for the other one's probe to have come back (or not).
      await sleep(3500);
      expect(warned(lost)).toHaveLength(1);
      expect(warned(lost)[0]).toMatchObject({ level: 40, msg: expect.stringContaining('listenUrl') });
      expect(warned(ok)).toEqual([]);
    } finally {
      await Promise.all([lost.stop('SIGINT'), ok.stop('SIGINT')]);
    }
  });
});

describe('gapless sequences through PgBouncer', () => {
  it("45 callers' transactions on two clients, a third rolled back: the committed numbers are exactly 1..30", async () => {
    const [a, b] = [(await open()).ordo, (await open()).ordo];
    await a.sequences.define({ name: 'invoice', reset: 'year', format: 'INV-{YYYY}-{n:6}' });
    await direct.query('CREATE TABLE invoices (number bigint PRIMARY KEY, text text NOT NULL)');
    // Each client looks the definition up once, in a transaction rolled back (which gives its
    // number back). That lookup runs on ordo's own pool, outside the caller's transaction: with
    // every pooled connection lent to a transaction and the definition not known yet, it would
    // wait for a connection until connectTimeout (not a pooler's doing: it happens directly too).
    for (const o of [a, b]) {
      await expect(
        o.transaction(async (tx) => {
          await o.sequences.next('invoice', { tx });
          throw new Error('warm-up');
        }),
      ).rejects.toThrow('warm-up');
    }
    const outcomes = await Promise.allSettled(
      range(1, 45).map((i) =>
        (i % 2 ? a : b).transaction(async (tx) => {
          const issued = await (i % 2 ? a : b).sequences.next('invoice', { tx });
          await tx.query('INSERT INTO invoices (number, text) VALUES ($1, $2)', [issued.value, issued.text]);
          await sleep(i % 5); // commits and rollbacks interleave
          if (i % 3 === 0) throw new Error('rolled back');
          return issued.value;
        }),
      ),
    );
    const committed = outcomes.flatMap((o) => (o.status === 'fulfilled' ? [o.value] : []));
    const refused = outcomes.flatMap((o) => (o.status === 'rejected' ? [String(o.reason)] : []));
    expect(refused).toEqual(Array(15).fill('Error: rolled back'));
    expect(sorted(committed)).toEqual(range(1, 30));
    const { rows } = await direct.query('SELECT number::int AS n FROM invoices ORDER BY number');
    expect(rows.map((r) => r.n)).toEqual(range(1, 30));
    expect((await b.sequences.next('invoice')).value).toBe(31);
  });

  it('200 standalone calls at once from two clients: exactly 1..200', async () => {
    const [a, b] = [(await open()).ordo, (await open()).ordo];
    await a.sequences.define({ name: 'ticket' });
    const values = await Promise.all(range(1, 200).map((i) => (i % 4 ? a : b).nextval('ticket')));
    expect(sorted(values)).toEqual(range(1, 200));
    const scoped = await Promise.all(
      range(1, 60).map((i) => (i % 2 ? a : b).sequences.next('ticket', { scope: `t${i % 3}` })),
    );
    for (const scope of ['t0', 't1', 't2']) {
      expect(sorted(scoped.filter((s) => s.scope === scope).map((s) => s.value))).toEqual(range(1, 20));
    }
  });
});

describe('batched sequences through PgBouncer', () => {
  it('two nodes and SQL callers draw at once: every value unique, increasing per node', async () => {
    const [a, b] = [(await open()).ordo, (await open()).ordo];
    await a.sequences.define({ name: 'order_id', kind: 'batched', batch: 250, start: 100 });
    const sql = poolOn(bouncerUrl, 4);
    const draw = async (o: Ordo) => {
      const one: number[] = [];
      const many: number[] = [];
      for (let i = 0; i < 3000; i++) {
        one.push(await o.nextval('order_id'));
        if (i % 500 === 0) many.push(...(await o.sequences.nextMany('order_id', 300)).map((x) => x.value));
        if (i % 100 === 0) await sleep(0);
      }
      return { one, many };
    };
    const fromSql = async () => {
      const values: number[] = [];
      for (let i = 0; i < 40; i++) {
        values.push(Number((await sql.query("SELECT ordo.nextval('order_id') AS v")).rows[0].v));
      }
      return values;
    };
    const [fromA, fromB, viaSql] = await Promise.all([draw(a), draw(b), fromSql()]);
    for (const d of [fromA, fromB]) {
      expect(strictlyIncreasing(d.one)).toBe(true);
      expect(strictlyIncreasing(d.many)).toBe(true);
    }
    const all = [...fromA.one, ...fromA.many, ...fromB.one, ...fromB.many, ...viaSql];
    expect(all.length).toBe(2 * (3000 + 6 * 300) + 40);
    expect(duplicates(all)).toEqual([]);
    expect(all.every((v) => v >= 100)).toBe(true);
  });

  for (const { route, state, options } of routes) {
    it(`OVERWRITE and REMOVE on node A stop node B's range promptly (route ${route}: ${
      route === 'listenUrl' ? 'by NOTIFY' : 'by the shortened epoch check'
    })`, async () => {
      const [a, b] = [(await open(options())).ordo, (await open(options())).ordo];
      expect(await b.notifications()).toMatchObject({ route, state });
      const name = `reshaped_${route}`;
      // Ranges of a million: a node that keeps its range serves from it for a long time.
      await a.sequences.define({ name, kind: 'batched', batch: 1_000_000 });
      let fromA: number[] = [];
      let fromB: number[] = [];
      const delays: number[] = [];
      for (let round = 1; round <= 3; round++) {
        const d = drawer(b, name);
        await until('B draws', () => d.values.length >= 500);
        const def = await a.sequences.define({
          name,
          kind: 'batched',
          batch: 1_000_000,
          start: 0,
          overwrite: true,
        });
        const overwritten = performance.now();
        await until('B serves from the new definition', () => (d.values.at(-1) ?? -1) >= def.start, 10_000);
        await d.stop();
        expect(d.error).toBeUndefined();
        expect(strictlyIncreasing(d.values)).toBe(true);
        // Never backwards, never twice: START 0 was raised above everything handed out.
        expect(def.start).toBeGreaterThan(
          maxOf(
            fromA,
            fromB,
            d.values.filter((v) => v < def.start),
          ),
        );
        delays.push(d.times[d.values.findIndex((v) => v >= def.start)]! - overwritten);
        fromB = fromB.concat(d.values);
        fromA = fromA.concat((await a.sequences.nextMany(name, 100)).map((x) => x.value));
      }
      // NOTIFY takes milliseconds; the epoch check, shortened to 100 ms while notifications are
      // lost, bounds the delay below its usual 2 s.
      expect(Math.max(...delays), `delays ${delays.map(Math.round).join(', ')} ms`).toBeLessThan(1000);
      expect(duplicates(fromA, fromB)).toEqual([]);

      const d = drawer(b, name);
      await until('B draws', () => d.values.length >= 500);
      const removing = performance.now();
      expect(await a.sequences.remove(name)).toBe(true);
      await Promise.race([
        d.done,
        sleep(10_000).then(() => {
          throw new Error(`B still serves 10 s after REMOVE (${d.values.length} values)`);
        }),
      ]);
      expect(d.error).toMatchObject({ code: 'sequence_not_found' });
      expect(d.stoppedAt! - removing).toBeLessThan(1000);
      await expect(b.nextval(name)).rejects.toMatchObject({ code: 'sequence_not_found' });
    });
  }
});

describe('outbox through PgBouncer', () => {
  for (const { route, state, options } of routes) {
    it(`a subscription polling every hour gets every message at once, exactly once (route ${route})`, async () => {
      const [w1, w2] = [(await open()).ordo, (await open()).ordo];
      const { ordo: reader, logs } = await open(options());
      const topic = `orders_${route}`;
      const got: string[] = [];
      const sub = await reader.outbox.subscribe({
        name: `billing_${route}`,
        topic,
        pollInterval: '1h',
        handler: (messages) => {
          for (const m of messages) got.push(m.messageId!);
        },
      });
      expect(await reader.notifications()).toMatchObject({ route, state });
      // Past the first read and the quick looks after it: the consumer now waits for a
      // notification or its poll (an hour; 100 ms while notifications are lost).
      await sleep(500);
      const delays: number[] = [];
      for (const i of [1, 2, 3]) {
        const appended = performance.now();
        await w1.outbox.append(topic, { type: 'OrderPlaced', data: { i }, messageId: `one-${i}` });
        await until(`message ${i} delivered`, () => got.includes(`one-${i}`), 3000);
        delays.push(performance.now() - appended);
        await sleep(400); // past the quick looks that follow a delivery
      }
      // A burst from two clients, one message at a time and many in one transaction.
      const expected = ['one-1', 'one-2', 'one-3'];
      const burst = range(1, 40).map((i) => ({ type: 'OrderPlaced', data: { i }, messageId: `burst-${i}` }));
      expected.push(...burst.map((m) => m.messageId));
      await Promise.all([
        ...burst.slice(0, 20).map((m, i) => (i % 2 ? w1 : w2).outbox.append(topic, m)),
        w2.transaction((tx) => w2.outbox.append(topic, burst.slice(20), { tx })),
      ]);
      // Appended again: duplicates by messageId, not stored twice.
      expect((await w1.outbox.append(topic, burst.slice(0, 5))).every((r) => r.duplicate)).toBe(true);
      await until('the burst delivered', () => got.length >= expected.length, 5000);
      await sleep(300);
      await sub.stop();
      expect([...got].sort()).toEqual([...expected].sort());
      expect(lostWarnings(logs)).toHaveLength(state === 'lost' ? 1 : 0);
      expect(delays.every((ms) => ms < 3000)).toBe(true);
    });
  }
});

describe('throttles through PgBouncer', () => {
  /** Workers on each client acquire until `ms` have passed; `running` is shared, in this process. */
  async function contend(clients: Ordo[], name: string, workers: number, ms: number, workMs: number) {
    const grants: Date[] = [];
    let running = 0;
    let maxRunning = 0;
    const errors: unknown[] = [];
    const end = performance.now() + ms;
    const worker = async (o: Ordo) => {
      while (performance.now() < end) {
        try {
          const p = await o.throttles.acquire(name, { key: 'k' });
          if (!p.granted) {
            await sleep(Math.min(p.retryAfterMs, 200));
            continue;
          }
          grants.push(p.acquiredAt);
          maxRunning = Math.max(maxRunning, ++running);
          await sleep(workMs);
          running--;
          await p.complete();
        } catch (e) {
          errors.push(e);
          return;
        }
      }
    };
    await Promise.all(clients.flatMap((o) => range(1, workers).map(() => worker(o))));
    return { grants: grants.sort((x, y) => x.getTime() - y.getTime()), maxRunning, errors };
  }

  it('every 1s with concurrency 1, 12 workers on two clients for 3.5 s: starts at least 1 s apart, never two at once', async () => {
    const [a, b] = [(await open()).ordo, (await open()).ordo];
    await a.throttles.define({ name: 'every_second', every: '1s', concurrency: 1, lease: '30s' });
    const { grants, maxRunning, errors } = await contend([a, b], 'every_second', 6, 3500, 50);
    expect(errors).toEqual([]);
    expect(grants.length).toBeGreaterThanOrEqual(2);
    expect(grants.length).toBeLessThanOrEqual(5);
    for (let i = 1; i < grants.length; i++) {
      expect(grants[i]!.getTime() - grants[i - 1]!.getTime()).toBeGreaterThanOrEqual(1000);
    }
    expect(maxRunning).toBe(1);
    const state = await b.throttles.state('every_second', 'k');
    expect(state).toMatchObject({ starts: grants.length, lastOutcome: 'completed', running: [] });
  });

  it('concurrency 2, 16 workers on two clients for 2 s: never more than 2 running, all permits ended', async () => {
    const [a, b] = [(await open()).ordo, (await open()).ordo];
    await a.throttles.define({ name: 'two_at_once', concurrency: 2, lease: '30s' });
    const { grants, maxRunning, errors } = await contend([a, b], 'two_at_once', 8, 2000, 20);
    expect(errors).toEqual([]);
    expect(grants.length).toBeGreaterThan(5);
    expect(maxRunning).toBeLessThanOrEqual(2);
    expect(await a.throttles.running('two_at_once')).toEqual([]);
  });

  it('permits complete and fail, with and without refund; run() renews and ends its permit', async () => {
    const [a, b] = [(await open()).ordo, (await open()).ordo];
    await a.throttles.define({ name: 'per_minute', every: '1m', lease: '10m' });

    const first = await a.throttles.acquire('per_minute', { key: 'fails' });
    if (!first.granted) throw new Error('refused');
    expect(await first.fail(new Error('downstream 503'), { refund: true })).toMatchObject({
      outcome: 'failed',
      refunded: true,
    });
    const retry = await b.throttles.acquire('per_minute', { key: 'fails' });
    if (!retry.granted) throw new Error('the refunded interval was not given back');
    expect(await retry.fail(new Error('downstream 500'), { refund: false })).toMatchObject({
      refunded: false,
    });
    const refused = await a.throttles.acquire('per_minute', { key: 'fails' });
    expect(refused).toMatchObject({ granted: false, reason: 'every' });
    expect(refused.granted ? 0 : refused.retryAfterMs).toBeGreaterThan(50_000);
    expect(await b.throttles.state('per_minute', 'fails')).toMatchObject({
      starts: 2,
      lastOutcome: 'failed',
      lastError: expect.stringContaining('downstream 500'),
      running: [],
    });

    const done = await b.throttles.acquire('per_minute', { key: 'completes' });
    if (!done.granted) throw new Error('refused');
    expect(await done.complete()).toMatchObject({ outcome: 'completed' });
    await expect(done.complete()).rejects.toMatchObject({ code: 'permit_not_found' });
    expect(await a.throttles.acquire('per_minute', { key: 'completes' })).toMatchObject({ granted: false });

    const ran = await a.throttles.run('per_minute', async () => 'ran', { key: 'runs' });
    expect(ran).toMatchObject({ ran: true, value: 'ran' });
    expect(await b.throttles.run('per_minute', async () => 'twice', { key: 'runs' })).toMatchObject({
      ran: false,
    });
    expect(await b.throttles.state('per_minute', 'runs')).toMatchObject({
      lastOutcome: 'completed',
      running: [],
    });
  });

  // Standalone acquires and completions share statements, which must stay unnamed (without
  // prepare: true): for a *named* prepared statement, PgBouncer before 1.21 (and later ones
  // without max_prepared_statements) forwards Parse to one server connection and a later Bind
  // to another: 26000 "prepared statement … does not exist" or 42P05 "… already exists".
  it('a shared throttle statement parsed on one server connection runs on another without an error', async () => {
    const errors: string[] = [];
    class Recording extends pg.Client {
      override query(...args: any[]): any {
        const last = args.at(-1);
        if (typeof last === 'function') {
          args[args.length - 1] = (e: any, r: unknown) => {
            if (e) errors.push(`${e.code}: ${e.message}`);
            last(e, r);
          };
        }
        return (super.query as (...a: unknown[]) => unknown).apply(this, args);
      }
    }
    // A database of its own, so PgBouncer's server connections for it are new: none has parsed
    // the statement for another test. One connection in ordo's pool: its statements are parsed
    // once, on whichever server connection PgBouncer gives it.
    const admin = new pg.Client({ connectionString: server.url });
    await admin.connect();
    await admin.query('CREATE DATABASE ordo_pgbouncer_prepared');
    await admin.end();
    const url = onDatabase(bouncer.url, 'ordo_pgbouncer_prepared');
    const { ordo } = await open({ databaseUrl: undefined, pool: poolOn(url, 1, Recording) });
    await ordo.throttles.define({ name: 'prepared', concurrency: 100 });
    // Two server connections held by open transactions: ordo's first shared statement is
    // parsed on the third.
    const hold = holder(poolOn(url, 3));
    const [h1, h2] = [await hold(), await hold()];
    const first = await ordo.throttles.acquire('prepared', { key: 'a' });
    expect(first.granted).toBe(true);
    await h1.release();
    await h2.release();
    // Now hold the third (the one that parsed it) and send the next shared statement.
    const three = [await hold(), await hold(), await hold()];
    for (const h of three) if (h.pid === h1.pid || h.pid === h2.pid) await h.release();
    const second = await ordo.throttles.acquire('prepared', { key: 'b' });
    for (const h of three) if (h.pid !== h1.pid && h.pid !== h2.pid) await h.release();
    expect(second.granted).toBe(true);
    expect(errors).toEqual([]);
  });
});

describe('prepare: true through PgBouncer in transaction mode', () => {
  // A statement prepared on one server connection is unknown to the others; pg sends only its
  // name from the second time on, and PgBouncer 1.18 hands the next transaction to any of them.
  it("a caller's next transaction on another server connection fails with prepared_statement_missing, saying what to change, and loses nothing", async () => {
    // ordo's own pool is direct; the application's goes through PgBouncer.
    const { ordo } = await open({ databaseUrl: directUrl, prepare: true });
    await ordo.sequences.define({ name: 'prepared_invoice' });
    const client = await poolOn(bouncerUrl, 1).connect();
    const hold = holder(poolOn(bouncerUrl, 3));
    const [h1, h2] = [await hold(), await hold()];
    // Both of next()'s statements (take() until the definition is known, then take_value) are
    // prepared on the third server connection.
    await client.query('BEGIN');
    const taken = [
      await ordo.sequences.next('prepared_invoice', { tx: client }),
      await ordo.sequences.next('prepared_invoice', { tx: client }),
    ];
    const parsedOn = (await client.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
    await client.query('COMMIT');
    await h1.release();
    await h2.release();
    // Hold that one: the client's next transaction runs on another.
    const three = [await hold(), await hold(), await hold()];
    for (const h of three) if (h.pid !== parsedOn) await h.release();
    await client.query('BEGIN');
    const refused = await ordo.sequences.next('prepared_invoice', { tx: client }).catch((e: unknown) => e);
    await client.query('ROLLBACK');
    for (const h of three) if (h.pid === parsedOn) await h.release();
    client.release();
    expect(taken.map((t) => t.value)).toEqual([1, 2]);
    expect(refused).toBeInstanceOf(OrdoError);
    expect(refused).toMatchObject({ code: 'prepared_statement_missing' });
    expect((refused as OrdoError).message).toMatch(
      /does not exist: .*pooler in transaction mode.*prepare: false/,
    );
    // The refused transaction took nothing: the next number is 3, on a direct connection.
    const after = await direct.connect();
    try {
      await after.query('BEGIN');
      expect((await ordo.sequences.next('prepared_invoice', { tx: after })).value).toBe(3);
      await after.query('COMMIT');
    } finally {
      after.release();
    }
  });
});
