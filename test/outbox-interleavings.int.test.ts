// The outbox under deterministic interleavings of writer transactions (issues #5 and #12).
// Transaction ids are forced in a chosen order with `SELECT pg_current_xact_id()` on separate
// connections; after every step two consumers look: the SQL functions themselves (receive and
// ack, called the way the consumer calls them) and a real subscription, which must receive
// exactly the same messages in the same order. A model says what each look must return: every
// committed message not yet delivered, in position order. Naive reads (by position; by
// (xid, position)) run alongside and are shown to lose messages in the same scenarios, so these
// tests can fail; so does a mutated receive().
import { setTimeout as sleep } from 'node:timers/promises';
import fc from 'fast-check';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo, type OutboxMessage, type Subscription } from '../src/index.js';
import { type OwnPostgres, ownPostgres } from './support/own-postgres.js';

let server: OwnPostgres;
let ordo: Ordo;
let admin: pg.Client;
/** Writer connections reused by the property test. */
const spare: pg.Client[] = [];
const SCHEMA = 'ilv';

beforeAll(async () => {
  // Open transactions are cluster-wide: this file has a server of its own.
  server = await ownPostgres();
  admin = new pg.Client({ connectionString: server.url, application_name: 'ordo-test-admin' });
  await admin.connect();
  // An autovacuum ANALYZE takes a transaction id for a moment; if it coincided with a poll
  // here, that poll could see less than the rule allows and the per-step expectations would
  // flicker. This server belongs to this file alone.
  await admin.query('ALTER SYSTEM SET autovacuum = off');
  await admin.query('SELECT pg_reload_conf()');
  ordo = await createOrdo({ databaseUrl: server.url, schema: SCHEMA, poolSize: 6 });
  // Two broken reads, the bugs the outbox exists to avoid.
  await admin.query(`CREATE SCHEMA naive`);
  await admin.query(`
    CREATE FUNCTION naive.read_by_position(msg_topic text, after_tx xid8, after_pos bigint, max_count int)
    RETURNS SETOF ${SCHEMA}.messages LANGUAGE sql STABLE AS $$
      SELECT * FROM ${SCHEMA}.messages WHERE topic = msg_topic AND position > after_pos
       ORDER BY position LIMIT max_count $$`);
  await admin.query(`
    CREATE FUNCTION naive.read_by_transaction(msg_topic text, after_tx xid8, after_pos bigint, max_count int)
    RETURNS SETOF ${SCHEMA}.messages LANGUAGE sql STABLE AS $$
      SELECT * FROM ${SCHEMA}.messages WHERE topic = msg_topic AND (transaction_id, position) > (after_tx, after_pos)
       ORDER BY transaction_id, position LIMIT max_count $$`);
});

afterAll(async () => {
  await Promise.all(spare.map((c) => c.end().catch(() => undefined)));
  await ordo?.close();
  await admin?.end();
  await server?.stop();
});

type Label = string;

/** Waits until `check` returns true; `check` may throw to fail at once. */
async function waitFor(what: string, check: () => Promise<boolean> | boolean, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(10);
  }
}

const isPrefix = (xs: Label[], of: Label[]) => xs.length <= of.length && xs.every((x, i) => x === of[i]);

function duplicates(xs: Label[]): Label[] {
  const seen = new Set<Label>();
  return xs.filter((x) => (seen.has(x) ? true : (seen.add(x), false)));
}

/**
 * ordo's rule done by hand in SQL: a subscription of its own, read with receive() and ack()
 * in pages of two, exactly as the consumer calls them.
 */
class RuleReader {
  readonly delivered: Label[] = [];
  private ready: Promise<unknown> | undefined;

  constructor(
    private readonly client: pg.Client,
    private readonly schema: string,
    private readonly topic: string,
  ) {}

