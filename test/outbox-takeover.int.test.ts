// A message that crashes its consumer (issue #12): consumer processes of this library
// (test/support/outbox-consumer.ts) SIGKILL themselves whenever their batch holds the poison
// message, and are started again, as a supervisor would. Each next holder takes the partition
// over once the dead one's lease lapses; the lapse counts as a failed attempt, as a nack (and
// receive_any over HTTP) counts it, so the message is parked after maxAttempts, or the
// subscription stops with onExhausted 'stop', instead of crashing consumers forever. The
// messages around it are handled exactly once (a second delivery would break the primary key
// of `received`, written in the handler's transaction).
import { type ChildProcess, spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Ordo } from '../src/index.js';
import { waitingForLock } from './support/lock-waits.js';
import { type OutboxServer, outboxServer } from './support/outbox-server.js';
import type { OwnPostgres } from './support/own-postgres.js';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
/** More processes than any fix needs: a subscription that loops forever ends the test here. */
const MAX_PROCESSES = 8;

let server: OwnPostgres;
let ordo: Ordo;
let raw: pg.Pool;
let children: Set<ChildProcess>;
let fixture: OutboxServer | undefined;

// A server of its own: the SIGKILLs and restarts touch nothing of other files.
beforeAll(async () => {
  fixture = await outboxServer({ rawMax: 4 });
  ({ server, ordo, raw, children } = fixture);
});
afterAll(() => fixture?.stop());

interface Delivery {
  consumer: number;
  positions: number[];
  attempt: number;
}

/** How one consumer process ended: killed by its own SIGKILL, or its subscription's `done` line. */
type Ending = { killed: true } | { killed: false; done: string };

/**
 * One consumer process of `name` (lease 300 ms), killing itself on messages of type 'Poison';
 * its batches are pushed to `deliveries` as it prints them. `finished()` says when the test
 * has what it waits for: the process is then told to stop.
 */
async function consumerProcess(
  consumer: number,
  name: string,
  options: object,
  deliveries: Delivery[],
  finished: () => Promise<boolean>,
): Promise<Ending> {
  const child = spawn(
    process.execPath,
    [
      '--import',
      'tsx',
      'test/support/outbox-consumer.ts',
      server.url,
      name,
      name,
      '300ms',
      '100',
      '0',
      `p${consumer}`,
    ],
    {
      cwd: ROOT,
      env: {
        ...process.env,
        OUTBOX_CONSUMER_OPTIONS: JSON.stringify(options),
        OUTBOX_CONSUMER_KILL_ON: 'Poison',
      },
      stdio: ['pipe', 'pipe', 'inherit'],
    },
  );
  children.add(child);
  let done: string | undefined;
  createInterface({ input: child.stdout! }).on('line', (line) => {
    const [word, , refs, attempt] = line.split(' ');
    if (word === 'ready') child.stdin!.write('go\n');
    if (word === 'handling')
      deliveries.push({
        consumer,
        positions: refs!.split(',').map((ref) => Number(ref.split(':')[1])),
        attempt: Number(attempt),
      });
    if (word === 'done') done = line.slice('done '.length);
  });
  const exited = new Promise<void>((resolve) => child.on('close', () => resolve()));
  let running = true;
  void exited.then(() => (running = false));
  while (running && done === undefined) {
    if (await finished()) {
      child.stdin!.end();
      break;
    }
    await sleep(50);
  }
  await exited;
  children.delete(child);
  return child.signalCode === 'SIGKILL' ? { killed: true } : { killed: false, done: done ?? '' };
}

/** Consumer processes one after the other (a supervisor restarting a crashed one) until one is not killed. */
async function supervise(
  name: string,
  options: object,
  finished: () => Promise<boolean>,
): Promise<{ deliveries: Delivery[]; endings: Ending[] }> {
  const deliveries: Delivery[] = [];
  const endings: Ending[] = [];
  while (endings.length < MAX_PROCESSES) {
    const ending = await consumerProcess(endings.length, name, options, deliveries, finished);
    endings.push(ending);
    if (!ending.killed) break;
  }
  return { deliveries, endings };
}

