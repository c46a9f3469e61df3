// Batched sequences under attack: several nodes (processes and in-process instances), SQL
// callers, redefinitions, removals, lost notifications, lock waits. Every test can fail: each
// asserts the guarantee itself (uniqueness, never backwards, bounded time), not a symptom.
import { type ChildProcessWithoutNullStreams, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo, OrdoError } from '../src/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { MAX_RANGES_PER_RESERVATION } from '../src/sequences/batched.js';
import { drawer, duplicates, maxOf, range } from './support/drawer.js';
import { until } from './support/until.js';

const TIMEOUT_MESSAGE = 'The query was not executed because it exceeded the timeout';
const MAX = 9007199254740991;

let db: TestDatabase;
let main: Ordo;
let raw: pg.Pool;
/** Instances and pools opened by a test, closed after it. */
let nodes: Ordo[] = [];
let pools: pg.Pool[] = [];

beforeAll(async () => {
  db = await freshDatabase();
  main = await createOrdo({ databaseUrl: db.url, poolSize: 4 });
  raw = db.pool(12);
});
afterEach(async () => {
  await Promise.all(nodes.map((n) => n.close().catch(() => undefined)));
  nodes = [];
  await Promise.all(pools.map((p) => p.end().catch(() => undefined)));
  pools = [];
});
afterAll(async () => {
  await main?.close();
  await db?.drop();
});

/** One more node: its own ordo instance, pool and LISTEN connection. */
async function node(options: { nodeId?: string; pool?: pg.Pool; poolSize?: number } = {}): Promise<Ordo> {
  const n = options.pool
    ? await createOrdo({ pool: options.pool, nodeId: options.nodeId })
    : await createOrdo({ databaseUrl: db.url, poolSize: options.poolSize ?? 3, nodeId: options.nodeId });
  nodes.push(n);
  return n;
}

const strictlyIncreasing = (xs: number[]) => xs.every((x, i) => i === 0 || x > xs[i - 1]!);
/** A pool of one's own, ended after the test; `Client` is the class of every connection. */
function ownPool(max: number, Client: typeof pg.Client = pg.Client): pg.Pool {
  const pool = new pg.Pool({ connectionString: db.url, max, Client });
  pool.on('error', () => undefined);
  pools.push(pool);
  return pool;
}

/**
 * A pool that counts the reservation statements sent through it: on its own connections and
 * on any connection ordo opens with the pool's Client class (a node's dedicated one).
 */
function countingPool(max = 4) {
  const counter = { pool: undefined as unknown as pg.Pool, reserves: 0 };
  class CountingClient extends pg.Client {
    override query(...args: any[]): any {
      const first = args[0] as string | { text?: string } | undefined;
      const text = typeof first === 'string' ? first : first?.text;
      if (text?.includes('.reserve(')) counter.reserves++;
      return (super.query as (...a: unknown[]) => unknown).apply(this, args);
    }
  }
  counter.pool = ownPool(max, CountingClient);
  return counter;
}

async function ownership(name: string, nodeId?: string) {
  const { rows } = await raw.query(
    `SELECT node_id, first, last, epoch FROM ordo.sequence_batches
      WHERE sequence = $1 AND ($2::uuid IS NULL OR node_id = $2::uuid) ORDER BY first`,
    [name, nodeId ?? null],
  );
  return rows.map((r) => ({
    nodeId: r.node_id as string,
    first: Number(r.first),
    last: Number(r.last),
    epoch: Number(r.epoch),
  }));
}

/** Is v inside one of the (sorted, disjoint) ranges? */
function inRanges(v: number, ranges: { first: number; last: number }[]): boolean {
  let lo = 0;
  let hi = ranges.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    const r = ranges[mid]!;
    if (v < r.first) hi = mid - 1;
    else if (v > r.last) lo = mid + 1;
    else return true;
  }
  return false;
}

async function sqlNextval(name: string, client: pg.Pool | pg.PoolClient = raw): Promise<number> {
  const { rows } = await client.query('SELECT ordo.nextval($1) AS v', [name]);
  return Number(rows[0].v);
}

async function lockWaiters(like: string): Promise<number> {
  const { rows } = await raw.query(
    `SELECT count(*)::int AS n FROM pg_stat_activity
      WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1`,
    [like],
  );
  return rows[0].n;
}

/** Defines through SQL, as another language would (ordo.define_sequence). */
const defineSql = (name: string, batch: number, timeoutMs: number | null, mode: string, start = 0) =>
  `SELECT * FROM ordo.define_sequence('${name}', 'batched', ${start}, 1, ${start}, ${MAX}, false, ${batch}, ${
    timeoutMs ?? 'NULL'
  }, 'never', 'UTC', NULL, '${mode}')`;

// ---------------------------------------------------------------------------------------------

/** One node in a child process (test/support/batched-node.ts), fed `go` / `stop` on stdin. */
class NodeProcess {
  readonly values: number[] = [];
  readonly ready: Promise<void>;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  private readonly child: ChildProcessWithoutNullStreams;
  private output = '';
  private errors = '';
  done: number | undefined;