  /** Reads until nothing more is returned; the labels read now, in order. */
  async poll(): Promise<Label[]> {
    const s = this.schema;
    const name = `rule-${this.topic}`;
    this.ready ??= this.client
      .query(`SELECT ${s}.create_subscription($1, $2, 'beginning', 1)`, [name, this.topic])
      .then(() => this.client.query(`SELECT ${s}.lease_partition($1, 0, 'rule', 3600000)`, [name]));
    await this.ready;
    const got: Label[] = [];
    for (;;) {
      const { rows } = await this.client.query(
        `SELECT data->>'label' AS label, version::text FROM ${s}.receive($1, 0, 'rule', 2, 3600000)`,
        [name],
      );
      if (rows.length === 0) return got;
      const { rows: acked } = await this.client.query(`SELECT ${s}.ack($1, 0, 'rule', $2, 3600000) AS n`, [
        name,
        rows[0].version,
      ]);
      expect(acked[0].n).toBe(rows.length);
      got.push(...rows.map((r) => r.label as Label));
      this.delivered.push(...rows.map((r) => r.label as Label));
    }
  }
}

/** A naive reader: a cursor kept in memory, read with a broken read function. */
class NaiveReader {
  cursor = { tx: '0', pos: '0' };
  readonly delivered: Label[] = [];

  constructor(
    private readonly client: pg.Client,
    readonly fn: string,
    private readonly topic: string,
  ) {}

  async poll(): Promise<void> {
    for (;;) {
      const { rows } = await this.client.query(
        `SELECT data->>'label' AS label, transaction_id::text AS tx, position::text AS pos
           FROM ${this.fn}($1, $2::xid8, $3, 2)`,
        [this.topic, this.cursor.tx, this.cursor.pos],
      );
      if (rows.length === 0) return;
      const last = rows.at(-1)!;
      this.cursor = { tx: last.tx, pos: last.pos };
      this.delivered.push(...rows.map((r) => r.label as Label));
    }
  }
}

interface Writer {
  client: pg.Client;
  xid: bigint;
}

/** What the model knows of a message: its position, and the step at which it was appended. */
interface Known {
  label: Label;
  position: number;
  appendedAt: number;
  /** The step at which its transaction committed; undefined while open. */
  committedAt?: number;
}

/**
 * A model of the guarantee: at any look, every committed message not yet delivered comes, in
 * position order; and no message comes before one whose transaction committed before it was
 * appended.
 */
class Model {
  readonly messages: Known[] = [];
  readonly delivered = new Set<Label>();
  clock = 0;

  appended(label: Label, position: number, committed: boolean): void {
    const tick = ++this.clock;
    this.messages.push({ label, position, appendedAt: tick, committedAt: committed ? tick : undefined });
  }

  ended(labels: Label[], committed: boolean): void {
    const tick = ++this.clock;
    for (const m of this.messages) {
      if (labels.includes(m.label)) {
        if (committed) m.committedAt = tick;
        else m.committedAt = -1;
      }
    }
  }

  /** What a look must return now, and marks it delivered. */
  look(): Label[] {
    const now = this.messages
      .filter((m) => m.committedAt !== undefined && m.committedAt > 0 && !this.delivered.has(m.label))
      .sort((a, b) => a.position - b.position)
      .map((m) => m.label);
    for (const l of now) this.delivered.add(l);
    return now;
  }

  /** Committed messages, in the order the model delivered them. */
  committed(): Label[] {
    return [...this.delivered];
  }

  /** Pairs delivered against commit order: b committed before a was appended, yet a came first. */
  reordered(order: Label[]): string[] {
    const at = new Map(this.messages.map((m) => [m.label, m]));
    const bad: string[] = [];
    for (let i = 0; i < order.length; i++)
      for (let j = i + 1; j < order.length; j++) {
        const [a, b] = [at.get(order[i]!)!, at.get(order[j]!)!];
        if (b.committedAt! < a.appendedAt) bad.push(`${a.label} before ${b.label}`);
      }
    return bad;
  }
}

/**
 * One scenario: writers with forced transaction ids, the SQL rule, naive readers, a real
 * subscription and the model. `step` runs one action, then every reader looks, and the
 * subscription must settle on what the rule delivered.
 */
class Scenario {
  readonly writers = new Map<string, Writer & { labels: Label[] }>();
  readonly rule: RuleReader;
  readonly naive: NaiveReader[];
  readonly model = new Model();
  /** Labels the subscription's handler received, in order; batch sizes alongside. */
  readonly received: Label[] = [];
  readonly batches: number[] = [];
  sub!: Subscription;
  private readonly opened: pg.Client[] = [];
  private readonly batchSize: number;