const appendAll = (topic: string, types: string[]) =>
  ordo.outbox.append(
    topic,
    types.map((type, i) => ({ type, data: { i } })),
  );

async function receivedPositions(): Promise<number[]> {
  const { rows } = await raw.query('SELECT position FROM received ORDER BY n');
  return rows.map((r) => Number(r.position));
}

describe('a message that kills its consumer process', () => {
  it('is parked after maxAttempts takeovers; the messages around it are handled once each, in order', async () => {
    const types = ['m', 'm', 'm', 'Poison', 'm', 'm', 'm', 'm', 'm', 'm'];
    const appended = (await appendAll('crash', types)).map((a) => a.position!);
    const poison = appended[3]!;
    const others = appended.filter((p) => p !== poison);
    const { deliveries, endings } = await supervise('crash', { maxAttempts: 3 }, async () => {
      const dead = await ordo.outbox.deadLetters('crash');
      return dead.length > 0 && (await receivedPositions()).length === others.length;
    });

    // The batch of ten, then one at a time: the poison alone, attempts 1, 2, 3, each killing
    // its process; the batch that failed does not count against it (as with a handler that throws).
    expect(
      deliveries.filter((d) => d.positions.includes(poison)).map((d) => [d.positions.length, d.attempt]),
    ).toEqual([
      [10, 1],
      [1, 1],
      [1, 2],
      [1, 3],
    ]);
    expect(endings).toEqual([
      { killed: true },
      { killed: true },
      { killed: true },
      { killed: true },
      { killed: false, done: 'stopped' },
    ]);
    const dead = await ordo.outbox.deadLetters('crash');
    expect(dead.map((d) => [d.position, d.attempts])).toEqual([[poison, 3]]);
    expect(dead[0]!.error).toContain('lapsed');
    // Nothing skipped, nothing twice, in order.
    expect(await receivedPositions()).toEqual(others);
    expect(await ordo.outbox.lag('crash')).toMatchObject({
      messagesBehind: 0,
      delivered: others.length,
      deadLettered: 1,
      attempts: 0,
    });
  });

  it("with onExhausted 'stop': the holder that finds maxAttempts reached stops (exhausted), the message stays, and is handled once the handler copes", async () => {
    const appended = (await appendAll('crash-stop', ['m', 'Poison', 'm'])).map((a) => a.position!);
    const { deliveries, endings } = await supervise(
      'crash-stop',
      { maxAttempts: 2, onExhausted: 'stop' },
      async () => false,
    );
    expect(
      deliveries
        .filter((d) => d.positions.includes(appended[1]!))
        .map((d) => [d.positions.length, d.attempt]),
    ).toEqual([
      [3, 1],
      [1, 1],
      [1, 2],
    ]);
    expect(endings).toEqual([
      { killed: true },
      { killed: true },
      { killed: true },
      { killed: false, done: 'exhausted handler_failed' },
    ]);
    expect(await receivedPositions()).toContain(appended[0]);
    expect(await receivedPositions()).not.toContain(appended[1]);
    expect(await ordo.outbox.deadLetters('crash-stop')).toEqual([]);
    expect(await ordo.outbox.lag('crash-stop')).toMatchObject({
      partitions: [expect.objectContaining({ position: appended[0] })],
      attempts: 2,
      messagesBehind: 2,
      owner: null,
    });
    expect((await ordo.outbox.lag('crash-stop')).lastError).toContain('lapsed');
    // Started again with a handler that copes, it resumes at the message it stopped on.
    const got: number[] = [];
    const again = await ordo.outbox.subscribe({
      name: 'crash-stop',
      topic: 'crash-stop',
      handler: (ms) => void got.push(...ms.map((m) => m.position)),
    });
    try {
      for (let i = 0; i < 200 && got.length < 2; i++) await sleep(25);
      expect(got).toEqual(appended.slice(1));
    } finally {
      await again.stop();
    }
  });
});

