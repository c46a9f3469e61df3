// Chaos for the outbox (issue #5): writers committing out of order with random delays and one
// rolling back, the consumer stopped and restarted mid-way, a consumer process killed with
// SIGKILL in the middle of a batch and replaced once its lease lapsed. Every committed message
// is delivered exactly once, no rolled-back message ever, in commit order (never a message
// before one whose transaction committed before it was appended; one transaction's messages
// in append order); meanwhile a naive `position > last` cursor reading the same table loses messages.
import { type ChildProcess, spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Ordo, OrdoError, Subscription } from '../src/index.js';
import { type OutboxServer, outboxServer } from './support/outbox-server.js';
import type { OwnPostgres } from './support/own-postgres.js';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const TOPIC = 'chaos';
const SUBSCRIPTION = 'chaos-consumer';
/** How long the writers run. */
const WRITING_MS = 7_000;
/** The child's batches: small, and slow in the handler, so that a kill lands mid-batch. */
const CHILD_BATCH = 20;
const CHILD_DELAY_MS = 200;

let server: OwnPostgres;
let ordo: Ordo;
let raw: pg.Pool;
let children: Set<ChildProcess>;
let fixture: OutboxServer | undefined;

// A server of its own: the SIGKILLs and restarts touch nothing of other files.
beforeAll(async () => {
  fixture = await outboxServer({ poolSize: 8, rawMax: 4 });
  ({ server, ordo, raw, children } = fixture);
});
afterAll(() => fixture?.stop());

interface Ref {
  transactionId: string;
  position: number;
}

/** (transaction, position) order; transaction ids are xid8 as decimal text. */
/**
 * Deliveries against commit order: pairs where a message came before one whose transaction
 * had committed (as the writer saw it return) before the first was appended (as the writer
 * began the call), and pairs of one transaction out of position order.
 */
function disorder(refs: Ref[], ledger: Ledger): number {
  let n = 0;
  const last = new Map<string, number>();
  let latestAppend = -Infinity;
  for (let j = 0; j < refs.length; j++) {
    const b = refs[j]!;
    // Any earlier delivery appended after b had committed is out of commit order.
    if (j > 0 && ledger.committedAt.get(b.position)! < latestAppend) {
      for (let i = 0; i < j; i++)
        if (ledger.committedAt.get(b.position)! < ledger.appendedAt.get(refs[i]!.position)!) n++;
    }
    latestAppend = Math.max(latestAppend, ledger.appendedAt.get(b.position)!);
    if ((last.get(b.transactionId) ?? -1) > b.position) n++;
    last.set(b.transactionId, b.position);
  }
  return n;
}

const random = (min: number, max: number) => min + Math.floor(Math.random() * (max - min + 1));
const byNumber = (a: number, b: number) => a - b;

/** What the writers did: committed messages (position → transaction id) and rolled-back positions. */
interface Ledger {
  committed: Map<number, string>;
  /** When the append of each message began, and when its transaction's COMMIT returned. */
  appendedAt: Map<number, number>;
  committedAt: Map<number, number>;
  rolledBack: Set<number>;
  transactions: number;
}

/**
 * One writer on its own connection: BEGIN, take the transaction id at once (so that it is
 * older than transactions that start later but commit earlier), wait, append 1–5 messages,
 * wait, then COMMIT (or ROLLBACK), until `writing()` turns false.
 */
async function writer(id: number, rollback: boolean, writing: () => boolean, ledger: Ledger): Promise<void> {
  const client = new pg.Client({ connectionString: server.url, application_name: `writer-${id}` });
  await client.connect();
  try {
    for (let txn = 0; writing(); txn++) {
      await client.query('BEGIN');
      const { rows } = await client.query('SELECT pg_current_xact_id()::text AS xid');
      await sleep(random(0, 15));
      const messages = Array.from({ length: random(1, 5) }, (_, i) => ({
        type: rollback ? 'RolledBack' : 'Committed',
        key: `w${id}`,
        data: { writer: id, txn, i },
      }));
      const appending = performance.now();
      const appended = await ordo.outbox.append(TOPIC, messages, { tx: client });
      await sleep(random(0, 25));
      await client.query(rollback ? 'ROLLBACK' : 'COMMIT');
      const ended = performance.now();
      for (const a of appended) {
        ledger.appendedAt.set(a.position!, appending);
        ledger.committedAt.set(a.position!, ended);
        expect(a.transactionId).toBe(rows[0].xid);
        if (rollback) ledger.rolledBack.add(a.position!);
        else ledger.committed.set(a.position!, a.transactionId!);
      }
      if (!rollback) ledger.transactions++;
    }
  } finally {
    await client.end();
  }
}