  constructor(
    readonly o: Ordo,
    readonly schema: string,
    readonly topic: string,
    reader: pg.Client,
    options: { naive?: boolean; batchSize?: number } = {},
  ) {
    this.rule = new RuleReader(reader, schema, topic);
    this.naive =
      options.naive === false
        ? []
        : [
            new NaiveReader(reader, 'naive.read_by_position', topic),
            new NaiveReader(reader, 'naive.read_by_transaction', topic),
          ];
    this.batchSize = options.batchSize ?? 2;
  }

  async start(): Promise<void> {
    this.sub = await this.o.outbox.subscribe<{ label: Label }>({
      name: `sub-${this.topic}`,
      topic: this.topic,
      batchSize: this.batchSize,
      // A rollback sends no notification: the consumer finds out at its next poll.
      pollInterval: '100ms',
      lease: '60s',
      handler: (messages: OutboxMessage<{ label: Label }>[]) => {
        this.batches.push(messages.length);
        for (const m of messages) this.received.push(m.data.label);
      },
    });
  }

  async begin(name: string): Promise<Writer> {
    const client = new pg.Client({ connectionString: server.url, application_name: `writer-${name}` });
    await client.connect();
    this.opened.push(client);
    await client.query('BEGIN');
    const { rows } = await client.query('SELECT pg_current_xact_id()::text AS xid');
    const writer = { client, xid: BigInt(rows[0].xid), labels: [] as Label[] };
    for (const [other, w] of this.writers) {
      // Begun later, a higher transaction id: the order the scenario is written in.
      expect(writer.xid > w.xid, `${name} after ${other}`).toBe(true);
    }
    this.writers.set(name, writer);
    return writer;
  }

  async append(name: string, ...labels: Label[]): Promise<void> {
    const w = this.writers.get(name)!;
    const appended = await this.o.outbox.append(
      this.topic,
      labels.map((label) => ({ type: 'm', data: { label } })),
      { tx: w.client },
    );
    appended.forEach((a, i) => this.model.appended(labels[i]!, a.position!, false));
    w.labels.push(...labels);
  }

  /** A fast writer: its own statement, a fresh (higher) transaction id, committed at once. */
  async autocommit(...labels: Label[]): Promise<void> {
    const appended = await this.o.outbox.append(
      this.topic,
      labels.map((label) => ({ type: 'm', data: { label } })),
    );
    appended.forEach((a, i) => this.model.appended(labels[i]!, a.position!, true));
  }

  async end(name: string, how: 'COMMIT' | 'ROLLBACK'): Promise<void> {
    const w = this.writers.get(name)!;
    await w.client.query(how);
    this.model.ended(w.labels, how === 'COMMIT');
  }

  /**
   * Runs `action`; then the rule must return what the model says (and `expected`, when the
   * scenario spells it out), and the subscription must receive exactly that too.
   */
  async step(what: string, action: () => Promise<unknown>, expected?: Label[]): Promise<void> {
    await action();
    for (const n of this.naive) await n.poll();
    const want = this.model.look();
    if (expected) expect(want, `the model after "${what}"`).toEqual(expected);
    expect(await this.rule.poll(), `receive after "${what}"`).toEqual(want);
    await this.settle(what);
  }

  /** Waits until the subscription has received what the rule read, and no more. */
  async settle(what: string): Promise<void> {
    const want = this.rule.delivered;
    const check = async () => {
      if (!isPrefix(this.received, want)) {
        throw new Error(
          `after "${what}" the subscription received [${this.received.join(', ')}] but the rule allows only [${want.join(', ')}]`,
        );
      }
      if (this.received.length < want.length) return false;
      return (await this.sub.lag()).delivered === want.length;
    };
    await waitFor(`the subscription to settle after "${what}"`, check);
    // When nothing became readable, give a wrong consumer the time to deliver early anyway
    // (it re-polls within pollInterval); a correct one is unaffected.
    await sleep(150);
    await check();
  }