  constructor(
    name: string,
    readonly nodeId: string,
    options: { limit?: number; chunk?: number; pauseMs?: number },
  ) {
    const args = [db.url, name, nodeId, String(options.limit ?? 'Infinity'), String(options.chunk ?? 700)];
    args.push(String(options.pauseMs ?? 5));
    this.child = spawn(process.execPath, ['--import', 'tsx', 'test/support/batched-node.ts', ...args], {
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    // 'close': exited, and everything it wrote has been read.
    this.exited = new Promise((resolve) => {
      this.child.on('close', (code, signal) => resolve({ code, signal }));
    });
    this.child.stdin.on('error', () => undefined); // a `stop` sent to a node already gone
    this.ready = new Promise((resolve, reject) => {
      this.child.stdout.setEncoding('utf8');
      this.child.stdout.on('data', (text: string) => {
        this.output += text;
        for (let i = this.output.indexOf('\n'); i >= 0; i = this.output.indexOf('\n')) {
          const line = this.output.slice(0, i);
          this.output = this.output.slice(i + 1);
          if (line === 'ready') resolve();
          else if (line.startsWith('v '))
            for (const v of line.slice(2).split(',')) this.values.push(Number(v));
          else if (line.startsWith('done ')) this.done = Number(line.slice(5));
          else this.errors += `${line}\n`;
        }
      });
      this.child.stderr.on('data', (chunk: Buffer) => {
        this.errors += chunk.toString();
      });
      void this.exited.then(({ code }) => reject(new Error(`node exited with ${code}: ${this.errors}`)));
    });
  }

  send(command: 'go' | 'stop'): void {
    this.child.stdin.write(`${command}\n`);
  }

  kill(): Promise<unknown> {
    this.child.kill('SIGKILL');
    return this.exited;
  }

  async finish(): Promise<void> {
    const { code } = await this.exited;
    if (code !== 0) throw new Error(`node exited with ${code}: ${this.errors}`);
  }
}

describe('several processes, one sequence', () => {
  it('3 processes draw hundreds of thousands of values: unique, increasing per process; a node killed with SIGKILL and restarted never repeats a value (its unused range is a gap)', async () => {
    const name = 'fleet';
    await main.sequences.define({ name, kind: 'batched', batch: 1000 });
    const [idA, idB, idC] = [randomUUID(), randomUUID(), randomUUID()];
    const a = new NodeProcess(name, idA, {});
    const b = new NodeProcess(name, idB, {});
    const c = new NodeProcess(name, idC, {});
    const all = [a, b, c];
    try {
      await Promise.all(all.map((p) => p.ready));
      for (const p of all) p.send('go');
      // C is killed mid-way, while A and B keep drawing.
      await until('C has drawn 60,000 values', () => c.values.length >= 60_000, 20_000);
      const beforeKill = [a.values.length, b.values.length];
      await c.kill();
      const killedRanges = await ownership(name, idC);
      const printedByC = [...c.values];

      // Restarted: a new process, the same node id.
      const c2 = new NodeProcess(name, idC, { limit: 60_000 });
      all.push(c2);
      await c2.ready;
      c2.send('go');
      await c2.finish();
      await until(
        'A and B have drawn 150,000 values each',
        () => a.values.length >= 150_000 && b.values.length >= 150_000,
        20_000,
      );
      a.send('stop');
      b.send('stop');
      await Promise.all([a.finish(), b.finish()]);

      expect(a.done).toBe(a.values.length);
      expect(b.done).toBe(b.values.length);
      expect(c2.values).toHaveLength(60_000);
      // A and B really drew at the same time as C and as its restarted self.
      expect(a.values.length).toBeGreaterThan(beforeKill[0]!);
      expect(b.values.length).toBeGreaterThan(beforeKill[1]!);
      const total = a.values.length + b.values.length + printedByC.length + c2.values.length;
      expect(total).toBeGreaterThan(400_000);

      for (const p of [a.values, b.values, printedByC, c2.values]) expect(strictlyIncreasing(p)).toBe(true);
      expect(duplicates(a.values, b.values, printedByC, c2.values)).toEqual([]);

      // The restarted node never serves from the ranges its killed self held: they are a gap.
      const intoKilled = c2.values.filter((v) => inRanges(v, killedRanges));
      expect(intoKilled).toEqual([]);
      const printed = new Set(printedByC);
      const unused = killedRanges.reduce(
        (n, r) => n + range(r.first, r.last).filter((v) => !printed.has(v)).length,
        0,
      );
      expect(unused).toBeGreaterThan(0);

      // Every value comes from a range its own node reserved.
      for (const [p, id] of [
        [a, idA],
        [b, idB],
        [c2, idC],
      ] as const) {
        const ranges = await ownership(name, id);
        expect(p.values.filter((v) => !inRanges(v, ranges))).toEqual([]);
      }
      expect(printedByC.filter((v) => !inRanges(v, killedRanges))).toEqual([]);
    } finally {
      await Promise.all(all.map((p) => p.kill()));
    }
  });
});

describe('redefinition and removal while nodes hold ranges', () => {
  it('OVERWRITE with a smaller batch and a START far below: no value twice, and new values above everything handed out before', async () => {
    const name = 'reshaped';
    await main.sequences.define({ name, kind: 'batched', batch: 1000, start: 1_000_000 });
    const [n1, n2, redefiner] = [await node(), await node(), await node()];
    const d1 = drawer(n1, name, { every: 50 });
    const d2 = drawer(n2, name, { every: 50 });
    await until('both nodes draw', () => d1.values.length >= 3000 && d2.values.length >= 3000);
    const seenBefore = [...d1.values, ...d2.values];
    const firstEpoch = (await redefiner.sequences.get(name))!.epoch;
    const def = await redefiner.sequences.define({
      name,
      kind: 'batched',
      batch: 100,
      start: 0,
      overwrite: true,
    });
    const overwritten = performance.now();
    // Notifications take milliseconds, the epoch check 2 s: after 2.5 s every node has heard.
    await sleep(2500);
    const settled = performance.now();
    await sleep(400);
    await Promise.all([d1.stop(), d2.stop()]);
    expect(d1.error).toBeUndefined();
    expect(d2.error).toBeUndefined();

    expect(def.batch).toBe(100);
    expect(def.epoch).not.toBe(firstEpoch);
    // Never backwards: START 0 was raised above every value that could have been handed out.
    expect(def.start).toBeGreaterThan(maxOf(seenBefore));
    const reservedBefore = (await ownership(name)).filter((r) => r.epoch === firstEpoch);
    expect(def.start).toBeGreaterThan(maxOf(reservedBefore.map((r) => r.last)));
    expect(duplicates(d1.values, d2.values)).toEqual([]);
    for (const d of [d1, d2]) {
      expect(strictlyIncreasing(d.values)).toBe(true);
      const after = d.values.filter((_, i) => d.times[i]! > settled);
      expect(after.length).toBeGreaterThan(0);
      expect(after.filter((v) => v < def.start)).toEqual([]);
      // Anything below the new START was served from a range reserved before the overwrite.
      const old = (await ownership(name)).filter((r) => r.epoch === firstEpoch);
      expect(d.values.filter((v) => v < def.start && !inRanges(v, old))).toEqual([]);
      expect(d.values.filter((_, i) => d.times[i]! > overwritten).length).toBeGreaterThan(0);
    }
    // The new ranges are of the new size, and above the new START.
    const fresh = (await ownership(name)).filter((r) => r.epoch === def.epoch);
    expect(fresh.length).toBeGreaterThan(0);
    for (const r of fresh) {
      expect(r.last - r.first).toBe(99);
      expect(r.first).toBeGreaterThanOrEqual(def.start);
    }
    expect(await sqlNextval(name)).toBeGreaterThan(maxOf(d1.values, d2.values));
  });

  it('REMOVE while nodes hold a range of 1,000,000: every node stops serving with sequence_not_found within seconds', async () => {
    const name = 'vanishing';
    await main.sequences.define({ name, kind: 'batched', batch: 1_000_000 });
    const [n1, n2, remover] = [await node(), await node(), await node()];
    const d1 = drawer(n1, name);
    const d2 = drawer(n2, name);
    await until('both nodes draw', () => d1.values.length >= 2000 && d2.values.length >= 2000);
    expect(await remover.sequences.remove(name)).toBe(true);
    const removed = performance.now();
    // Bounded wait: a node that keeps serving from its range fails here.
    await Promise.race([
      Promise.all([d1.done, d2.done]),
      sleep(10_000).then(() => {
        throw new Error(`still serving 10 s after REMOVE: ${d1.values.length}, ${d2.values.length} values`);
      }),
    ]);
    for (const d of [d1, d2]) {
      expect(d.error).toBeInstanceOf(OrdoError);
      expect(d.error).toMatchObject({ code: 'sequence_not_found' });
      // The NOTIFY reaches every node in milliseconds once the removal committed (the epoch check
      // alone could take 2 s); the removal itself may wait behind the nodes' reservations.
      expect(d.stoppedAt! - removed).toBeLessThan(1500);
      // Nothing long after the removal committed: at most what was in flight at that moment.
      expect(d.times.filter((t) => t > removed + 1000)).toEqual([]);
    }
    expect(duplicates(d1.values, d2.values)).toEqual([]);
    await expect(n1.nextval(name)).rejects.toMatchObject({ code: 'sequence_not_found' });
    await expect(n2.sequences.next(name)).rejects.toMatchObject({ code: 'sequence_not_found' });
    expect(await ownership(name)).toEqual([]);
  });

  it('a missed notification cannot keep a range alive: LISTEN connections terminated as the sequence is removed', async () => {
    const name = 'unheard';
    await main.sequences.define({ name, kind: 'batched', batch: 1_000_000 });
    const [n1, n2, remover] = [await node(), await node(), await node()];
    const d1 = drawer(n1, name);
    const d2 = drawer(n2, name);
    await until('both nodes draw', () => d1.values.length >= 2000 && d2.values.length >= 2000);
    const listeners = `SELECT pid FROM pg_stat_activity
      WHERE datname = current_database() AND query LIKE 'LISTEN %' AND pid <> pg_backend_pid()`;
    // A node serves from its range before its LISTEN connection is up (the epoch check covers
    // that moment); this test is about notifications lost, so both must be listening first.
    await until('both nodes listen', async () => (await raw.query(listeners)).rows.length >= 2);
    const removing = performance.now();
    await Promise.all([
      raw.query(`SELECT pg_terminate_backend(pid) FROM (${listeners}) AS l`),
      remover.sequences.remove(name),
    ]);
    await Promise.race([
      Promise.all([d1.done, d2.done]),
      sleep(10_000).then(() => {
        throw new Error('a node kept serving 10 s after REMOVE with its notification lost');
      }),
    ]);
    for (const d of [d1, d2]) {
      expect(d.error).toMatchObject({ code: 'sequence_not_found' });
      expect(d.stoppedAt! - removing).toBeLessThan(5000);
    }
  });

  it('a change made without any NOTIFY (row deleted by hand) is found by the epoch check within seconds', async () => {
    const name = 'silent_delete';
    await main.sequences.define({ name, kind: 'batched', batch: 1_000_000 });
    const n1 = await node();
    const d1 = drawer(n1, name);
    await until('the node draws', () => d1.values.length >= 2000);
    const deleting = performance.now();
    await raw.query('DELETE FROM ordo.sequences WHERE name = $1', [name]);
    await Promise.race([
      d1.done,
      sleep(10_000).then(() => {
        throw new Error('the node kept serving 10 s after its sequence was deleted');
      }),
    ]);
    expect(d1.error).toMatchObject({ code: 'sequence_not_found' });
    // One epoch check (every 2 s) plus a margin.
    expect(d1.stoppedAt! - deleting).toBeLessThan(4500);
  });

  it('an epoch bumped without any NOTIFY makes the node drop its held range within seconds (a gap, values jump)', async () => {
    const name = 'silent_bump';
    await main.sequences.define({ name, kind: 'batched', batch: 1_000_000 });
    const n1 = await node();
    const d1 = drawer(n1, name);
    await until('the node draws', () => d1.values.length >= 2000);
    const { rows } = await raw.query(
      `UPDATE ordo.sequences SET epoch = epoch + 1 WHERE name = $1
       RETURNING ordo.storage_position(storage) AS position`,
      [name],
    );
    const position = Number(rows[0].position);
    const bumped = performance.now();
    await until('the node serves from a new range', () => (d1.values.at(-1) ?? 0) >= position, 4500);
    expect(performance.now() - bumped).toBeLessThan(4500);
    await d1.stop();
    expect(d1.error).toBeUndefined();
    expect(strictlyIncreasing(d1.values)).toBe(true);
    // Held at the time: [0 … 999,999] and its spare; both are dropped, not finished.
    expect(d1.values.filter((v) => v < position).length).toBeLessThan(1_000_000);
  });

  it('a node whose LISTEN was not yet up does not miss REMOVE + re-CREATE: no value is served twice', async () => {
    // The LISTEN connection is opened on first use, asynchronously, while the first ranges are
    // already reserved. Whatever is notified before it listens is lost (the first LISTEN does
    // not reset); a re-created sequence gets an epoch never used before, so the epoch check
    // sees the change anyway.
    const name = 'reborn';
    await main.sequences.define({ name, kind: 'batched', batch: 1000 });
    // Every connection of this node's pool sends LISTEN 1.5 s late (a slow network, TLS…).
    class SlowListen extends pg.Client {
      override query(...args: any[]): any {
        const query = (super.query as (...a: unknown[]) => unknown).bind(this);
        if (typeof args[0] === 'string' && args[0].startsWith('LISTEN')) {
          return sleep(1500).then(() => query(...args));
        }
        return query(...args);
      }
    }
    const slow = await node({ pool: ownPool(3, SlowListen) });
    const before = [await slow.nextval(name)];
    await sleep(50); // the prefetched range arrives
    await main.sequences.remove(name);
    await main.sequences.define({ name, kind: 'batched', batch: 1000 });
    // Long enough for the LISTEN to be up and for an epoch check to run.
    await sleep(2600);
    const fromOther: number[] = [];
    const fromSlow: number[] = [];
    for (let i = 0; i < 2500; i++) {
      fromOther.push(await main.nextval(name));
      fromSlow.push(await slow.nextval(name));
    }
    expect(before).toEqual([0]);
    // Within the re-created sequence, no value twice.
    expect(duplicates(fromOther, fromSlow)).toEqual([]);
  });
});

describe('lock waits and TIMEOUT', () => {
  it('a reservation blocked by a redefinition in an open transaction fails with timeout after TIMEOUT (1 s)', async () => {
    const name = 'locked';
    await main.sequences.define({ name, kind: 'batched', batch: 100, timeout: 1000 });
    const blocker = await raw.connect();
    try {
      await blocker.query('BEGIN');
      await blocker.query(defineSql(name, 100, 1000, 'overwrite'));
      const fresh = await node();
      const began = performance.now();
      const error = await Promise.race([
        fresh.nextval(name).then(
          (v) => v,
          (e: unknown) => e,
        ),
        sleep(6000).then(() => 'still waiting after 6 s'),
      ]);
      const took = performance.now() - began;
      expect(error).toBeInstanceOf(OrdoError);
      // As SurrealDB 3 words it: the timeout follows the message.
      expect(error).toMatchObject({ code: 'timeout', message: `${TIMEOUT_MESSAGE}: 1s` });
      expect(took).toBeGreaterThanOrEqual(800);
      expect(took).toBeLessThan(3500);
      // With the blocker gone, the same node reserves at once.
      await blocker.query('ROLLBACK');
      const after = performance.now();
      expect(await fresh.nextval(name)).toBe(0);
      expect(performance.now() - after).toBeLessThan(1000);
    } finally {
      await blocker.query('ROLLBACK').catch(() => undefined);
      blocker.release();
    }
  });

  it("TIMEOUT given as '1s' bounds the wait the same way, and the caller's own lock_timeout is left alone", async () => {
    const name = 'locked_text';
    const def = await main.sequences.define({ name, kind: 'batched', batch: 100, timeout: '1s' });
    expect(def.timeoutMs).toBe(1000);
    const blocker = await raw.connect();
    try {
      await blocker.query('BEGIN');
      await blocker.query(defineSql(name, 100, 1000, 'overwrite'));
      const fresh = await node();
      const began = performance.now();
      const next = fresh.sequences.next(name);
      await expect(
        Promise.race([next, sleep(6000).then(() => 'still waiting after 6 s')]),
      ).rejects.toMatchObject({
        code: 'timeout',
        message: `${TIMEOUT_MESSAGE}: 1s`,
      });
      const took = performance.now() - began;
      expect(took).toBeGreaterThanOrEqual(800);
      expect(took).toBeLessThan(3500);
    } finally {
      await blocker.query('ROLLBACK');
      blocker.release();
    }
    const c = await raw.connect();
    try {
      await c.query('BEGIN');
      await c.query("SET LOCAL lock_timeout = '7s'");
      await c.query("SELECT * FROM ordo.reserve($1, '00000000-0000-4000-8000-000000000000', 50)", [name]);
      expect((await c.query('SHOW lock_timeout')).rows[0].lock_timeout).toBe('7s');
      await c.query('ROLLBACK');
    } finally {
      c.release();
    }
  });

  it('TIMEOUT 0 fails at once with timeout, without sending any reservation', async () => {
    const name = 'instant';
    await main.sequences.define({ name, kind: 'batched', timeout: 0 });
    const counting = countingPool();
    const n = await node({ pool: counting.pool });
    const began = performance.now();
    await expect(n.nextval(name)).rejects.toMatchObject({
      code: 'timeout',
      message: `${TIMEOUT_MESSAGE}: 0ns`,
    });
    await expect(n.sequences.nextMany(name, 3)).rejects.toMatchObject({ code: 'timeout' });
    expect(performance.now() - began).toBeLessThan(500);
    expect(counting.reserves).toBe(0);
  });
});

describe('SQL callers and round trips', () => {
  it('SQL ordo.nextval() interleaved with two nodes drawing: all values unique', async () => {
    const name = 'mixed';
    await main.sequences.define({ name, kind: 'batched', batch: 500 });
    const [n1, n2] = [await node(), await node()];
    const d1 = drawer(n1, name, { every: 200, pauseMs: 0, limit: 60_000 });
    const d2 = drawer(n2, name, { every: 200, pauseMs: 0, limit: 60_000 });
    const sql: number[] = [];
    const loops = range(1, 4).map(async () => {
      for (let i = 0; i < 150; i++) sql.push(await sqlNextval(name));
    });
    await Promise.all([...loops, d1.done, d2.done]);
    expect(d1.error).toBeUndefined();
    expect(d2.error).toBeUndefined();
    expect(d1.values).toHaveLength(60_000);
    expect(sql).toHaveLength(600);
    expect(duplicates(d1.values, d2.values, sql)).toEqual([]);
    // From SQL: the first value of a fresh block each time.
    expect(sql.filter((v) => v % 500 !== 0)).toEqual([]);
    expect(strictlyIncreasing(d1.values) && strictlyIncreasing(d2.values)).toBe(true);
  });

  it('ranges of a batch each, several per statement when the node needs them: 50,000 values with batch 1000 take 50 ranges and fewer statements; ownership rows carry the node id; collect_batches deletes them', async () => {
    const name = 'counted';
    await main.sequences.define({ name, kind: 'batched', batch: 1000 });
    const nodeId = '5f0c6a1e-3b2d-4c8e-9a7f-0123456789ab';
    const counting = countingPool();
    const n = await node({ pool: counting.pool, nodeId });
    expect(n.nodeId).toBe(nodeId);
    // 50 callers at once, 1000 values each.
    const values: number[] = [];
    await Promise.all(
      range(1, 50).map(async () => {
        for (let i = 0; i < 1000; i++) values.push(await n.nextval(name));
      }),
    );
    await n.sequences.idle();
    expect([...values].sort((x, y) => x - y)).toEqual(range(0, 49_999));
    // 50 callers waiting at once: each statement asks for twice the ranges of the one before.
    expect(counting.reserves).toBeLessThan(20);
    const rows = await ownership(name);
    expect(rows.length).toBeGreaterThanOrEqual(50);
    // Ahead of what was used, at most the last two statements' ranges.
    expect(rows.length).toBeLessThanOrEqual(50 + 2 * MAX_RANGES_PER_RESERVATION);
    expect(n.sequences.reservations.get(name)).toBe(rows.length);
    const { epoch } = (await n.sequences.get(name))!;
    rows.forEach((r, i) => {
      expect(r).toEqual({ nodeId, first: i * 1000, last: i * 1000 + 999, epoch });
    });
    const { rows: collected } = await raw.query("SELECT ordo.collect_batches('0 seconds') AS n");
    expect(Number(collected[0].n)).toBeGreaterThanOrEqual(rows.length);
    expect(await ownership(name)).toEqual([]);
  });
});

describe('a clean close gives the unused rest back, never a value twice', () => {
  it('a node that closes hands back its range only while no later range exists: nodes closing and drawing at once, SQL callers among them, no duplicate', async () => {
    const name = 'givenBack';
    await main.sequences.define({ name, kind: 'batched', batch: 100 });
    // Alone: the rest comes back, and the next node goes on where it stopped.
    const a = await node();
    expect(await a.sequences.nextMany(name, 3)).toEqual(
      [0, 1, 2].map((value) => expect.objectContaining({ value })),
    );
    await a.close();
    const b = await node();
    const afterA = (await b.nextval(name)) as number;
    expect(afterA).toBe(3);
    // A later range reserved by another node: closing b gives nothing back (it would be reused).
    const c = await node();
    const fromC = (await c.nextval(name)) as number;
    await b.close();
    const d = await node();
    const fromD = (await d.nextval(name)) as number;
    expect(fromD).toBeGreaterThan(fromC);
    // Many at once: nodes drawing, closing and reopening while SQL callers take values.
    const all: number[][] = [[0, 1, 2, afterA, fromC, fromD]];
    const workers = range(1, 4).map(async () => {
      for (let round = 0; round < 8; round++) {
        const n = await node();
        all.push((await n.sequences.nextMany(name, 1 + round * 7)).map((i) => i.value as number));
        await n.close();
      }
    });
    const sql: number[] = [];
    const sqlLoop = (async () => {
      for (let i = 0; i < 60; i++) sql.push(await sqlNextval(name));
    })();
    await Promise.all([...workers, sqlLoop]);
    expect(duplicates(...all, sql)).toEqual([]);
  });

  it('a busy node that closes gives back every range ahead that adjoins its last one: the next node goes on at its first value never handed out', async () => {
    const name = 'givenBackMany';
    await main.sequences.define({ name, kind: 'batched', batch: 10 });
    const nodeId = randomUUID();
    const a = await node({ nodeId });
    // 40 callers at once: the node asks for more ranges per statement while they wait.
    const drawn = (await Promise.all(range(1, 40).map(() => a.sequences.nextMany(name, 25)))).flatMap(
      (issued) => issued.map((i) => i.value as number),
    );
    await a.sequences.idle();
    const held = await ownership(name, nodeId);
    const top = maxOf(drawn);
    expect(held.filter((r) => r.first > top).length).toBeGreaterThan(1);
    await a.close();
    // Everything above the last value drawn went back: its ranges' rows are gone or cut.
    expect(await position(name)).toBe(top + 1);
    for (const r of await ownership(name, nodeId)) expect(r.last).toBeLessThanOrEqual(top);
    const b = await node();
    expect(await b.nextval(name)).toBe(top + 1);
  });

  it('give_back() moves nothing across another node’s range between the closing node’s ranges, even one partly given back', async () => {
    const name = 'givenBackInterleaved';
    await main.sequences.define({ name, kind: 'batched', batch: 100 });
    const [a, b] = [randomUUID(), randomUUID()];
    const reserve = async (nodeId: string, ranges: number) =>
      (
        await raw.query('SELECT first, last FROM ordo.reserve($1, $2, null, $3)', [name, nodeId, ranges])
      ).rows.map((r) => [Number(r.first), Number(r.last)]);
    const giveBack = async (nodeId: string, lastFirst: number, from: number) =>
      (
        await raw.query(
          'SELECT ordo.give_back($1, $2, (SELECT epoch FROM ordo.sequences WHERE name = $1), $3, $4, 1000) AS given_back',
          [name, nodeId, lastFirst, from],
        )
      ).rows[0].given_back as boolean;
    expect(await reserve(a, 2)).toEqual([
      [0, 99],
      [100, 199],
    ]);
    expect(await reserve(b, 1)).toEqual([[200, 299]]);
    // b hands out 200..249 and gives back the rest: the storage stands at 250, off the grid of 100.
    expect(await giveBack(b, 200, 250)).toBe(true);
    expect(await reserve(a, 1)).toEqual([[250, 349]]);
    // a's ranges 100..199 and 250..349 do not adjoin: 200..249 went out from b's range between.
    expect(await giveBack(a, 250, 150)).toBe(false);
    expect(await giveBack(a, 250, 50)).toBe(false);
    expect(await position(name)).toBe(350);
    // From within its last range, it may.
    expect(await giveBack(a, 250, 300)).toBe(true);
    expect(await position(name)).toBe(300);
    // And two adjoining ranges of one statement go back together.
    expect(await reserve(a, 3)).toEqual([
      [300, 399],
      [400, 499],
      [500, 599],
    ]);
    expect(await giveBack(a, 500, 320)).toBe(true);
    expect(await position(name)).toBe(320);
    expect((await ownership(name, a)).map((r) => [r.first, r.last])).toEqual([
      [0, 99],
      [100, 199],
      [250, 299],
      [300, 319],
    ]);
  });

  it('reserve() near the maximum returns the ranges left, fewer than asked; with none left, sequence_exhausted', async () => {
    const name = 'nearTheEnd';
    await main.sequences.define({ name, kind: 'batched', batch: 10, maxValue: 35 });
    const { rows } = await raw.query(`SELECT first, last FROM ordo.reserve($1, $2, null, 8)`, [
      name,
      randomUUID(),
    ]);
    expect(rows.map((r) => [Number(r.first), Number(r.last)])).toEqual([
      [0, 9],
      [10, 19],
      [20, 29],
      [30, 35],
    ]);
    await expect(
      raw.query(`SELECT * FROM ordo.reserve($1, $2, null, 8)`, [name, randomUUID()]),
    ).rejects.toMatchObject({
      code: 'OX002',
    });
    const n = await node();
    await expect(n.nextval(name)).rejects.toMatchObject({ code: 'sequence_exhausted' });
  });

  /** Where the sequence's storage stands: the first value of the next range reserved. */
  async function position(name: string): Promise<number> {
    const { rows } = await raw.query(
      'SELECT ordo.storage_position(storage) AS p FROM ordo.sequences WHERE name = $1',
      [name],
    );
    return Number(rows[0].p);
  }

  /** A node that drew 0, 1, 2 of a sequence of batch 100 and holds 0..99 and the spare 100..199. */
  async function drewThree(name: string) {
    await main.sequences.define({ name, kind: 'batched', batch: 100 });
    const nodeId = randomUUID();
    const a = await node({ nodeId });
    const drawn = (await a.sequences.nextMany(name, 3)).map((i) => i.value as number);
    await until('the spare is reserved', async () => (await ownership(name, nodeId)).length === 2);
    const held = await ownership(name, nodeId);
    expect(drawn).toEqual([0, 1, 2]);
    expect(held.map((r) => [r.first, r.last])).toEqual([
      [0, 99],
      [100, 199],
    ]);
    return { a, nodeId, drawn, held };
  }

  it('an OVERWRITE between the reservation and the close gives nothing back, even to a node that missed the notification', async () => {
    const name = 'givenBackOverwritten';
    const { a, nodeId, drawn, held } = await drewThree(name);
    await main.sequences.define({ name, kind: 'batched', batch: 100, overwrite: true });
    const reserved = await position(name);
    expect(reserved).toBe(200);
    // The compare-and-set, as a node that has not heard of the OVERWRITE would send it: refused.
    const { rows } = await raw.query('SELECT ordo.give_back($1, $2, $3, $4, $5, 1000) AS given_back', [
      name,
      nodeId,
      held[1]!.epoch,
      held[1]!.first,
      3,
    ]);
    expect(rows[0].given_back).toBe(false);
    await a.close();
    expect(await position(name)).toBe(reserved);
    const b = await node();
    const after = (await b.sequences.nextMany(name, 3)).map((i) => i.value as number);
    expect(after).toEqual([200, 201, 202]);
    expect(duplicates(drawn, after)).toEqual([]);
  });

  it('an ALTER … TIMEOUT between the reservation and the close changes no value: the rest is still given back, once', async () => {
    const name = 'givenBackAltered';
    const { a, drawn } = await drewThree(name);
    expect(await main.query(`ALTER SEQUENCE ${name} TIMEOUT 5s`)).toEqual([{ result: null }]);
    await sleep(100); // the notification reaches the node: its ranges stay (same epoch)
    await a.close();
    expect(await position(name)).toBe(3);
    const b = await node();
    const after = (await b.sequences.nextMany(name, 3)).map((i) => i.value as number);
    expect(after).toEqual([3, 4, 5]);
    expect(duplicates(drawn, after)).toEqual([]);
  });

  it("a SQL ordo.nextval() after the node's last range makes its close give nothing back; that value never comes again", async () => {
    const name = 'givenBackSql';
    const { a, nodeId, drawn, held } = await drewThree(name);
    const fromSql = await sqlNextval(name);
    expect(fromSql).toBe(200);
    await a.close();
    // Nothing moved: the storage stays after the SQL caller's block, the ownership rows whole.
    expect(await position(name)).toBe(300);
    expect(await ownership(name, nodeId)).toEqual(held);
    const b = await node();
    const after = (await b.sequences.nextMany(name, 3)).map((i) => i.value as number);
    expect(after).toEqual([300, 301, 302]);
    expect(duplicates(drawn, [fromSql], after)).toEqual([]);
  });
});

describe('input checks', () => {
  it('scope or at on a batched sequence, batch 0 or 1,000,001: invalid_argument; nextMany gives increasing values', async () => {
    const name = 'strict';
    await main.sequences.define({ name, kind: 'batched', batch: 10 });
    const n = await node();
    await expect(n.sequences.next(name, { scope: 'tenant' })).rejects.toMatchObject({
      code: 'invalid_argument',
    });
    await expect(n.nextval(name, { scope: 'tenant' })).rejects.toMatchObject({ code: 'invalid_argument' });
    await expect(n.sequences.next(name, { at: new Date() })).rejects.toMatchObject({
      code: 'invalid_argument',
    });
    await expect(n.sequences.nextMany(name, 2, { at: '2026-01-01T00:00:00Z' })).rejects.toMatchObject({
      code: 'invalid_argument',
    });
    await expect(raw.query("SELECT ordo.nextval('strict', 'tenant')")).rejects.toMatchObject({
      code: 'OX003',
    });
    for (const batch of [0, 1_000_001, -1, 1.5]) {
      await expect(
        n.sequences.define({ name: `bad_${String(batch).replace(/\W/g, '_')}`, kind: 'batched', batch }),
      ).rejects.toMatchObject({ code: 'invalid_argument' });
    }
    expect(await n.sequences.get('bad_0')).toBeNull();
    const max = await n.sequences.define({ name: 'widest', kind: 'batched', batch: 1_000_000 });
    expect(max.batch).toBe(1_000_000);

    const three = await n.sequences.nextMany(name, 3);
    expect(three).toHaveLength(3);
    expect(strictlyIncreasing(three.map((i) => i.value))).toBe(true);
    for (const i of three)
      expect(i).toEqual({ value: i.value, text: String(i.value), period: null, scope: '' });
    const one = await n.sequences.next(name);
    expect(one).toEqual({ value: one.value, text: String(one.value), period: null, scope: '' });
    expect(one.value).toBeGreaterThan(three[2]!.value);
  });

  it('a batched sequence with a maxValue hands out up to it, then sequence_exhausted', async () => {
    const name = 'tiny';
    await main.sequences.define({ name, kind: 'batched', batch: 10, maxValue: 25 });
    const n = await node();
    const values: number[] = [];
    for (let i = 0; i < 26; i++) values.push(await n.nextval(name));
    expect(values).toEqual(range(0, 25));
    await expect(n.nextval(name)).rejects.toMatchObject({ code: 'sequence_exhausted' });
    await expect(sqlNextval(name)).rejects.toMatchObject({ code: 'OX002' });
  });
});

describe('races between redefinition and reservation (found as bugs, fixed)', () => {
  it('a SQL transaction that keeps calling ordo.nextval() while an OVERWRITE waits gets no value that is handed out again', async () => {
    const name = 'raced';
    await main.sequences.define({ name, kind: 'batched', batch: 10 });
    const tx = await raw.connect();
    try {
      await tx.query('BEGIN');
      const v1 = await sqlNextval(name, tx);
      // OVERWRITE reads the storage position (v1 + 10), then waits for tx's lock on the storage.
      const overwrite = main.sequences.define({ name, kind: 'batched', batch: 10, overwrite: true });
      await until(
        'the overwrite waits for the lock',
        async () => (await lockWaiters('%define_sequence%')) > 0,
      );
      // tx already holds that lock: it is not stopped, and takes the next block.
      const v2 = await sqlNextval(name, tx);
      await tx.query('COMMIT');
      const def = await overwrite;
      const v3 = await sqlNextval(name);
      expect([v1, v2]).toEqual([0, 10]);
      expect(duplicates([v1, v2, v3])).toEqual([]);
      expect(def.start).toBeGreaterThan(v2);
    } finally {
      await tx.query('ROLLBACK').catch(() => undefined);
      tx.release();
    }
  });

  describe('OVERWRITE / REMOVE racing a reservation', () => {
    // Widens, deterministically, the instant inside reserve() between nextval() on the storage
    // (which locks it) and the ownership row's foreign-key check (which locks the definition).
    beforeAll(async () => {
      await raw.query(`CREATE FUNCTION public.slow_reservation() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN IF NEW.sequence LIKE 'contended%' THEN PERFORM pg_sleep(0.4); END IF; RETURN NEW; END $$`);
      await raw.query(`CREATE TRIGGER slow_reservation BEFORE INSERT ON ordo.sequence_batches
        FOR EACH ROW EXECUTE FUNCTION public.slow_reservation()`);
    });
    afterAll(async () => {
      await raw.query('DROP TRIGGER IF EXISTS slow_reservation ON ordo.sequence_batches');
    });

    async function reservationInFlight(name: string) {
      await main.sequences.define({ name, kind: 'batched', batch: 10 });
      const n = await node();
      const drawing = n.nextval(name).then(
        (v) => v,
        (e: unknown) => e,
      );
      await until('the reservation is inside reserve()', async () => {
        const { rows } = await raw.query(
          `SELECT count(*)::int AS n FROM pg_stat_activity
            WHERE datname = current_database() AND wait_event = 'PgSleep' AND query LIKE '%.reserve(%'`,
        );
        return rows[0].n > 0;
      });
      return { drawing };
    }

    it('OVERWRITE while a node reserves waits, never deadlocks', async () => {
      const { drawing } = await reservationInFlight('contended_overwrite');
      const before = (await main.sequences.get('contended_overwrite'))!.epoch;
      const after = await main.sequences.define({
        name: 'contended_overwrite',
        kind: 'batched',
        batch: 20,
        overwrite: true,
      });
      expect(after.batch).toBe(20);
      expect(after.epoch).not.toBe(before);
      expect(typeof (await drawing)).toBe('number');
    });

    it('REMOVE while a node reserves waits, never deadlocks', async () => {
      const { drawing } = await reservationInFlight('contended_remove');
      await expect(main.sequences.remove('contended_remove')).resolves.toBe(true);
      // The reservation either finished first or finds the sequence gone.
      const result = await drawing;
      if (typeof result !== 'number') expect(result).toMatchObject({ code: 'sequence_not_found' });
    });
  });

  it('a prefetch that waited behind a redefinition took the new START: the node serves it, through the notification that follows', async () => {
    const name = 'prefetched';
    await main.sequences.define({ name, kind: 'batched', batch: 1 });
    const n = await node();
    expect(await n.nextval(name)).toBe(0);
    await until(
      'the prefetch of 1 is back',
      async () =>
        Number(
          (await raw.query(`SELECT count(*) AS n FROM ordo.sequence_batches WHERE sequence = $1`, [name]))
            .rows[0].n,
        ) === 2,
    );
    const blocker = await raw.connect();
    try {
      await blocker.query('BEGIN');
      await blocker.query(defineSql(name, 1, null, 'overwrite', 500));
      // 1 comes from memory; the prefetch it starts waits for the redefinition's lock.
      expect(await n.nextval(name)).toBe(1);
      await until('the prefetch waits for the lock', async () => (await lockWaiters('%reserve%')) > 0);
      await blocker.query('COMMIT');
    } finally {
      await blocker.query('ROLLBACK').catch(() => undefined);
      blocker.release();
    }
    // The redefinition's NOTIFY reaches the node meanwhile: it must not throw 500 away.
    await sleep(300);
    expect([await n.nextval(name), await n.nextval(name)]).toEqual([500, 501]);
  });

  it('batched → gapless → batched never moves backwards', async () => {
    const name = 'shifty';
    await main.sequences.define({ name, kind: 'batched', batch: 100 });
    const n = await node();
    const before = [await sqlNextval(name), await sqlNextval(name)];
    for (let i = 0; i < 150; i++) before.push(await n.nextval(name));
    const gapless = await main.sequences.define({ name, kind: 'gapless', start: 0, overwrite: true });
    expect(gapless.start).toBeGreaterThan(maxOf(before));
    const batched = await main.sequences.define({
      name,
      kind: 'batched',
      batch: 100,
      start: 0,
      overwrite: true,
    });
    await sleep(100);
    const after = [await sqlNextval(name)];
    // Ownership rows are a record only ("uniqueness never depends on them"): once collected…
    await raw.query("SELECT ordo.collect_batches('0 seconds')");
    for (let i = 0; i < 150; i++) after.push(await n.nextval(name));
    expect(batched.start).toBeGreaterThan(maxOf(before));
    expect(after.filter((v) => v <= maxOf(before))).toEqual([]);
    expect(duplicates(before, after)).toEqual([]);
  });
});
