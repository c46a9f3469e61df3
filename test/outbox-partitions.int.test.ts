// Partitions by key (issue #12): consumer processes share a subscription's partitions by
// leases; one is killed with SIGKILL and another joins mid-run. Every committed message is
// handled exactly once (a second delivery would break the table's primary key, written in the
// handler's transaction), and each key's messages in the order they were appended. Also seek:
// refused while consumed, then a replay, a skip, and a time.
import { type ChildProcess, spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Ordo, OrdoError } from '../src/index.js';
import { waitingForLock } from './support/lock-waits.js';
import { type OutboxServer, outboxServer } from './support/outbox-server.js';
import type { OwnPostgres } from './support/own-postgres.js';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
let server: OwnPostgres;
let ordo: Ordo;
let raw: pg.Pool;
let children: Set<ChildProcess>;
let fixture: OutboxServer | undefined;

// A server of its own: the SIGKILLs and restarts touch nothing of other files.
beforeAll(async () => {
  fixture = await outboxServer({ poolSize: 6, rawMax: 4 });
  ({ server, ordo, raw, children } = fixture);
});
afterAll(() => fixture?.stop());

/** A consumer process of test/support/outbox-consumer.ts; resolves once it handled a batch. */
function consumerProcess(label: string): {
  child: ChildProcess;
  handled: Promise<void>;
  exited: Promise<void>;
} {
  const child = spawn(
    process.execPath,
    [
      '--import',
      'tsx',
      'test/support/outbox-consumer.ts',
      server.url,
      'parts',
      'keyed',
      '1s',
      '5',
      '20',
      label,
      '4',
    ],
    { cwd: ROOT, stdio: ['pipe', 'pipe', 'inherit'] },
  );
  children.add(child);
  const exited = new Promise<void>((resolve) => child.on('close', () => resolve()));
  const handled = new Promise<void>((resolve) => {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      if (line === 'ready') child.stdin!.write('go\n');
      if (line.startsWith('handling ')) resolve();
    });
  });
  return { child, handled, exited };
}

describe('partitions', () => {
  it('processes share 4 partitions; one killed with SIGKILL, one added: every message once, each key in order', async () => {
    const KEYS = 12;
    let writing = true;
    let appended = 0;
    const writer = (async () => {
      for (let i = 0; writing; i++) {
        await ordo.outbox.append(
          'keyed',
          Array.from({ length: KEYS }, (_, k) => ({ type: 'm', key: `k${k}`, data: { seq: i } })),
        );
        appended += KEYS;
        await sleep(10);
      }
    })();
    const a = consumerProcess('a');
    const b = consumerProcess('b');
    await Promise.all([a.handled, b.handled]);
    await sleep(1_500);
    a.child.kill('SIGKILL');
    await a.exited;
    const c = consumerProcess('c');
    await c.handled;
    await sleep(2_000);
    writing = false;
    await writer;
    // Until everything is handled (the killed one's partitions pass on once its leases lapse).
    for (let waited = 0; ; waited += 100) {
      const { rows } = await raw.query('SELECT count(*)::int AS n FROM received');
      if (rows[0].n >= appended) break;
      expect(waited, `handled ${rows[0].n} of ${appended}`).toBeLessThan(30_000);
      await sleep(100);
    }
    for (const p of [b, c]) p.child.stdin!.end();
    await Promise.all([b.exited, c.exited]);

    const { rows } = await raw.query(
      `SELECT r.consumer, m.key, (m.data->>'seq')::int AS seq
         FROM received r JOIN ordo.messages m ON m.position = r.position ORDER BY r.n`,
    );
    expect(rows).toHaveLength(appended);
    const byKey = new Map<string, number[]>();
    for (const r of rows) byKey.set(r.key, [...(byKey.get(r.key) ?? []), r.seq]);
    for (const [key, seqs] of byKey) {
      expect(seqs, key).toEqual(Array.from({ length: seqs.length }, (_, i) => i));
    }
    const by = (consumer: string) => rows.filter((r) => r.consumer === consumer).length;
    for (const consumer of ['a', 'b', 'c']) expect(by(consumer), consumer).toBeGreaterThan(0);
    // A key stays in one partition: each key was handled by at most one process at a time,
    // and the partitions were spread (b did not take all four while a lived).
    const lag = await ordo.outbox.lag('parts');
    expect(lag.partitions).toHaveLength(4);
    expect(lag).toMatchObject({ messagesBehind: 0, delivered: appended });
  });
});