/** The classic outbox relay: `position > last`, moving `last` to the largest position seen. */
class NaiveCursor {
  last = 0;
  readonly seen = new Set<number>();
  constructor(private readonly client: pg.Client) {}

  async poll(): Promise<void> {
    for (;;) {
      const { rows } = await this.client.query(
        'SELECT position FROM ordo.messages WHERE topic = $1 AND position > $2 ORDER BY position LIMIT 100',
        [TOPIC, this.last],
      );
      for (const r of rows) {
        const position = Number(r.position);
        this.seen.add(position);
        this.last = Math.max(this.last, position);
      }
      if (rows.length < 100) return;
    }
  }
}

/**
 * Makes the naive cursor lose a message whatever the timing: an older transaction appends and
 * stays open while a younger one appends after it and commits; once the naive cursor has moved
 * past the younger message, the older one commits, behind the cursor. Returns its position.
 */
async function forceNaiveLoss(naive: NaiveCursor, ledger: Ledger): Promise<number> {
  const older = new pg.Client({ connectionString: server.url, application_name: 'forced-older' });
  const younger = new pg.Client({ connectionString: server.url, application_name: 'forced-younger' });
  await Promise.all([older.connect(), younger.connect()]);
  try {
    await older.query('BEGIN');
    const heldAt = performance.now();
    const [held] = await ordo.outbox.append(TOPIC, { type: 'Held', data: { held: true } }, { tx: older });
    await younger.query('BEGIN');
    const passingAt = performance.now();
    const [passing] = await ordo.outbox.append(TOPIC, { type: 'Passing', data: {} }, { tx: younger });
    ledger.appendedAt.set(held!.position!, heldAt);
    ledger.appendedAt.set(passing!.position!, passingAt);
    expect(held!.position!).toBeLessThan(passing!.position!);
    expect(BigInt(held!.transactionId!)).toBeLessThan(BigInt(passing!.transactionId!));
    await younger.query('COMMIT');
    ledger.committedAt.set(passing!.position!, performance.now());
    ledger.committed.set(passing!.position!, passing!.transactionId!);
    for (let waited = 0; naive.last < passing!.position!; waited += 2) {
      expect(waited).toBeLessThan(5_000);
      await sleep(2);
    }
    await older.query('COMMIT');
    ledger.committedAt.set(held!.position!, performance.now());
    ledger.committed.set(held!.position!, held!.transactionId!);
    return held!.position!;
  } finally {
    await Promise.all([older.end(), younger.end()]);
  }
}

interface Delivery extends Ref {
  consumer: string;
  at: number;
}

/** A consumer process (test/support/outbox-consumer.ts) and what it printed. */
interface ConsumerChild {
  child: ChildProcess;
  /** Batches in the order handled (inserted, not yet committed, when printed). */
  batches: Ref[][];
  errors: string[];
  ready: Promise<void>;
  exited: Promise<void>;
  /** Resolves once `n` batches were handled. */
  handled(n: number): Promise<void>;
  send(command: string): void;
}