  /** The end of every scenario: nothing skipped, nothing twice, in commit order, everywhere. */
  async verify(): Promise<Label[]> {
    const truth = this.model.committed();
    const { rows } = await admin.query(
      `SELECT count(*)::int AS n FROM ${this.schema}.messages WHERE topic = $1`,
      [this.topic],
    );
    expect(rows[0].n).toBe(truth.length);
    expect(this.rule.delivered).toEqual(truth);
    await this.settle('the end');
    expect(this.received).toEqual(truth);
    expect(duplicates(this.received)).toEqual([]);
    expect(this.model.reordered(this.received)).toEqual([]);
    expect(Math.max(...this.batches, 0)).toBeLessThanOrEqual(this.batchSize);
    const lag = await this.sub.lag();
    expect(lag).toMatchObject({ messagesBehind: 0, waiting: 0, blockedBy: null, delivered: truth.length });
    return truth;
  }

  /** What each naive reader failed to deliver (read never, or twice). */
  naiveLosses(): Record<string, { missing: Label[]; twice: Label[] }> {
    const truth = this.model.committed();
    return Object.fromEntries(
      this.naive.map((n) => [
        n.fn,
        { missing: truth.filter((l) => !n.delivered.includes(l)), twice: duplicates(n.delivered) },
      ]),
    );
  }

  async close(): Promise<void> {
    await this.sub?.stop();
    await Promise.all(this.opened.map((c) => c.end().catch(() => undefined)));
  }
}

let reader: pg.Client;
beforeAll(async () => {
  reader = new pg.Client({ connectionString: server.url, application_name: 'ordo-test-reader' });
  await reader.connect();
});
afterAll(async () => {
  await reader?.end();
});

async function scenario(
  topic: string,
  body: (s: Scenario) => Promise<void>,
  options?: { batchSize?: number },
): Promise<Scenario> {
  const s = new Scenario(ordo, SCHEMA, topic, reader, options);
  try {
    await s.start();
    await body(s);
    return s;
  } finally {
    await s.close();
  }
}