describe('seek', () => {
  it('refused while a consumer holds the subscription; then to the beginning, to now, and to a time', async () => {
    await ordo.outbox.append(
      'replayed',
      [1, 2, 3].map((n) => ({ type: 'n', data: n })),
    );
    const got: number[] = [];
    const consume = () =>
      ordo.outbox.subscribe<number>({
        name: 'replay',
        topic: 'replayed',
        handler: (ms) => void got.push(...ms.map((m) => m.data)),
      });
    let sub = await consume();
    for (let i = 0; i < 100 && got.length < 3; i++) await sleep(20);
    const busy = await ordo.outbox.seek('replay', { to: 'beginning' }).catch((e: OrdoError) => e);
    expect(busy).toBeInstanceOf(OrdoError);
    expect((busy as OrdoError).code).toBe('subscription_busy');
    await sub.stop();

    await ordo.outbox.seek('replay', { to: 'beginning' });
    sub = await consume();
    for (let i = 0; i < 100 && got.length < 6; i++) await sleep(20);
    await sub.stop();
    expect(got).toEqual([1, 2, 3, 1, 2, 3]);

    await ordo.outbox.append('replayed', [{ type: 'n', data: 4 }]);
    await ordo.outbox.seek('replay', { to: 'now' });
    await sleep(20);
    const since = new Date();
    await sleep(20);
    await ordo.outbox.append('replayed', [{ type: 'n', data: 5 }]);
    sub = await consume();
    for (let i = 0; i < 100 && got.length < 7; i++) await sleep(20);
    await sub.stop();
    expect(got.slice(6)).toEqual([5]);

    await ordo.outbox.seek('replay', { to: since });
    sub = await consume();
    for (let i = 0; i < 100 && got.length < 8; i++) await sleep(20);
    await sub.stop();
    expect(got.slice(7)).toEqual([5]);

    for (const bad of [{ to: 'yesterday' }, { to: new Date('nope') }, {}]) {
      const e = await ordo.outbox.seek('replay', bad as never).catch((x: OrdoError) => x);
      expect((e as OrdoError).code).toBe('invalid_argument');
    }
    const missing = await ordo.outbox.seek('nobody', { to: 'now' }).catch((x: OrdoError) => x);
    expect((missing as OrdoError).code).toBe('subscription_not_found');
  });

  it('waits for a receive still writing its batch under a renewed lease, then refuses: nobody else gets that batch', async () => {
    await ordo.outbox.createSubscription({ name: 'sought', topic: 'sought' });
    const appended = await ordo.outbox.append(
      'sought',
      [7, 8, 9].map((n) => ({ type: 'n', data: n })),
    );
    const [c1, other] = [await raw.connect(), await raw.connect()];
    try {
      // c1's lease lapses, and nobody took the partition over: a seek now would be allowed.
      await c1.query(`SELECT * FROM ordo.lease_partition('sought', 0, 'c1', 300)`);
      await sleep(350);
      // c1 receives again (the lease renewed, the batch written), and has not committed when
      // the seek runs.
      await c1.query('BEGIN');
      const batch = await c1.query(`SELECT position FROM ordo.receive('sought', 0, 'c1', 10, 60000)`);
      expect(batch.rows.map((r) => Number(r.position))).toEqual(appended.map((a) => a.position));
      const sought = ordo.outbox.seek('sought', { to: 'beginning' }).catch((e: unknown) => e);
      // ordo's pool runs the seek: wait until it waits for c1's locks.
      await waitingForLock(raw, { like: '%seek_subscription%' });
      await c1.query('COMMIT');
      const outcome = await sought;
      expect(outcome).toBeInstanceOf(OrdoError);
      expect((outcome as OrdoError).code).toBe('subscription_busy');
      // c1 still holds its batch: another consumer gets nothing, and c1's acknowledgement counts.
      const taken = await other.query(`SELECT * FROM ordo.lease_partition('sought', 0, 'c2', 300)`);
      expect(taken.rows).toEqual([]);
      const version = (
        await other.query(
          `SELECT version FROM ordo.subscription_partitions WHERE subscription = 'sought' AND partition = 0`,
        )
      ).rows[0].version;
      expect((await c1.query(`SELECT ordo.ack('sought', 0, 'c1', $1, 60000) AS n`, [version])).rows).toEqual([
        { n: 3 },
      ]);
    } finally {
      await c1.query('ROLLBACK').catch(() => undefined);
      c1.release();
      other.release();
    }
  });
});