function startChild(label: string): ConsumerChild {
  const child = spawn(
    process.execPath,
    [
      '--import',
      'tsx',
      'test/support/outbox-consumer.ts',
      server.url,
      SUBSCRIPTION,
      TOPIC,
      '1s',
      String(CHILD_BATCH),
      String(CHILD_DELAY_MS),
      label,
    ],
    { cwd: ROOT, stdio: ['pipe', 'pipe', 'inherit'] },
  );
  children.add(child);
  const batches: Ref[][] = [];
  const errors: string[] = [];
  const waiters: { n: number; resolve: () => void }[] = [];
  let isReady!: () => void;
  const ready = new Promise<void>((resolve) => {
    isReady = resolve;
  });
  // 'close' comes after the exit and the last line of its output.
  const exited = new Promise<void>((resolve) => {
    child.on('close', () => {
      children.delete(child);
      resolve();
    });
  });
  createInterface({ input: child.stdout! }).on('line', (line) => {
    if (line === 'ready') isReady();
    else if (line.startsWith('error ')) errors.push(line);
    else if (line.startsWith('handling ')) {
      const list = line.split(' ')[2]!;
      batches.push(
        list.split(',').map((ref) => {
          const [transactionId, position] = ref.split(':');
          return { transactionId: transactionId!, position: Number(position) };
        }),
      );
      for (const w of waiters.filter((w) => batches.length >= w.n)) w.resolve();
    }
  });
  return {
    child,
    batches,
    errors,
    ready: Promise.race([
      ready,
      exited.then(() => {
        throw new Error('the consumer process exited before it was ready');
      }),
    ]),
    exited,
    handled: (n) =>
      batches.length >= n ? Promise.resolve() : new Promise((resolve) => waiters.push({ n, resolve })),
    send: (command) => child.stdin!.write(`${command}\n`),
  };
}