describe('deterministic interleavings: the SQL rule and a real subscription after every step', () => {
  it("the lock-wait reorder: A began first, waits on B's row lock, appends after B committed: B's message comes first", async () => {
    await admin.query(`CREATE TABLE IF NOT EXISTS public.orders (id int PRIMARY KEY, state text)`);
    await admin.query(
      `INSERT INTO public.orders VALUES (1, 'new') ON CONFLICT (id) DO UPDATE SET state = 'new'`,
    );
    const s = await scenario('lock-wait', async (s) => {
      await s.step('A begins and writes first (the lower transaction id)', () => s.begin('A'), []);
      await s.step('B begins', () => s.begin('B'), []);
      const b = s.writers.get('B')!.client;
      const a = s.writers.get('A')!.client;
      await s.step(
        'B updates order 1',
        () => b.query(`UPDATE public.orders SET state = 'paid' WHERE id = 1`),
        [],
      );
      await s.step('B appends OrderPaid', () => s.append('B', 'OrderPaid'), []);
      const { rows } = await a.query('SELECT pg_backend_pid() AS pid');
      const waiting = a.query(`UPDATE public.orders SET state = 'shipped' WHERE id = 1`);
      await waitFor('A to wait for the row lock B holds', async () => {
        const { rows: activity } = await admin.query(
          'SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1',
          [rows[0].pid],
        );
        return activity[0]?.wait_event_type === 'Lock';
      });
      await s.step('B commits (A goes on)', () => s.end('B', 'COMMIT'), ['OrderPaid']);
      await waiting;
      await s.step('A appends OrderShipped', () => s.append('A', 'OrderShipped'), []);
      await s.step('A commits', () => s.end('A', 'COMMIT'), ['OrderShipped']);
      expect(await s.verify()).toEqual(['OrderPaid', 'OrderShipped']);
    });
    // Read by transaction id, OrderShipped (the lower id) comes first: the bug of issue #12.
    const { rows } = await admin.query(
      `SELECT data->>'label' AS label FROM ${SCHEMA}.messages WHERE topic = 'lock-wait' ORDER BY transaction_id, position`,
    );
    expect(rows.map((r) => r.label)).toEqual(['OrderShipped', 'OrderPaid']);
    expect(s.received).toEqual(['OrderPaid', 'OrderShipped']);
  });

  it('a slow low-xid writer commits after fast ones: the others come at once, its own messages when it commits', async () => {
    const s = await scenario('slow-low', async (s) => {
      await s.step('A begins (low xid)', () => s.begin('A'), []);
      await s.step('B begins (higher xid)', () => s.begin('B'), []);
      await s.step('A appends a1', () => s.append('A', 'a1'), []);
      await s.step('B appends b1 b2', () => s.append('B', 'b1', 'b2'), []);
      await s.step('B commits', () => s.end('B', 'COMMIT'), ['b1', 'b2']);
      // A holds back only its own message; lag names it.
      const lag = await s.sub.lag();
      expect(lag).toMatchObject({ messagesBehind: 0, waiting: 1 });
      const { rows } = await s.writers.get('A')!.client.query('SELECT pg_backend_pid() AS pid');
      expect(lag.blockedBy).toMatchObject({
        pid: rows[0].pid,
        state: 'idle in transaction',
        applicationName: 'writer-A',
      });
      await s.step('a fast autocommit appends c1', () => s.autocommit('c1'), ['c1']);
      await s.step('A appends a2 (after b1 b2 c1 by position)', () => s.append('A', 'a2'), []);
      await s.step('A commits', () => s.end('A', 'COMMIT'), ['a1', 'a2']);
      await s.step('d1 autocommit', () => s.autocommit('d1'), ['d1']);
      expect(await s.verify()).toEqual(['b1', 'b2', 'c1', 'a1', 'a2', 'd1']);
    });
    // Read naively: by position a1 is lost (b1 b2 were passed before it committed); by
    // (xid, position) a1 and a2 are lost, because b1 b2 c1 were passed beyond them.
    expect(s.naiveLosses()).toEqual({
      'naive.read_by_position': { missing: ['a1'], twice: [] },
      'naive.read_by_transaction': { missing: ['a1', 'a2'], twice: [] },
    });
  });

  it('an idle transaction that appended nothing is open the whole time: it holds nothing back', async () => {
    await scenario('idle', async (s) => {
      await s.step('I begins and goes idle', () => s.begin('I'), []);
      for (let i = 0; i < 5; i++) await s.step(`x${i}`, () => s.autocommit(`x${i}`), [`x${i}`]);
      await s.step('W begins', () => s.begin('W'), []);
      await s.step('W appends w1', () => s.append('W', 'w1'), []);
      await s.step('y autocommit', () => s.autocommit('y'), ['y']);
      await s.step('W commits', () => s.end('W', 'COMMIT'), ['w1']);
      await s.verify();
      expect((await s.sub.lag()).blockedBy).toBeNull();
      await s.end('I', 'ROLLBACK');
    });
  });

  it('several slow writers end out of order among fast ones: each transaction comes when it commits', async () => {
    const s = await scenario('several-slow', async (s) => {
      await s.step('W1 begins', () => s.begin('W1'), []);
      await s.step('W2 begins', () => s.begin('W2'), []);
      await s.step('W3 begins', () => s.begin('W3'), []);
      await s.step('W4 begins', () => s.begin('W4'), []);
      await s.step('W3 appends', () => s.append('W3', 'w3a'), []);
      await s.step('W1 appends', () => s.append('W1', 'w1a'), []);
      await s.step('W4 appends', () => s.append('W4', 'w4a', 'w4b'), []);
      await s.step('W2 appends', () => s.append('W2', 'w2a'), []);
      await s.step('x1 autocommit', () => s.autocommit('x1'), ['x1']);
      await s.step('W1 appends again', () => s.append('W1', 'w1b'), []);
      await s.step('W3 commits', () => s.end('W3', 'COMMIT'), ['w3a']);
      await s.step('W4 commits', () => s.end('W4', 'COMMIT'), ['w4a', 'w4b']);
      await s.step('W1 commits', () => s.end('W1', 'COMMIT'), ['w1a', 'w1b']);
      await s.step('x2 autocommit', () => s.autocommit('x2'), ['x2']);
      await s.step('W2 commits', () => s.end('W2', 'COMMIT'), ['w2a']);
      await s.verify();
    });
    const losses = s.naiveLosses();
    expect(losses['naive.read_by_position']!.missing.length).toBeGreaterThan(0);
    expect(losses['naive.read_by_transaction']!.missing.length).toBeGreaterThan(0);
  });

  it('rollbacks leave holes in positions: the consumer goes past them, missing nothing', async () => {
    await scenario('holes', async (s) => {
      await s.step('A begins', () => s.begin('A'), []);
      await s.step('B begins', () => s.begin('B'), []);
      await s.step('A appends a1 a2', () => s.append('A', 'a1', 'a2'), []);
      await s.step('B appends b1', () => s.append('B', 'b1'), []);
      await s.step('B commits', () => s.end('B', 'COMMIT'), ['b1']);
      await s.step('A rolls back', () => s.end('A', 'ROLLBACK'), []);
      await s.step('c1 autocommit', () => s.autocommit('c1'), ['c1']);
      await s.step('D begins', () => s.begin('D'), []);
      await s.step('E begins', () => s.begin('E'), []);
      await s.step('E appends e1', () => s.append('E', 'e1'), []);
      await s.step('D appends d1', () => s.append('D', 'd1'), []);
      await s.step('E rolls back', () => s.end('E', 'ROLLBACK'), []);
      await s.step('D commits', () => s.end('D', 'COMMIT'), ['d1']);
      expect(await s.verify()).toEqual(['b1', 'c1', 'd1']);
      // The holes are real: positions were taken by the rolled-back appends.
      const { rows } = await admin.query(
        `SELECT array_agg(position ORDER BY position) AS p FROM ${SCHEMA}.messages WHERE topic = 'holes'`,
      );
      const p = rows[0].p.map(Number) as number[];
      expect(p.at(-1)! - p[0]! + 1).toBeGreaterThan(p.length);
    });
  });

  it('one transaction appends thousands of messages among fast writers: all of it, in order, in batches', async () => {
    const big = (from: number) =>
      Array.from({ length: 1000 }, (_, i) => `big${String(from + i).padStart(4, '0')}`);
    await scenario(
      'one-big',
      async (s) => {
        await s.step('x0 autocommit', () => s.autocommit('x0'), ['x0']);
        await s.step('T begins', () => s.begin('T'), []);
        await s.step('T appends 1000', () => s.append('T', ...big(0)), []);
        await s.step('x1 autocommit', () => s.autocommit('x1'), ['x1']);
        await s.step('T appends 1000 more', () => s.append('T', ...big(1000)), []);
        await s.step('x2 autocommit', () => s.autocommit('x2'), ['x2']);
        await s.step('T appends 1000 more', () => s.append('T', ...big(2000)), []);
        await s.step('T commits', () => s.end('T', 'COMMIT'), [...big(0), ...big(1000), ...big(2000)]);
        expect(await s.verify()).toHaveLength(3003);
        expect(s.batches.filter((n) => n === 100).length).toBeGreaterThanOrEqual(29);
      },
      { batchSize: 100 },
    );
  });

  it('property: random programs of slow and fast writers, commits and rollbacks, looked at after every step', async () => {
    // Writers 0..n-1; a token -1 is a fast autocommit append. A writer's first token begins it
    // (unless it began up front, xids in index order), its last ends it, the others append.
    const program = fc
      .record({
        writers: fc.integer({ min: 2, max: 5 }),
        tokens: fc.array(fc.integer({ min: -1, max: 4 }), { minLength: 4, maxLength: 16 }),
        early: fc.array(fc.boolean(), { minLength: 5, maxLength: 5 }),
        commit: fc.array(fc.boolean(), { minLength: 5, maxLength: 5 }),
      })
      .map((p) => ({
        ...p,
        tokens: [...p.tokens.filter((t) => t < p.writers), ...Array.from({ length: p.writers }, (_, i) => i)],
      }));
    while (spare.length < 5) {
      const c = new pg.Client({ connectionString: server.url, application_name: 'ordo-test-prop' });
      await c.connect();
      spare.push(c);
    }
    let run = 0;
    await fc.assert(
      fc.asyncProperty(program, async (p) => {
        const topic = `prop-${++run}`;
        const rule = new RuleReader(reader, SCHEMA, topic);
        const model = new Model();
        let label = 0;
        const last = new Map<number, number>();
        p.tokens.forEach((t, i) => last.set(t, i));
        const open = new Map<number, Label[]>();
        const begin = async (w: number) => {
          await spare[w]!.query('BEGIN');
          await spare[w]!.query('SELECT pg_current_xact_id()');
          open.set(w, []);
        };
        const append = async (w?: number) => {
          const text = `m${String(++label).padStart(3, '0')}`;
          const tx = w === undefined ? undefined : spare[w];
          const [a] = await ordo.outbox.append(topic, { type: 'm', data: { label: text } }, { tx });
          model.appended(text, a!.position!, w === undefined);
          if (w !== undefined) open.get(w)!.push(text);
        };
        const check = async () => expect(await rule.poll()).toEqual(model.look());
        try {
          for (let w = 0; w < p.writers; w++) if (p.early[w]) await begin(w);
          await check();
          for (const [i, t] of p.tokens.entries()) {
            if (t === -1) await append();
            else {
              if (!open.has(t)) await begin(t);
              if (last.get(t) === i) {
                await spare[t]!.query(p.commit[t] ? 'COMMIT' : 'ROLLBACK');
                model.ended(open.get(t)!, p.commit[t]!);
                open.delete(t);
              } else await append(t);
            }
            await check();
          }
        } finally {
          for (const w of open.keys()) await spare[w]!.query('ROLLBACK');
        }
        expect(model.reordered(rule.delivered)).toEqual([]);
        const { rows } = await admin.query(
          `SELECT data->>'label' AS label FROM ${SCHEMA}.messages WHERE topic = $1 ORDER BY position`,
          [topic],
        );
        const truth = rows.map((r) => r.label as Label);
        expect([...rule.delivered].sort()).toEqual([...truth].sort());
        // A subscription started after the fact reads everything in one round: in position order.
        const got: Label[] = [];
        const sub = await ordo.outbox.subscribe<{ label: Label }>({
          name: topic,
          topic,
          batchSize: 3,
          handler: (ms: OutboxMessage<{ label: Label }>[]) => void got.push(...ms.map((m) => m.data.label)),
        });
        try {
          await waitFor('the subscription to catch up', () => got.length >= truth.length);
          expect(got).toEqual(truth);
        } finally {
          await sub.stop();
        }
      }),
      { numRuns: 40, seed: 5 },
    );
  });
});

