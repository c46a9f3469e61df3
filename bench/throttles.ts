import { createHistogram, performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { RateLimiterPostgres } from 'rate-limiter-flexible';
import { createOrdo, type Ordo } from '../src/index.js';
import {
  type BenchContext,
  countQueries,
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
 * Throttles. (1) acquire + complete throughput, on one hot key and on 1000 keys, against
 * rate-limiter-flexible's RateLimiterPostgres (one consume() per op) on the same PostgreSQL,
 * the same pool and the same number of concurrent callers; ordo with permits does more per op
 * (a lease and an outcome per permit, on the database clock), ordo with permits: false is a
 * rate limiter as RateLimiterPostgres is (a start only), and the goals compare those two. (2) The FOO story: 50 workers released at
 * once on "FOO every 200 ms, at most one running", ten queued tasks, some longer than the
 * interval; starts closer than the interval and tasks running at once are counted for a naive
 * read-then-write check, for the usual conditional UPDATE, and for ordo.
 */

const CALLERS = 32;
const KEY_COUNT = 1000;
const THROTTLE = 'bench_throttle';
/** The same limits, defined with permits: false: a rate limiter, as RateLimiterPostgres is. */
const PLAIN = 'bench_plain';
const RLF_TABLE = 'bench_rlf';

interface Keys {
  label: string;
  key(): string;
}
const HOT: Keys = { label: 'hot', key: () => 'hot' };
const MANY: Keys = { label: `${KEY_COUNT} keys`, key: () => `k${Math.floor(Math.random() * KEY_COUNT)}` };

interface Row {
  label: string;
  keys: string;
  load: LoadResult;
  verified: Verified;
}

async function run(ctx: BenchContext): Promise<Table[]> {
  const pool = await openPool(ctx.url, CALLERS, 'ordo-bench');
  const admin = new pg.Pool({ connectionString: ctx.url, max: 2, application_name: 'ordo-bench-admin' });
  admin.on('error', () => undefined);
  try {
    const ordo = await createOrdo({ pool });
    // Generous limits: every acquire is granted, so that an op is always acquire + complete.
    await ordo.throttles.define({
      name: THROTTLE,
      limit: 1_000_000,
      per: '1s',
      lease: '1m',
      overwrite: true,
    });
    await ordo.throttles.define({
      name: PLAIN,
      limit: 1_000_000,
      per: '1s',
      permits: false,
      overwrite: true,
    });
    const limiter = await new Promise<RateLimiterPostgres>((resolve, reject) => {
      const created: RateLimiterPostgres = new RateLimiterPostgres(
        { storeClient: pool, storeType: 'pool', tableName: RLF_TABLE, points: 1_000_000_000, duration: 3600 },
        (error?: Error) => (error ? reject(error) : resolve(created)),
      );
    });
    const counter = countQueries(pool);
    const rows: Row[] = [];
    const goals: string[][] = [];
    const vacuumed = await vacuumsStandIn(admin);
    for (const keys of [HOT, MANY]) {
      const ops = { ordo: 0, plain: 0, rlf: 0 };
      const acquireAndComplete = (name: string, side: 'ordo' | 'plain') => async () => {
        const permit = await ordo.throttles.acquire(name, { key: keys.key() });
        if (!permit.granted) throw new Error(`refused: ${permit.reason}`);
        await permit.complete();
        ops[side]++;
      };
      const stopVacuums = standInAutovacuum(admin, vacuumed);
      const measured = await interleave(
        {
          ordo: {
            workers: CALLERS,
            statements: () => counter.count,
            op: acquireAndComplete(THROTTLE, 'ordo'),
          },
          plain: {
            workers: CALLERS,
            statements: () => counter.count,
            op: acquireAndComplete(PLAIN, 'plain'),
          },
          rlf: {
            workers: CALLERS,
            statements: () => counter.count,
            op: async () => {
              await limiter.consume(keys.key());
              ops.rlf++;
            },
          },
        },
        ctx,
      );
      await stopVacuums();
      const ordoRow = logged(ctx, {
        label: 'ordo acquire + complete',
        keys: keys.label,
        load: measured.ordo.result(),
        verified: await verifyOrdo(admin, THROTTLE, ops.ordo),
      });
      const plainRow = logged(ctx, {
        label: 'ordo, permits: false',
        keys: keys.label,
        load: measured.plain.result(),
        verified: await verifyOrdo(admin, PLAIN, ops.plain),
      });
      const rlfRow = logged(ctx, {
        label: 'RateLimiterPostgres consume',
        keys: keys.label,
        load: measured.rlf.result(),
        verified: await verifyRlf(admin, ops.rlf),
      });
      rows.push(ordoRow, plainRow, rlfRow);
      const goal = keys === HOT ? 4 : 1.5;
      const versus = (row: Row, label: string, target: number | null) => [
        label,
        keys.label,
        '',
        '',
        '',
        '',
        '',
        target === null
          ? `${fmt.fixed(row.load.opsPerSecond / rlfRow.load.opsPerSecond, 2)}×`
          : ratioCell(row.load.opsPerSecond / rlfRow.load.opsPerSecond, target),
      ];
      goals.push(
        versus(plainRow, `goal: ordo, permits: false ≥ ${goal} × RateLimiterPostgres`, goal),
        versus(ordoRow, 'ordo with permits ÷ RateLimiterPostgres', null),
      );
      await reset(admin);
    }
    const composite = await compositeRows(ctx, ordo, counter, () => standInAutovacuum(admin, vacuumed));
    rows.push(...composite.rows);
    goals.push(composite.goal);
    const idle = await idleTable(ctx, ordo, limiter);
    await ordo.close();

    const handoff = await handoffTable(ctx);
    const story = await storyTable(ctx, admin);
    return [
      {
        title: `throttles — acquire + complete vs RateLimiterPostgres: ${ctx.seconds} s per scenario in ${ctx.rounds} alternating rounds, after ${ctx.warmupSeconds} s warm-up; ${CALLERS} callers, one pool of ${CALLERS}`,
        columns: [
          { header: 'scenario' },
          { header: 'keys' },
          { header: 'ops/s', align: 'right' },
          { header: 'p50 ms', align: 'right' },
          { header: 'p99 ms', align: 'right' },
          { header: 'stmts/op', align: 'right' },
          { header: 'verified' },
          { header: 'ratio' },
        ],
        rows: [
          ...rows.map((r) => [
            r.label,
            r.keys,
            fmt.int(r.load.opsPerSecond),
            fmt.ms(r.load.p50Ms),
            fmt.ms(r.load.p99Ms),
            fmt.fixed(r.load.statements / Math.max(1, r.load.total), 2),
            r.verified.text,
            '',
          ]),
          null,
          ...goals,
        ],
        failures: rows.filter((r) => !r.verified.ok).map((r) => `${r.label} · ${r.keys}: ${r.verified.text}`),
        notes: [
          'ordo: one op = acquire() a permit (a decision on the database clock, a lease, a row per permit) and complete() it',
          "  (its outcome, folded into the key's state by the next decision); with permits: false, acquire() a start (the same",
          '  decision, no permit row; complete() makes no statement). Standalone calls queued while statements are',
          '  in flight share the next statement (throttle_batch: completions, then decisions): on a hot key one lock and one',
          '  commit serve a whole batch. RateLimiterPostgres: one op = consume(key), one INSERT … ON CONFLICT DO UPDATE (fixed window,',
          '  on the Node clock; no lease, no outcome).',
          'verified: ordo — the starts counted by the database equal the permits acquired, and none is left running;',
          '  RateLimiterPostgres — the points stored equal the consume() calls.',
          'composite: acquireAll([{ name: global }, { name: tenant, key }]) + complete, one statement and one permit for both,',
          '  against acquire(global) + acquire(tenant, key) + two completes; 1000 tenant keys.',
          ...(vacuumed
            ? [
                'autovacuum is off on this PostgreSQL: ordo.permits, ordo.throttle_state and the RateLimiterPostgres table were',
                '  vacuumed every second during the acquire + complete and composite scenarios, as autovacuum would (ordo.permits',
                '  asks for it every 5,000 dead rows); without it the permits written, ended and deleted by every op pile up as dead',
                '  rows.',
              ]
            : []),
        ],
      },
      idle,
      handoff,
      story,
    ];
  } finally {
    await admin.end();
    await pool.end();
  }
}

function logged(ctx: BenchContext, r: Row): Row {
  ctx.log(
    `throttles ${r.label} · ${r.keys}: ${fmt.int(r.load.opsPerSecond)} ops/s, p99 ${fmt.ms(r.load.p99Ms)} ms, ${r.verified.text}`,
  );
  return r;
}

async function verifyOrdo(admin: pg.Pool, name: string, acquired: number): Promise<Verified> {
  const { rows } = await admin.query(
    `SELECT (SELECT coalesce(sum(starts), 0) FROM ordo.throttle_state WHERE name = $1) AS starts,
            (SELECT count(*) FROM ordo.permits WHERE name = $1 AND ended_at IS NULL) AS running`,
    [name],
  );
  const starts = Number(rows[0].starts);
  const running = Number(rows[0].running);
  const ok = starts === acquired && running === 0 && acquired > 0;
  return {
    ok,
    text: ok
      ? `✓ ${fmt.int(starts)} starts, 0 running`
      : `✗ ${fmt.int(starts)} starts for ${fmt.int(acquired)} permits, ${running} running`,
  };
}

async function verifyRlf(admin: pg.Pool, consumed: number): Promise<Verified> {
  const { rows } = await admin.query(`SELECT coalesce(sum(points), 0) AS points FROM ${RLF_TABLE}`);
  const points = Number(rows[0].points);
  const ok = points === consumed && consumed > 0;
  return {
    ok,
    text: ok ? `✓ ${fmt.int(points)} points` : `✗ ${fmt.int(points)} points for ${fmt.int(consumed)} calls`,
  };
}

/** Whether the server runs without autovacuum (a CI setting; production runs with it). */
async function vacuumsStandIn(admin: pg.Pool): Promise<boolean> {
  const { rows } = await admin.query(`SELECT current_setting('autovacuum') = 'off' AS off`);
  return rows[0].off === true;
}

/** When `needed`, vacuums both sides' tables every second until stopped, as autovacuum would. */
function standInAutovacuum(admin: pg.Pool, needed: boolean): () => Promise<void> {
  if (!needed) return async () => undefined;
  let running = true;
  const loop = (async () => {
    while (running) {
      await admin.query(`VACUUM ordo.permits, ordo.throttle_state, ${RLF_TABLE}`);
      await sleep(1000);
    }
  })();
  return async () => {
    running = false;
    await loop;
  };
}

async function reset(admin: pg.Pool): Promise<void> {
  await admin.query(`DELETE FROM ${RLF_TABLE}`);
  await admin.query('DELETE FROM ordo.permits WHERE name = ANY ($1)', [[THROTTLE, PLAIN]]);
  await admin.query('DELETE FROM ordo.throttle_state WHERE name = ANY ($1)', [[THROTTLE, PLAIN]]);
  await admin.query(`VACUUM ordo.permits, ordo.throttle_state, ${RLF_TABLE}`);
}

// ─── several limits at once, and the hand-off to a waiter ─────────────────────────────────

const GLOBAL = 'bench_global';
const TENANT = 'bench_tenant';

/** acquireAll of a global and a per-tenant limit against two single acquires, interleaved. */
async function compositeRows(
  ctx: BenchContext,
  ordo: Ordo,
  counter: { count: number },
  vacuums: () => () => Promise<void>,
): Promise<{ rows: Row[]; goal: string[] }> {
  for (const name of [GLOBAL, TENANT])
    await ordo.throttles.define({
      name,
      limit: 1_000_000,
      per: '1s',
      concurrency: 100_000,
      lease: '1m',
      overwrite: true,
    });
  const key = () => MANY.key();
  let composite = 0;
  let singles = 0;
  const stopVacuums = vacuums();
  const measured = await interleave(
    {
      composite: {
        workers: CALLERS,
        statements: () => counter.count,
        op: async () => {
          const p = await ordo.throttles.acquireAll([{ name: GLOBAL }, { name: TENANT, key: key() }]);
          if (!p.granted) throw new Error(`refused: ${p.reason}`);
          await p.complete();
          composite++;
        },
      },
      singles: {
        workers: CALLERS,
        statements: () => counter.count,
        op: async () => {
          const g = await ordo.throttles.acquire(GLOBAL);
          const t = await ordo.throttles.acquire(TENANT, { key: key() });
          if (!g.granted || !t.granted) throw new Error('refused');
          await Promise.all([g.complete(), t.complete()]);
          singles++;
        },
      },
    },
    ctx,
  );
  await stopVacuums();
  const ok = (n: number): Verified => ({ ok: n > 0, text: n > 0 ? `✓ ${fmt.int(n)} granted` : '✗ none' });
  const c = logged(ctx, {
    label: 'ordo acquireAll (2 limits) + complete',
    keys: '1000 keys',
    load: measured.composite.result(),
    verified: ok(composite),
  });
  const t = logged(ctx, {
    label: 'ordo 2 × acquire + 2 × complete',
    keys: '1000 keys',
    load: measured.singles.result(),
    verified: ok(singles),
  });
  return {
    rows: [c, t],
    goal: [
      'goal: composite ≥ 1 × two singles',
      '1000 keys',
      '',
      '',
      '',
      '',
      '',
      ratioCell(c.load.opsPerSecond / t.load.opsPerSecond, 1),
    ],
  };
}

// ─── a session idle in a transaction ─────────────────────────────────────────────────────

/** Seconds at each end of the idle-session run whose rates are compared. */
const IDLE_END_SECONDS = 1;

/**
 * acquire + complete on one key with a concurrency limit, and consume() on one key, each while
 * a session sits idle in a transaction that holds an id (a forgotten psql): nothing either
 * writes can be vacuumed away meanwhile, so each decision reads more dead row versions as the
 * run goes on. Rates in the first and the last second of the run.
 */
async function idleTable(ctx: BenchContext, ordo: Ordo, limiter: RateLimiterPostgres): Promise<Table> {
  const name = 'bench_idle';
  await ordo.throttles.define({
    name,
    limit: 1_000_000,
    per: '1s',
    concurrency: 100_000,
    lease: '1m',
    overwrite: true,
  });
  const ops: Record<string, () => Promise<void>> = {
    'ordo acquire + complete (with a concurrency limit)': async () => {
      const permit = await ordo.throttles.acquire(name, { key: 'idle-hot' });
      if (!permit.granted) throw new Error(`refused: ${permit.reason}`);
      await permit.complete();
    },
    'RateLimiterPostgres consume': async () => {
      await limiter.consume('idle-hot');
    },
  };
  const seconds = Math.max(ctx.seconds, 3 * IDLE_END_SECONDS);
  const rows: string[][] = [];
  for (const [label, op] of Object.entries(ops)) {
    ctx.signal.throwIfAborted();
    const forgotten = await forgottenSession(ctx.url, 'ordo-bench-forgotten-psql');
    try {
      const start = performance.now();
      const until = start + seconds * 1000;
      const ends: number[] = [];
      await Promise.all(
        Array.from({ length: CALLERS }, async () => {
          while (performance.now() < until) {
            await op();
            ends.push(performance.now() - start);
          }
        }),
      );
      const first = ends.filter((t) => t < IDLE_END_SECONDS * 1000).length / IDLE_END_SECONDS;
      const last = ends.filter((t) => t >= (seconds - IDLE_END_SECONDS) * 1000).length / IDLE_END_SECONDS;
      ctx.log(
        `throttles idle session · ${label}: ${fmt.int(first)} → ${fmt.int(last)} ops/s in ${seconds} s`,
      );
      rows.push([label, fmt.int(first), fmt.int(last), fmt.fixed(last / first, 2)]);
    } finally {
      await forgotten.end();
    }
  }
  return {
    title: `throttles — a session idle in a transaction for the whole run: one hot key, ${CALLERS} callers, ${seconds} s each`,
    columns: [
      { header: 'scenario' },
      { header: `first ${IDLE_END_SECONDS} s, ops/s`, align: 'right' },
      { header: `last ${IDLE_END_SECONDS} s, ops/s`, align: 'right' },
      { header: 'last ÷ first', align: 'right' },
    ],
    rows,
    failures: [],
    notes: [
      'the idle session holds a transaction id (BEGIN; SELECT pg_current_xact_id()): no row version written after it began can',
      "  be vacuumed away while it is open, so both slow down as the dead versions of the key pile up: the key's state row",
      "  (ordo) or counter row (RateLimiterPostgres), and ordo's ended permits, which a decision looks through for those ended",
      "  since the last one. The live units of a key are a counter in its state row, not a count of the lease's permits.",
    ],
  };
}

const HANDOFF_WAITERS = 8;

/**
 * A freed slot taken by a waiter: a throttle of concurrency 1, and waiters in two clients
 * (each with its own pool and LISTEN connection) always in line. Each grant is timed from the
 * moment the previous holder called complete() to the moment the next waiter holds its permit.
 */
async function handoffTable(ctx: BenchContext): Promise<Table> {
  const clients = [await createOrdo({ databaseUrl: ctx.url }), await createOrdo({ databaseUrl: ctx.url })];
  const name = 'bench_handoff';
  await clients[0]!.throttles.define({ name, concurrency: 1, lease: '1m', overwrite: true });
  const histogram = createHistogram();
  let handoffs = 0;
  let released = 0;
  const until = performance.now() + (ctx.warmupSeconds + ctx.seconds) * 1000;
  const from = performance.now() + ctx.warmupSeconds * 1000;
  const overlapping = { now: 0, max: 0 };
  try {
    await Promise.all(
      Array.from({ length: HANDOFF_WAITERS }, async (_, w) => {
        const ordo = clients[w % clients.length]!;
        while (performance.now() < until) {
          const p = await ordo.throttles.acquire(name, { wait: '30s', holder: `waiter-${w}` });
          if (!p.granted) throw new Error(`a waiter was refused: ${p.reason}`);
          const now = performance.now();
          if (released > 0 && now >= from && now < until) {
            histogram.record(Math.max(1, Math.round((now - released) * 1e6)));
            handoffs++;
          }
          overlapping.max = Math.max(overlapping.max, ++overlapping.now);
          await sleep(1);
          overlapping.now--;
          released = performance.now();
          await p.complete();
        }
      }),
    );
  } finally {
    await Promise.all(clients.map((c) => c.close()));
  }
  const p99 = histogram.percentile(99) / 1e6;
  ctx.log(`throttles hand-off to a waiter: ${handoffs} hand-offs, p99 ${fmt.ms(p99)} ms`);
  return {
    title: `throttles — a freed slot taken by a waiter: concurrency 1, ${HANDOFF_WAITERS} waiters in two clients always in line, ${ctx.seconds} s`,
    columns: [
      { header: 'hand-offs', align: 'right' },
      { header: 'p50 ms', align: 'right' },
      { header: 'p99 ms', align: 'right' },
      { header: 'max ms', align: 'right' },
      { header: 'most running at once', align: 'right' },
      { header: 'goal: p99 ≤ 20 ms' },
    ],
    rows: [
      [
        fmt.int(handoffs),
        fmt.ms(histogram.percentile(50) / 1e6),
        fmt.ms(p99),
        fmt.ms(histogram.max / 1e6),
        String(overlapping.max),
        p99 <= 20 ? '✓' : '✗',
      ],
    ],
    failures: [
      ...(overlapping.max > 1 ? [`${overlapping.max} permits of a concurrency-1 throttle ran at once`] : []),
      ...(handoffs === 0 ? ['no hand-off was measured'] : []),
    ],
    notes: [
      'from complete() of the holder to the next waiter holding its permit: the end wakes the line (NOTIFY), a waiter serves it',
      "  (throttle_wait: the line's next waiter is granted in the database) and the grant reaches its own process (NOTIFY).",
    ],
  };
}

// ─── the FOO story ───────────────────────────────────────────────────────────────────────

const EVERY_MS = 200;
const WORKERS = 50;
const INSTANCES = 5;
/** Ten queued tasks; three last longer than the interval. */
const TASKS = [20, 300, 20, 20, 350, 20, 20, 250, 20, 20];

interface Start {
  start: number;
  end: number;
  task: number | null;
}

/** Runs one approach until the ten tasks are done; every start with its database times. */
type Approach = (claim: () => Promise<{ id: number; ms: number } | undefined>) => Promise<Start[]>;

async function storyTable(ctx: BenchContext, admin: pg.Pool): Promise<Table> {
  await admin.query(`
    CREATE TABLE bench_story_tasks (id integer PRIMARY KEY, duration_ms integer NOT NULL);
    CREATE TABLE bench_task_keys (task text PRIMARY KEY, last_started timestamptz, running boolean NOT NULL DEFAULT false);`);
  const pool = new pg.Pool({ connectionString: ctx.url, max: 20, application_name: 'ordo-bench-story' });
  pool.on('error', () => undefined);
  const instances: Ordo[] = [];
  try {
    for (let i = 0; i < INSTANCES; i++)
      instances.push(await createOrdo({ databaseUrl: ctx.url, poolSize: 4 }));
    await instances[0]!.throttles.define({
      name: 'FOO',
      every: `${EVERY_MS}ms`,
      concurrency: 1,
      lease: '1m',
    });
    const approaches: [string, Approach][] = [
      ['naive: SELECT, then UPDATE if allowed', naive(pool)],
      ['conditional UPDATE … WHERE last < now() − interval', conditional(pool)],
      ['ordo acquire / complete (every + concurrency 1)', ordoStory(instances)],
    ];
    const rows: string[][] = [];
    const failures: string[] = [];
    for (const [label, approach] of approaches) {
      ctx.signal.throwIfAborted();
      await admin.query('TRUNCATE bench_story_tasks, bench_task_keys');
      await admin.query(`INSERT INTO bench_task_keys (task) VALUES ('FOO')`);
      await admin.query(
        'INSERT INTO bench_story_tasks SELECT i, d FROM unnest($1::int[]) WITH ORDINALITY AS u(d, i)',
        [TASKS],
      );
      const claim = async () => {
        const { rows: claimed } = await pool.query(
          `DELETE FROM bench_story_tasks WHERE id = (SELECT id FROM bench_story_tasks ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
           RETURNING id, duration_ms`,
        );
        return claimed[0] ? { id: claimed[0].id as number, ms: claimed[0].duration_ms as number } : undefined;
      };
      const t0 = performance.now();
      const starts = await approach(claim);
      const seconds = (performance.now() - t0) / 1000;
      const v = violations(starts);
      const tasks = starts.filter((s) => s.task !== null).length;
      const isOrdo = label.startsWith('ordo');
      if (isOrdo && (v.tooClose > 0 || v.overlapping > 0)) {
        failures.push(
          `${label}: ${v.tooClose} starts closer than ${EVERY_MS} ms, ${v.overlapping} running at once`,
        );
      }
      if (tasks !== TASKS.length) failures.push(`${label}: ${tasks} of ${TASKS.length} tasks ran`);
      ctx.log(
        `throttles story · ${label}: ${starts.length} starts, ${v.tooClose} too close, ${v.overlapping} overlapping`,
      );
      rows.push([
        label,
        String(starts.length),
        `${tasks}/${TASKS.length}`,
        String(v.tooClose),
        String(v.overlapping),
        fmt.fixed(seconds, 1),
        isOrdo
          ? v.tooClose + v.overlapping === 0
            ? '✓ none'
            : '✗'
          : v.tooClose + v.overlapping > 0
            ? 'violates (expected)'
            : '— none this run',
      ]);
    }
    return {
      title: `throttles — the FOO story: ${WORKERS} workers (${INSTANCES} ordo instances for ordo) released at once on "FOO every ${EVERY_MS} ms, one at a time", ${TASKS.length} queued tasks of ${TASKS.join('/')} ms`,
      columns: [
        { header: 'approach' },
        { header: 'starts', align: 'right' },
        { header: 'tasks', align: 'right' },
        { header: `< ${EVERY_MS} ms apart`, align: 'right' },
        { header: 'two running', align: 'right' },
        { header: 's', align: 'right' },
        { header: 'violations' },
      ],
      rows,
      failures,
      notes: [
        'A start is counted from the database times each approach records (its UPDATE / acquire, and the end of its task).',
        '"< interval apart": consecutive starts closer than the interval; "two running": a start before the previous task ended.',
        'naive: each worker reads last_started and running, and when allowed writes them: two workers read before either writes.',
        'conditional UPDATE: one start per interval is enforced, but a task longer than the interval overlaps the next one.',
      ],
    };
  } finally {
    await Promise.all(instances.map((o) => o.close()));
    await pool.end();
  }
}

function violations(starts: Start[]): { tooClose: number; overlapping: number } {
  const sorted = [...starts].sort((a, b) => a.start - b.start);
  let tooClose = 0;
  let overlapping = 0;
  for (let i = 1; i < sorted.length; i++) {
    if (sorted[i]!.start - sorted[i - 1]!.start < EVERY_MS) tooClose++;
    // Any earlier task still running at this start.
    if (sorted.slice(0, i).some((s) => s.end > sorted[i]!.start)) overlapping++;
  }
  return { tooClose, overlapping };
}

/** Workers loop until every task has run; each returns its starts. */
async function workers(loop: (starts: Start[], allDone: () => boolean) => Promise<void>): Promise<Start[]> {
  const starts: Start[] = [];
  const allDone = () => starts.filter((s) => s.task !== null).length >= TASKS.length;
  await Promise.all(Array.from({ length: WORKERS }, () => loop(starts, allDone)));
  return starts;
}

const time = (d: Date) => d.getTime();

function naive(pool: pg.Pool): Approach {
  return (claim) =>
    workers(async (starts, allDone) => {
      while (!allDone()) {
        const { rows } = await pool.query(
          `SELECT last_started, running, clock_timestamp() AS now FROM bench_task_keys WHERE task = 'FOO'`,
        );
        const {
          last_started: last,
          running,
          now,
        } = rows[0] as { last_started: Date | null; running: boolean; now: Date };
        if (running || (last && time(now) - time(last) < EVERY_MS)) {
          await sleep(running ? 10 : Math.max(1, time(last!) + EVERY_MS - time(now)));
          continue;
        }
        const started = await pool.query(
          `UPDATE bench_task_keys SET last_started = clock_timestamp(), running = true WHERE task = 'FOO' RETURNING last_started`,
        );
        const task = await claim();
        if (task) await sleep(task.ms);
        const ended = await pool.query(
          `UPDATE bench_task_keys SET running = false WHERE task = 'FOO' RETURNING clock_timestamp() AS ended`,
        );
        starts.push({
          start: time(started.rows[0].last_started),
          end: time(ended.rows[0].ended),
          task: task?.id ?? null,
        });
      }
    });
}

function conditional(pool: pg.Pool): Approach {
  return (claim) =>
    workers(async (starts, allDone) => {
      while (!allDone()) {
        const { rows } = await pool.query(
          `UPDATE bench_task_keys SET last_started = clock_timestamp()
            WHERE task = 'FOO' AND (last_started IS NULL OR last_started <= clock_timestamp() - $1 * interval '1 millisecond')
           RETURNING last_started`,
          [EVERY_MS],
        );
        if (!rows[0]) {
          await sleep(20);
          continue;
        }
        const task = await claim();
        if (task) await sleep(task.ms);
        const ended = await pool.query('SELECT clock_timestamp() AS ended');
        starts.push({
          start: time(rows[0].last_started),
          end: time(ended.rows[0].ended),
          task: task?.id ?? null,
        });
      }
    });
}

function ordoStory(instances: Ordo[]): Approach {
  let next = 0;
  return (claim) =>
    workers(async (starts, allDone) => {
      const ordo = instances[next++ % instances.length]!;
      while (!allDone()) {
        const got = await ordo.throttles.acquire('FOO');
        if (!got.granted) {
          await sleep(got.retryAfterMs);
          continue;
        }
        const task = await claim();
        if (task) await sleep(task.ms);
        const end = await got.complete();
        starts.push({ start: time(got.acquiredAt), end: time(end.endedAt), task: task?.id ?? null });
      }
    });
}

export const throttles: Suite = { name: 'throttles', run };