describe('lease_partition from SQL', () => {
  it('refused without a write while another holds the lease; once it lapsed, taken and its batch failed as a nack fails it', async () => {
    await ordo.outbox.createSubscription({ name: 'by-sql', topic: 'by-sql' });
    const appended = (await appendAll('by-sql', ['m', 'm'])).map((a) => a.position!);
    const c = await raw.connect();
    const lease = async (owner: string, maxAttempts = 10) =>
      (await c.query(`SELECT * FROM ordo.lease_partition('by-sql', 0, $1, 300, $2)`, [owner, maxAttempts]))
        .rows;
    const receive = async (owner: string) =>
      (
        await c.query(`SELECT position, attempt FROM ordo.receive('by-sql', 0, $1, 10, 300)`, [owner])
      ).rows.map((r) => [Number(r.position), r.attempt]);
    try {
      expect(await lease('a')).toEqual([{ partition: 0, outcome: null, attempts: null }]);
      expect(await receive('a')).toEqual(appended.map((p) => [p, 1]));
      // Held by a: b is refused, and its look locked nothing (no transaction id).
      await c.query('BEGIN');
      expect(await lease('b')).toEqual([]);
      expect((await c.query('SELECT pg_current_xact_id_if_assigned() AS xid')).rows).toEqual([{ xid: null }]);
      await c.query('COMMIT');
      await sleep(350);
      // a's lease lapsed with its batch of two: they come one at a time.
      expect(await lease('b')).toEqual([{ partition: 0, outcome: 'split', attempts: 0 }]);
      expect(await receive('b')).toEqual([[appended[0], 1]]);
      await sleep(350);
      // b's lapsed with the first alone: a failed attempt; with max_attempts 1, parked.
      expect(await lease('c', 1)).toEqual([{ partition: 0, outcome: 'parked', attempts: 1 }]);
      expect(await receive('c')).toEqual([[appended[1], 1]]);
      expect((await ordo.outbox.deadLetters('by-sql')).map((d) => d.position)).toEqual([appended[0]]);
      const refused = await lease('c', 0).catch((e: { code?: string }) => e);
      expect((refused as { code?: string }).code).toBe('OX003');
    } finally {
      c.release();
    }
  });

  it('a receive by the holder, overtaken while it runs by a takeover of its lapsed lease, gets nothing and changes nothing', async () => {
    await ordo.outbox.createSubscription({ name: 'overtaken', topic: 'overtaken' });
    const appended = (await appendAll('overtaken', ['m', 'm', 'm'])).map((a) => a.position!);
    const [a, b] = [await raw.connect(), await raw.connect()];
    const partition = async () =>
      (
        await raw.query(
          `SELECT owner, version::int, batch_last::int FROM ordo.subscription_partitions WHERE subscription = 'overtaken'`,
        )
      ).rows[0];
    try {
      await a.query(`SELECT * FROM ordo.lease_partition('overtaken', 0, 'a', 300)`);
      await sleep(350);
      // b takes the lapsed lease over and has not committed when a's receive runs: a reads the
      // partition as its own, then waits for b's row lock to write its batch.
      await b.query('BEGIN');
      expect(
        (await b.query(`SELECT * FROM ordo.lease_partition('overtaken', 0, 'b', 30000)`)).rows,
      ).toHaveLength(1);
      const before = await partition();
      const aPid = (await a.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
      const received = a.query(`SELECT position FROM ordo.receive('overtaken', 0, 'a', 10, 30000)`);
      await waitingForLock(raw, { pid: aPid });
      await b.query('COMMIT');
      // The partition is b's: a gets nothing, and its batch was not written over b's partition.
      expect((await received).rows).toEqual([]);
      expect(await partition()).toEqual({ ...before, owner: 'b' });
      const bReceives = await b.query(
        `SELECT position, attempt FROM ordo.receive('overtaken', 0, 'b', 10, 30000)`,
      );
      expect(bReceives.rows.map((r) => [Number(r.position), r.attempt])).toEqual(appended.map((p) => [p, 1]));
    } finally {
      await b.query('ROLLBACK').catch(() => undefined);
      a.release();
      b.release();
    }
  });
});