describe('the harness catches a receive() that forgets transactions the base saw running', () => {
  it('a subscription whose receive (a mutated copy in a schema of its own) drops the late messages is caught', async () => {
    const schema = 'mutant';
    const mutant = await createOrdo({ databaseUrl: server.url, schema, poolSize: 4 });
    try {
      // receive() reads what is due through undelivered(): the mutation goes there.
      const { rows } = await admin.query(
        `SELECT pg_get_functiondef('${schema}.undelivered'::regproc) AS def`,
      );
      const broken = (rows[0].def as string).replaceAll(
        'm.position <= st.base_position AND m.position > st.progress',
        'false',
      );
      expect(broken).not.toBe(rows[0].def);
      const s = new Scenario(mutant, schema, 'mutant', reader, { naive: false });
      try {
        await s.start();
        await s.step('A begins', () => s.begin('A'), []);
        await s.step('A appends a1', () => s.append('A', 'a1'), []);
        await s.step('b1 autocommit', () => s.autocommit('b1'), ['b1']);
        // Broken after the rule's own subscription was read once, so that only the subscription is wrong.
        await admin.query(broken);
        await expect(s.step('A commits', () => s.end('A', 'COMMIT'), ['a1'])).rejects.toThrow();
      } finally {
        await s.close();
      }
    } finally {
      await mutant.close();
    }
  });
});
