// The outbox under deterministic interleavings of writer transactions (issue #5). Transaction
// ids are forced in a chosen order with `SELECT pg_current_xact_id()` on separate connections;
// after every step two consumers look: the SQL read function itself (ordo's rule, called the
// way the consumer calls it) and a real subscription, which must reach exactly the same cursor
// and have received exactly the same messages. Naive reads (by position; by (xid, position)
// without the horizon) run alongside and are shown to lose messages in the same scenarios, so
// these tests can fail.
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
  // pg_snapshot_xmin is cluster-wide: this file has a server of its own.
  server = await ownPostgres();
  admin = new pg.Client({ connectionString: server.url, application_name: 'ordo-test-admin' });
  await admin.connect();
  // An autovacuum ANALYZE takes a transaction id for a moment; if it coincided with a poll
  // here, that poll could see less than the rule allows and the per-step expectations would
  // flicker. This server belongs to this file alone.
  await admin.query('ALTER SYSTEM SET autovacuum = off');
  await admin.query('SELECT pg_reload_conf()');
  ordo = await createOrdo({ databaseUrl: server.url, schema: SCHEMA, poolSize: 6 });
  // Two broken copies of the read, the bugs the outbox exists to avoid.
  await admin.query(`CREATE SCHEMA naive`);
  await admin.query(`
    CREATE FUNCTION naive.read_by_position(msg_topic text, after_tx xid8, after_pos bigint, max_count int)
    RETURNS SETOF ${SCHEMA}.messages LANGUAGE sql STABLE AS $$
      SELECT * FROM ${SCHEMA}.messages WHERE topic = msg_topic AND position > after_pos
       ORDER BY position LIMIT max_count $$`);
  await admin.query(`
    CREATE FUNCTION naive.read_without_horizon(msg_topic text, after_tx xid8, after_pos bigint, max_count int)
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
interface Cursor {
  tx: string;
  pos: string;
}

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
 * A consumer done by hand in SQL: it calls a read function exactly as ordo's consumer calls
 * read_messages (topic, cursor tuple, limit), in small pages, and keeps the cursor in memory.
 */
class SqlReader {
  cursor: Cursor = { tx: '0', pos: '0' };
  readonly delivered: Label[] = [];

  constructor(
    private readonly client: pg.Client,
    readonly fn: string,
    private readonly topic: string,
  ) {}

  /** Reads until nothing more is returned; the labels read now, in order. */
  async poll(): Promise<Label[]> {
    const got: Label[] = [];
    for (;;) {
      const { rows } = await this.client.query(
        `SELECT data->>'label' AS label, transaction_id::text AS tx, position::text AS pos
           FROM ${this.fn}($1, $2::xid8, $3, 2)`,
        [this.topic, this.cursor.tx, this.cursor.pos],
      );
      if (rows.length === 0) return got;
      for (const r of rows) got.push(r.label);
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

/**
 * One scenario: writers with forced transaction ids, a SQL reader with ordo's rule, naive
 * readers, and a real subscription. `step` runs one action, then polls every reader and
 * waits for the subscription to settle on the SQL reader's cursor.
 */
class Scenario {
  readonly writers = new Map<string, Writer>();
  readonly rule: SqlReader;
  readonly naive: SqlReader[];
  /** Labels the subscription's handler received, in order; batch sizes alongside. */
  readonly received: { label: Label; tx: bigint; position: number }[] = [];
  readonly batches: number[] = [];
  sub!: Subscription;
  private readonly opened: pg.Client[] = [];
  private readonly batchSize: number;

  constructor(
    readonly o: Ordo,
    readonly schema: string,
    readonly topic: string,
    reader: pg.Client,
    options: { ruleFn?: string; naive?: boolean; batchSize?: number } = {},
  ) {
    this.rule = new SqlReader(reader, options.ruleFn ?? `${schema}.read_messages`, topic);
    this.naive =
      options.naive === false
        ? []
        : [
            new SqlReader(reader, 'naive.read_by_position', topic),
            new SqlReader(reader, 'naive.read_without_horizon', topic),
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
      // No renewal (an UPDATE, so a transaction id) during the scenario.
      lease: '60s',
      handler: (messages: OutboxMessage<{ label: Label }>[]) => {
        this.batches.push(messages.length);
        for (const m of messages) {
          this.received.push({ label: m.data.label, tx: BigInt(m.transactionId), position: m.position });
        }
      },
    });
  }

  async begin(name: string): Promise<Writer> {
    const client = new pg.Client({ connectionString: server.url, application_name: `writer-${name}` });
    await client.connect();
    this.opened.push(client);
    await client.query('BEGIN');
    const { rows } = await client.query('SELECT pg_current_xact_id()::text AS xid');
    const writer = { client, xid: BigInt(rows[0].xid) };
    for (const [other, w] of this.writers) {
      // Begun later, a higher transaction id: the order the scenario is written in.
      expect(writer.xid > w.xid, `${name} after ${other}`).toBe(true);
    }
    this.writers.set(name, writer);
    return writer;
  }

  append(name: string, ...labels: Label[]): Promise<unknown> {
    return this.o.outbox.append(
      this.topic,
      labels.map((label) => ({ type: 'm', data: { label } })),
      { tx: this.writers.get(name)!.client },
    );
  }

  /** A fast writer: its own statement, a fresh (higher) transaction id, committed at once. */
  autocommit(...labels: Label[]): Promise<unknown> {
    return this.o.outbox.append(
      this.topic,
      labels.map((label) => ({ type: 'm', data: { label } })),
    );
  }

  async end(name: string, how: 'COMMIT' | 'ROLLBACK'): Promise<void> {
    const w = this.writers.get(name)!;
    await w.client.query(how);
  }

  /**
   * Runs `action`, then: the rule's reader must return exactly `expected` (what became safe to
   * read), and the subscription must receive exactly that too and store the same cursor.
   */
  async step(what: string, action: () => Promise<unknown>, expected: Label[]): Promise<void> {
    await action();
    for (const n of this.naive) await n.poll();
    expect(await this.rule.poll(), `read_messages after "${what}"`).toEqual(expected);
    await this.settle(what);
  }

  /** Waits until the subscription has received what the rule's reader read, and no more. */
  async settle(what: string): Promise<void> {
    const want = this.rule.delivered;
    const check = async () => {
      const got = this.received.map((r) => r.label);
      if (!isPrefix(got, want)) {
        throw new Error(
          `after "${what}" the subscription received [${got.join(', ')}] but the rule allows only [${want.join(', ')}]`,
        );
      }
      if (got.length < want.length) return false;
      const lag = await this.sub.lag();
      return (
        lag.cursor.transactionId === this.rule.cursor.tx &&
        String(lag.cursor.position) === this.rule.cursor.pos
      );
    };
    await waitFor(`the subscription to settle after "${what}"`, check);
    // When nothing became readable, give a wrong consumer the time to deliver early anyway
    // (it re-polls within pollInterval); a correct one is unaffected.
    await sleep(150);
    await check();
  }

  /** Every committed message of the topic, in (transaction, position) order. */
  async truth(): Promise<Label[]> {
    const { rows } = await admin.query(
      `SELECT data->>'label' AS label FROM ${this.schema}.messages WHERE topic = $1 ORDER BY transaction_id, position`,
      [this.topic],
    );
    return rows.map((r) => r.label);
  }

  /** The end of every scenario: nothing skipped, nothing twice, in order, everywhere. */
  async verify(): Promise<Label[]> {
    const truth = await this.truth();
    expect(this.rule.delivered).toEqual(truth);
    await this.settle('the end');
    expect(this.received.map((r) => r.label)).toEqual(truth);
    expect(duplicates(this.received.map((r) => r.label))).toEqual([]);
    for (let i = 1; i < this.received.length; i++) {
      const [a, b] = [this.received[i - 1]!, this.received[i]!];
      expect(a.tx < b.tx || (a.tx === b.tx && a.position < b.position)).toBe(true);
    }
    expect(Math.max(...this.batches, 0)).toBeLessThanOrEqual(this.batchSize);
    const lag = await this.sub.lag();
    expect(lag).toMatchObject({ messagesBehind: 0, waiting: 0, blockedBy: null, delivered: truth.length });
    return truth;
  }

  /** What each naive reader failed to deliver (read never, or twice). */
  naiveLosses(truth: Label[]): Record<string, { missing: Label[]; twice: Label[] }> {
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

describe('deterministic interleavings: the read function and a real subscription after every step', () => {
  it('a slow low-xid writer commits after a fast high-xid one: nothing is read until it ends', async () => {
    let truth: Label[] = [];
    const s = await scenario('slow-low', async (s) => {
      await s.step('A begins (low xid)', () => s.begin('A'), []);
      await s.step('B begins (higher xid)', () => s.begin('B'), []);
      await s.step('A appends a1', () => s.append('A', 'a1'), []);
      await s.step('B appends b1 b2', () => s.append('B', 'b1', 'b2'), []);
      await s.step('B commits', () => s.end('B', 'COMMIT'), []);
      // Committed but held back by A; lag says so and names A.
      const lag = await s.sub.lag();
      expect(lag).toMatchObject({ messagesBehind: 2, waiting: 2 });
      const { rows } = await s.writers.get('A')!.client.query('SELECT pg_backend_pid() AS pid');
      expect(lag.blockedBy).toMatchObject({
        pid: rows[0].pid,
        state: 'idle in transaction',
        applicationName: 'writer-A',
      });
      await s.step('a fast autocommit appends c1', () => s.autocommit('c1'), []);
      await s.step('A appends a2 (after b1 b2 c1 by position)', () => s.append('A', 'a2'), []);
      await s.step('A commits', () => s.end('A', 'COMMIT'), ['a1', 'a2', 'b1', 'b2', 'c1']);
      await s.step('d1 autocommit', () => s.autocommit('d1'), ['d1']);
      truth = await s.verify();
    });
    expect(truth).toEqual(['a1', 'a2', 'b1', 'b2', 'c1', 'd1']);
    // The same steps, read naively: by position a1 is lost; by (xid, position) without the
    // horizon a1 and a2 are lost, because b1 b2 c1 were checkpointed past them.
    expect(s.naiveLosses(truth)).toEqual({
      'naive.read_by_position': { missing: ['a1'], twice: [] },
      'naive.read_without_horizon': { missing: ['a1', 'a2'], twice: [] },
    });
  });

  it('several slow writers end out of order among fast ones: each is read once the older ones ended', async () => {
    const s = await scenario('several-slow', async (s) => {
      await s.step('W1 begins', () => s.begin('W1'), []);
      await s.step('W2 begins', () => s.begin('W2'), []);
      await s.step('W3 begins', () => s.begin('W3'), []);
      await s.step('W4 begins', () => s.begin('W4'), []);
      await s.step('W3 appends', () => s.append('W3', 'w3a'), []);
      await s.step('W1 appends', () => s.append('W1', 'w1a'), []);
      await s.step('W4 appends', () => s.append('W4', 'w4a', 'w4b'), []);
      await s.step('W2 appends', () => s.append('W2', 'w2a'), []);
      await s.step('x1 autocommit', () => s.autocommit('x1'), []);
      await s.step('W1 appends again', () => s.append('W1', 'w1b'), []);
      await s.step('W3 commits', () => s.end('W3', 'COMMIT'), []);
      await s.step('W4 commits', () => s.end('W4', 'COMMIT'), []);
      await s.step('W1 commits: only W1 is older than every open one', () => s.end('W1', 'COMMIT'), [
        'w1a',
        'w1b',
      ]);
      await s.step('x2 autocommit', () => s.autocommit('x2'), []);
      await s.step('W2 commits', () => s.end('W2', 'COMMIT'), ['w2a', 'w3a', 'w4a', 'w4b', 'x1', 'x2']);
      await s.verify();
    });
    const losses = s.naiveLosses(await s.truth());
    expect(losses['naive.read_by_position']!.missing.length).toBeGreaterThan(0);
    expect(losses['naive.read_without_horizon']!.missing.length).toBeGreaterThan(0);
  });

  it('rollbacks leave holes in positions: the consumer goes past them, missing nothing', async () => {
    const s = await scenario('holes', async (s) => {
      await s.step('A begins', () => s.begin('A'), []);
      await s.step('B begins', () => s.begin('B'), []);
      await s.step('A appends a1 a2', () => s.append('A', 'a1', 'a2'), []);
      await s.step('B appends b1', () => s.append('B', 'b1'), []);
      await s.step('B commits', () => s.end('B', 'COMMIT'), []);
      await s.step('A rolls back', () => s.end('A', 'ROLLBACK'), ['b1']);
      await s.step('c1 autocommit', () => s.autocommit('c1'), ['c1']);
      // A high-xid rollback while a low-xid writer is open, which then commits.
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
    // By position, b1 and c1 came first; d1 has a higher position, so here it is not lost.
    expect(s.naiveLosses(await s.truth())['naive.read_by_position']).toEqual({ missing: [], twice: [] });
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
        await s.step('x1 autocommit', () => s.autocommit('x1'), []);
        await s.step('T appends 1000 more', () => s.append('T', ...big(1000)), []);
        await s.step('x2 autocommit', () => s.autocommit('x2'), []);
        await s.step('T appends 1000 more', () => s.append('T', ...big(2000)), []);
        await s.step('T commits', () => s.end('T', 'COMMIT'), [
          ...big(0),
          ...big(1000),
          ...big(2000),
          'x1',
          'x2',
        ]);
        expect(await s.verify()).toHaveLength(3003);
        expect(s.batches.filter((n) => n === 100).length).toBeGreaterThanOrEqual(29);
      },
      { batchSize: 100 },
    );
  });

  it('property: random programs of slow and fast writers, commits and rollbacks, polled after every step', async () => {
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
        const rule = new SqlReader(reader, `${SCHEMA}.read_messages`, topic);
        let label = 0;
        const last = new Map<number, number>();
        p.tokens.forEach((t, i) => last.set(t, i));
        // An independent model of the rule: committed messages of transactions older than
        // every open one, in (xid, position) order.
        const begun = new Map<number, bigint>();
        const pending = new Map<number, { label: Label; xid: bigint; position: number }[]>();
        const committed: { label: Label; xid: bigint; position: number }[] = [];
        const begin = async (w: number) => {
          await spare[w]!.query('BEGIN');
          const { rows } = await spare[w]!.query('SELECT pg_current_xact_id()::text AS xid');
          begun.set(w, BigInt(rows[0].xid));
          pending.set(w, []);
        };
        const append = async (w?: number) => {
          const text = `m${String(++label).padStart(3, '0')}`;
          const tx = w === undefined ? undefined : spare[w];
          const [a] = await ordo.outbox.append(topic, { type: 'm', data: { label: text } }, { tx });
          const m = { label: text, xid: BigInt(a!.transactionId!), position: a!.position! };
          if (w === undefined) committed.push(m);
          else pending.get(w)!.push(m);
        };
        const delivered: Label[] = [];
        const check = async () => {
          delivered.push(...(await rule.poll()));
          const horizon = [...begun.values()].reduce((a, b) => (b < a ? b : a), 2n ** 64n);
          const safe = committed
            .filter((m) => m.xid < horizon)
            .sort((a, b) => (a.xid === b.xid ? a.position - b.position : a.xid < b.xid ? -1 : 1))
            .map((m) => m.label);
          expect(delivered).toEqual(safe);
        };
        try {
          for (let w = 0; w < p.writers; w++) if (p.early[w]) await begin(w);
          await check();
          for (const [i, t] of p.tokens.entries()) {
            if (t === -1) await append();
            else {
              if (!begun.has(t)) await begin(t);
              if (last.get(t) === i) {
                await spare[t]!.query(p.commit[t] ? 'COMMIT' : 'ROLLBACK');
                if (p.commit[t]) committed.push(...pending.get(t)!);
                begun.delete(t);
              } else await append(t);
            }
            await check();
          }
        } finally {
          for (const w of begun.keys()) await spare[w]!.query('ROLLBACK');
        }
        const { rows } = await admin.query(
          `SELECT data->>'label' AS label FROM ${SCHEMA}.messages WHERE topic = $1 ORDER BY transaction_id, position`,
          [topic],
        );
        const truth = rows.map((r) => r.label as Label);
        expect(delivered).toEqual(truth);
        // The subscription, started after the fact, reads the same.
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

describe('the harness catches a consumer that ignores the horizon', () => {
  it('a subscription whose read_messages (a mutated copy in a schema of its own) skips the horizon is caught', async () => {
    const schema = 'mutant';
    const mutant = await createOrdo({ databaseUrl: server.url, schema, poolSize: 4 });
    try {
      // The rule, kept under another name for the SQL reader, then read_messages broken.
      await admin.query(`
        CREATE FUNCTION ${schema}.read_messages_rule(msg_topic text, after_tx xid8, after_pos bigint, max_count int)
        RETURNS SETOF ${schema}.messages LANGUAGE sql STABLE AS $$
          SELECT * FROM ${schema}.messages m WHERE m.topic = msg_topic
             AND (m.transaction_id, m.position) > (after_tx, after_pos)
             AND m.transaction_id < pg_snapshot_xmin(pg_current_snapshot())
           ORDER BY m.transaction_id, m.position LIMIT max_count $$`);
      await admin.query(`
        CREATE OR REPLACE FUNCTION ${schema}.read_messages(msg_topic text, after_transaction_id xid8,
          after_position bigint, max_count integer)
        RETURNS SETOF ${schema}.messages LANGUAGE sql STABLE AS $$
          SELECT * FROM ${schema}.messages m WHERE m.topic = msg_topic
             AND (m.transaction_id, m.position) > (after_transaction_id, after_position)
           ORDER BY m.transaction_id, m.position LIMIT max_count $$`);
      const s = new Scenario(mutant, schema, 'mutant', reader, {
        ruleFn: `${schema}.read_messages_rule`,
        naive: false,
      });
      try {
        await s.start();
        await s.step('A begins', () => s.begin('A'), []);
        await s.step('B begins', () => s.begin('B'), []);
        await s.step('A appends a1', () => s.append('A', 'a1'), []);
        await s.step('B appends b1', () => s.append('B', 'b1'), []);
        await expect(s.step('B commits', () => s.end('B', 'COMMIT'), [])).rejects.toThrow(
          'the subscription received [b1] but the rule allows only []',
        );
        await s.end('A', 'COMMIT');
        await s.rule.poll();
        // a1 never comes: its transaction id is below the checkpointed b1.
        await sleep(500);
        expect(s.received.map((r) => r.label)).toEqual(['b1']);
        await expect(s.verify()).rejects.toThrow();
      } finally {
        await s.close();
      }
    } finally {
      await mutant.close();
    }
  });
});