describe('outbox chaos', () => {
  it('out-of-order commits, rollbacks, a restart and a SIGKILL: every committed message once, in order', async () => {
    const processConsumer = startChild('child');
    await processConsumer.ready;

    const ledger: Ledger = {
      committed: new Map(),
      appendedAt: new Map(),
      committedAt: new Map(),
      rolledBack: new Set(),
      transactions: 0,
    };
    const memory: Delivery[] = [];
    const errors: OrdoError[] = [];
    const consume = (label: string, lease = '30s'): Promise<Subscription> =>
      ordo.outbox.subscribe({
        name: SUBSCRIPTION,
        topic: TOPIC,
        lease,
        pollInterval: '100ms',
        onError: (e) => errors.push(e),
        handler: async (messages, { tx }) => {
          await tx.query(
            'INSERT INTO received (position, transaction_id, consumer) SELECT p, t::xid8, $3 FROM unnest($1::bigint[], $2::text[]) AS u (p, t)',
            [messages.map((m) => m.position), messages.map((m) => m.transactionId), label],
          );
          const at = performance.now();
          for (const m of messages) {
            memory.push({ consumer: label, transactionId: m.transactionId, position: m.position, at });
          }
        },
      });

    const started = performance.now();
    let writing = true;
    const writers = [0, 1, 2, 3, 4].map((id) => writer(id, id === 4, () => writing, ledger));
    const naiveClient = new pg.Client({ connectionString: server.url, application_name: 'naive' });
    await naiveClient.connect();
    const naive = new NaiveCursor(naiveClient);
    let polling = true;
    const naiveLoop = (async () => {
      while (polling) {
        await naive.poll();
        await sleep(3);
      }
    })();

    // An in-process consumer, stopped mid-way and restarted a moment later.
    const first = await consume('c1');
    await sleep(1_000);
    const forced = await forceNaiveLoss(naive, ledger);
    await sleep(500);
    expect(await first.stop()).toEqual({ reason: 'stopped' });
    await sleep(300);
    const second = await consume('c2');
    await sleep(1_200);
    expect(await second.stop()).toEqual({ reason: 'stopped' });

    // A consumer process with a 1 s lease takes over; a standby in this process waits for the
    // lease; the process is killed while a batch is in its handler, inserted but uncommitted.
    processConsumer.send('go');
    await processConsumer.handled(1);
    const standby = await consume('c3', '1s');
    await processConsumer.handled(5);
    processConsumer.child.kill('SIGKILL');
    const killedAt = performance.now();
    await processConsumer.exited;
    const inFlight = processConsumer.batches.at(-1)!;

    await sleep(Math.max(0, WRITING_MS - (performance.now() - started)));
    writing = false;
    await Promise.all(writers);
    // Until the cursor has passed every message (a consumer that skipped some gets there too).
    for (let waited = 0; (await standby.lag()).messagesBehind > 0; waited += 50) {
      expect(waited, 'the consumers did not catch up').toBeLessThan(20_000);
      await sleep(50);
    }
    polling = false;
    await naiveLoop;
    await naive.poll();
    await naiveClient.end();
    const lag = await standby.lag();
    expect(await standby.stop()).toEqual({ reason: 'stopped' });

    // Exactly once, in commit order, nothing rolled back, in the table.
    const { rows } = await raw.query(
      'SELECT position, transaction_id::text, consumer FROM received ORDER BY n',
    );
    const received = rows.map((r) => ({
      position: Number(r.position),
      transactionId: r.transaction_id as string,
      consumer: r.consumer as string,
    }));
    const committed = [...ledger.committed.keys()].sort(byNumber);
    expect(received.map((r) => r.position).sort(byNumber)).toEqual(committed);
    expect(disorder(received, ledger)).toBe(0);
    for (const r of received) expect(r.transactionId).toBe(ledger.committed.get(r.position));
    expect(ledger.rolledBack.size).toBeGreaterThan(0);
    expect(received.filter((r) => ledger.rolledBack.has(r.position))).toEqual([]);
    const stored = await raw.query('SELECT position FROM ordo.messages WHERE topic = $1 ORDER BY position', [
      TOPIC,
    ]);
    expect(stored.rows.map((r) => Number(r.position))).toEqual(committed);
    // Every consumer took part: c1, then c2 after the restart, the process, then the standby.
    const by = (consumer: string) => received.filter((r) => r.consumer === consumer).length;
    for (const consumer of ['c1', 'c2', 'child', 'c3']) expect(by(consumer), consumer).toBeGreaterThan(0);

    // In memory too: the in-process consumers never saw a message twice or out of order, nor a
    // rolled-back one.
    expect(new Set(memory.map((d) => d.position)).size).toBe(memory.length);
    expect(disorder(memory, ledger)).toBe(0);
    expect(memory.filter((d) => ledger.rolledBack.has(d.position))).toEqual([]);
    expect(errors).toEqual([]);

    // The process: its batches before the last committed; the last, in flight when it was
    // killed, was rolled back and delivered again to the standby, which waited for the lease.
    expect(processConsumer.errors).toEqual([]);
    const childRows = received.filter((r) => r.consumer === 'child').map((r) => r.position);
    expect(childRows).toEqual(processConsumer.batches.slice(0, -1).flatMap((b) => b.map((m) => m.position)));
    const redelivered = new Map(received.map((r) => [r.position, r.consumer]));
    for (const m of inFlight) expect(redelivered.get(m.position)).toBe('c3');
    const standbyDeliveries = memory.filter((d) => d.consumer === 'c3');
    expect(standbyDeliveries[0]!.at).toBeGreaterThan(killedAt);
    expect(standbyDeliveries[0]!.position).toBe(inFlight[0]!.position);
    expect(standbyDeliveries[0]!.at - killedAt).toBeLessThan(3_000);

    // The subscription's own account agrees.
    expect(lag).toMatchObject({ messagesBehind: 0, waiting: 0, delivered: ledger.committed.size });

    // The naive cursor lost messages for good: at least the one forced behind it.
    const lost = committed.filter((p) => !naive.seen.has(p));
    expect(lost).toContain(forced);
    expect(lost.length).toBeGreaterThan(0);
    console.info(
      `outbox chaos: ${ledger.transactions} transactions, ${committed.length} messages committed, ` +
        `${ledger.rolledBack.size} rolled back; consumers c1/c2/child/c3 handled ` +
        `${by('c1')}/${by('c2')}/${by('child')}/${by('c3')}; the standby's first delivery ` +
        `${Math.round(standbyDeliveries[0]!.at - killedAt)} ms after the kill; naive cursor lost ${lost.length} ` +
        `(${lost.length - 1} without the forced one)`,
    );
  });
});
