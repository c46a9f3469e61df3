// The outbox across a dump and restore into a new cluster (and from there into a third), and
// across the upgrade from the schema of 0003 (issue #12). Transaction ids of a new cluster
// start low again: a message appended there has an id below everything the subscription has
// seen, and messages restored from the old cluster carry ids that mean nothing there.
// Subscriptions must go on: none skipped, none twice. PostgreSQL servers of this file's own
// (Debian's binaries, so that Debian's pg_dump matches them).
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Ordo, OrdoError } from '../src/index.js';
import { quoteIdent } from '../src/db/migrations.js';
import { migrateLegacy } from './support/legacy-schema.js';
import { type RestartablePostgres, restartablePostgres } from './support/restartable-postgres.js';
import { dump, restore, restoreServers, sql } from './support/restore.js';

const servers = restoreServers();
const { ordoOn } = servers;

/** Receives and acknowledges in batches of `max` until nothing comes; the labels, in order. */
async function drain(o: Ordo, name: string, max = 3): Promise<string[]> {
  const got: string[] = [];
  for (;;) {
    const batch = await o.outbox.receive<{ label: string }>(name, { max });
    if (batch.receipt === null) return got;
    got.push(...batch.messages.map((m) => m.data.label));
    await o.outbox.ack(name, batch.receipt);
  }
}

const labelled = (...labels: string[]) => labels.map((label) => ({ type: 'm', data: { label } }));

/** The URL of database `db` on the server of `url`. */
const inDb = (url: string, db: string) => url.replace(/\/postgres$/, `/${db}`);

/** pg_dump of database `db` on `from`, restored into a new database `db` on `to`. */
async function copyDatabase(from: RestartablePostgres, to: RestartablePostgres, db: string): Promise<void> {
  const file = await dump(inDb(from.url, db), to, db);
  await sql(to.url, `CREATE DATABASE ${db}`);
  await restore(file, inDb(to.url, db));
}

/**
 * Drains a subscription as a consumer in SQL does: lease, receive and acknowledge in one
 * transaction per batch (of 4). Its transaction has an id before receive() reads a round's
 * target, so the base a round leaves has no bound: every id from its snapshot's xmax up counts
 * as running. The labels, in order.
 */
async function drainBySql(url: string, name: string): Promise<string[]> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  const read: string[] = [];
  try {
    for (;;) {
      await c.query('BEGIN');
      await c.query(`SELECT ordo.lease_partition($1, 0, 'sql:reader', 30000)`, [name]);
      const { rows } = await c.query(
        `SELECT data->>'label' AS label, version::text FROM ordo.receive($1, 0, 'sql:reader', 4, 30000)`,
        [name],
      );
      if (rows.length > 0) {
        await c.query(`SELECT ordo.ack($1, 0, 'sql:reader', $2::bigint, 30000)`, [name, rows[0].version]);
      }
      await c.query('COMMIT');
      if (rows.length === 0) return read;
      read.push(...rows.map((r) => r.label));
    }
  } finally {
    await c.end();
  }
}

/** Whether a subscription's base has no bound, and was taken in the cluster of `url`. */
async function baseOf(url: string, name: string): Promise<{ unbounded: boolean; here: boolean }[]> {
  const { rows } = await sql(
    url,
    `SELECT base_bound IS NULL AS unbounded, cluster = ordo.cluster_id() AS here
       FROM ordo.subscription_partitions WHERE subscription = $1`,
    [name],
  );
  return rows;
}

/**
 * What one receive() would hand out, as drainBySql receives, if undelivered() looked for late
 * messages below the first position of the base's cluster too (as 0008's receive() did for a
 * base of another cluster than the round's): run with a copy that has no floor, rolled back.
 */
async function receivedWithoutFloor(url: string, name: string): Promise<string[]> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    await c.query('BEGIN');
    const { rows } = await c.query(`SELECT pg_get_functiondef('ordo.undelivered'::regproc) AS def`);
    const floor =
      /AND m\.position >= coalesce\(\(SELECT c\.first_position FROM \S+ c WHERE c\.cluster = st\.cluster\), 0\)/g;
    expect(rows[0].def.match(floor), 'the floor of both kinds of late messages').toHaveLength(2);
    await c.query(rows[0].def.replace(floor, ''));
    await c.query(`SELECT ordo.lease_partition($1, 0, 'sql:reader', 30000)`, [name]);
    const got = await c.query(
      `SELECT data->>'label' AS label FROM ordo.receive($1, 0, 'sql:reader', 100, 30000)`,
      [name],
    );
    return got.rows.map((r) => r.label);
  } finally {
    await c.query('ROLLBACK');
    await c.end();
  }
}

describe('dump and restore into a new cluster', () => {
  it('a subscription in the middle of a round goes on in the new cluster: the rest of the round, what committed after it, what is appended there; none twice', async () => {
    const a = await ordoOn(servers.old.url);
    // The old cluster is far ahead in transaction ids, as a cluster in production is.
    await sql(
      servers.old.url,
      `DO $$ BEGIN FOR i IN 1..3000 LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$`,
    );
    await a.outbox.createSubscription({ name: 'projector', topic: 'orders' });
    // Read in the new cluster by SQL alone, in one transaction per batch (see the end).
    await a.outbox.createSubscription({ name: 'sql-reader', topic: 'orders' });
    await a.outbox.append('orders', labelled('o1', 'o2', 'o3', 'o4', 'o5'));
    // Two batches of a round of five: the round is left half done.
    const first = await a.outbox.receive<{ label: string }>('projector', { max: 2 });
    await a.outbox.ack('projector', first.receipt!);
    const second = await a.outbox.receive<{ label: string }>('projector', { max: 1 });
    await a.outbox.ack('projector', second.receipt!);
    expect([...first.messages, ...second.messages].map((m) => m.data.label)).toEqual(['o1', 'o2', 'o3']);
    await a.outbox.append('orders', labelled('c1', 'c2'));
    // An appender open during the dump: not in it, so never delivered.
    const open = new pg.Client({ connectionString: servers.old.url });
    await open.connect();
    await open.query('BEGIN');
    await open.query(`SELECT ordo.append('orders', 'm', '{"label":"uncommitted"}')`);

    const file = await dump(servers.old.url, servers.restored, 'dump');
    await open.query('ROLLBACK');
    await open.end();
    await restore(file, servers.restored.url);

    const b = await ordoOn(servers.restored.url);
    const { rows } = await sql(
      servers.restored.url,
      `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS here,
              (SELECT max(transaction_id)::text::bigint FROM ordo.messages) AS restored`,
    );
    // The premise: ids of the new cluster are below those of the restored messages.
    expect(Number(rows[0].here)).toBeLessThan(Number(rows[0].restored));
    await b.outbox.append('orders', labelled('n1', 'n2'));
    expect(await drain(b, 'projector')).toEqual(['o4', 'o5', 'c1', 'c2', 'n1', 'n2']);
    // Behind by nothing at once: the restored messages carry ids of the old cluster, which a
    // base of the new one must not judge.
    expect(await b.outbox.lag('projector')).toMatchObject({ messagesBehind: 0, delivered: 9 });
    await b.outbox.append('orders', labelled('n3'));
    // A library consumer, the next rounds: new ids only.
    const got: string[] = [];
    const sub = await b.outbox.subscribe<{ label: string }>({
      name: 'projector',
      topic: 'orders',
      handler: (ms) => void got.push(...ms.map((m) => m.data.label)),
    });
    await b.outbox.append('orders', labelled('n4'));
    for (let i = 0; i < 200 && got.length < 2; i++) await new Promise((r) => setTimeout(r, 25));
    await sub.stop();
    expect(got).toEqual(['n3', 'n4']);
    const lag = await b.outbox.lag('projector');
    expect(lag).toMatchObject({ messagesBehind: 0, delivered: 11 });
    // A subscription made in the new cluster, from the beginning, reads everything once, in order.
    const all = ['o1', 'o2', 'o3', 'o4', 'o5', 'c1', 'c2', 'n1', 'n2', 'n3', 'n4'];
    await b.outbox.createSubscription({ name: 'late', topic: 'orders' });
    expect(await drain(b, 'late', 100)).toEqual(all);

    // A consumer in SQL (see drainBySql): the restored messages' old ids are all in the range
    // of ids its base in the new cluster counts as running.
    expect(await drainBySql(servers.restored.url, 'sql-reader')).toEqual(all);
    expect(await baseOf(servers.restored.url, 'sql-reader')).toEqual([{ unbounded: true, here: true }]);
    // Passed by every subscription: none behind, and prune deletes them all.
    for (const name of ['projector', 'late', 'sql-reader']) {
      expect((await b.outbox.lag(name)).messagesBehind, name).toBe(0);
    }
    expect(await b.outbox.prune({ olderThan: 0, topic: 'orders' })).toBe(all.length);
  });
});

describe('two restores: into a new cluster, and from there into another', () => {
  let third: RestartablePostgres;
  beforeAll(async () => {
    third = await restartablePostgres();
  }, 120_000);
  afterAll(() => third?.cleanup());

  it('a base taken in the second cluster does not look below its floor in the third: the first cluster’s messages are not delivered again; none skipped', async () => {
    const db = 'twice';
    const [first, second, last] = [servers.old, servers.restored, third].map((server) =>
      inDb(server.url, db),
    );
    await sql(servers.old.url, `CREATE DATABASE ${db}`);
    const a = await ordoOn(first!);
    // The first cluster far ahead in transaction ids: its messages carry ids above any the
    // second one has handed out.
    await sql(
      first!,
      `DO $$ BEGIN FOR i IN 1..5000 LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$`,
    );
    await a.outbox.createSubscription({ name: 'by-sql', topic: 't' });
    await a.outbox.createSubscription({ name: 'by-receive', topic: 't' });
    await a.outbox.append('t', labelled('a1', 'a2', 'a3'));
    expect(await drainBySql(first!, 'by-sql')).toEqual(['a1', 'a2', 'a3']);
    // by-receive leaves the first cluster's round half done.
    const started = await a.outbox.receive<{ label: string }>('by-receive', { max: 1 });
    expect(started.messages.map((m) => m.data.label)).toEqual(['a1']);
    await a.outbox.ack('by-receive', started.receipt!);

    await copyDatabase(servers.old, servers.restored, db);
    const b = await ordoOn(second!);
    await b.outbox.append('t', labelled('b1', 'b2'));
    expect(await drainBySql(second!, 'by-sql')).toEqual(['b1', 'b2']);
    expect(await drain(b, 'by-receive')).toEqual(['a2', 'a3', 'b1', 'b2']);
    // The premise: by-sql's base is of the second cluster and has no bound, so the ids of the
    // first cluster's messages lie in the range it counts as running.
    expect(await baseOf(second!, 'by-sql')).toEqual([{ unbounded: true, here: true }]);
    const { rows } = await sql(
      second!,
      `SELECT (SELECT min(m.transaction_id) FROM ordo.messages m WHERE m.data->>'label' LIKE 'a%')
                >= pg_snapshot_xmax(p.base_snapshot) AS in_range
         FROM ordo.subscription_partitions p WHERE p.subscription = 'by-sql'`,
    );
    expect(rows).toEqual([{ in_range: true }]);

    await copyDatabase(servers.restored, third, db);
    const c = await ordoOn(last!);
    await c.outbox.append('t', labelled('c1'));
    // Below the floor of the base's (second) cluster, the first cluster's messages were
    // delivered whole; a receive() that looked there would deliver them again.
    expect(await receivedWithoutFloor(last!, 'by-sql')).toEqual(['a1', 'a2', 'a3', 'c1']);
    expect(await c.outbox.lag('by-sql')).toMatchObject({ messagesBehind: 1, delivered: 5 });
    expect(await drainBySql(last!, 'by-sql')).toEqual(['c1']);
    expect(await drain(c, 'by-receive')).toEqual(['c1']);
    await c.outbox.append('t', labelled('c2'));
    expect(await drainBySql(last!, 'by-sql')).toEqual(['c2']);
    expect(await drain(c, 'by-receive')).toEqual(['c2']);
    const all = ['a1', 'a2', 'a3', 'b1', 'b2', 'c1', 'c2'];
    await c.outbox.createSubscription({ name: 'late', topic: 't' });
    expect(await drain(c, 'late', 100)).toEqual(all);
    for (const name of ['by-sql', 'by-receive', 'late']) {
      expect(await c.outbox.lag(name), name).toMatchObject({ messagesBehind: 0, delivered: all.length });
    }
  });
});

describe('the upgrade from the schema of 0003 (migrations 1 to 7)', () => {
  it('a subscription with a cursor of 0003 goes on after the migration: none lost, none twice, an open appender included', async () => {
    const schema = 'upgraded';
    const s = quoteIdent(schema);
    // The schema as ordo 0.x left it: migrations 1 to 7.
    const c = new pg.Client({ connectionString: servers.old.url });
    await c.connect();
    try {
      const pool = new pg.Pool({ connectionString: servers.old.url, max: 1 });
      await migrateLegacy(pool, schema, 7).finally(() => pool.end());
      const append = (label: string, on: pg.Client = c) =>
        on.query(`SELECT ${s}.append('t', 'm', jsonb_build_object('label', $1::text))`, [label]);
      await c.query(`SELECT ${s}.create_subscription('sub', 't', 'beginning')`);
      for (const l of ['a1', 'a2', 'a3', 'a4']) await append(l);
      // The 0003 consumer: read two, checkpoint the second.
      const { rows } = await c.query(
        `SELECT transaction_id::text, position, data->>'label' AS label FROM ${s}.read_messages('t', '0', 0, 2)`,
      );
      expect(rows.map((r) => r.label)).toEqual(['a1', 'a2']);
      await c.query(
        `UPDATE ${s}.subscriptions SET last_transaction_id = $1::xid8, last_position = $2, delivered = 2`,
        [rows[1].transaction_id, rows[1].position],
      );
      // Open across the upgrade: an older transaction appends before the migration, commits after.
      const early = new pg.Client({ connectionString: servers.old.url });
      await early.connect();
      await early.query('BEGIN');
      await append('open', early);
      await append('a5');

      // The migration waits for appends in flight (its index takes a SHARE lock on messages).
      const migrated = (async () => {
        const pool = new pg.Pool({ connectionString: servers.old.url, max: 1 });
        await migrateLegacy(pool, schema).finally(() => pool.end());
        return ordoOn(servers.old.url, schema);
      })();
      await new Promise((r) => setTimeout(r, 300));
      await early.query('COMMIT');
      await early.end();
      const o = await migrated;
      await o.outbox.append('t', labelled('b1'));
      // The first round delivers what committed before it in position order: 'open' was
      // appended before a5 (and committed after it, before b1 was appended).
      const first = await drain(o, 'sub', 2);
      expect(first).toEqual(['a3', 'a4', 'open', 'a5', 'b1']);
      await o.outbox.append('t', labelled('b2'));
      expect(await drain(o, 'sub')).toEqual(['b2']);
      expect(await o.outbox.lag('sub')).toMatchObject({ messagesBehind: 0, delivered: 8 });
    } finally {
      await c.end();
    }
  });
});

describe('the first round in a new cluster while a transaction that appended there is open', () => {
  it('appends are not held up for seconds, callers are told to retry at once, and delivery resumes once it commits', async () => {
    await sql(servers.old.url, 'CREATE DATABASE stall');
    const a = await ordoOn(inDb(servers.old.url, 'stall'));
    await a.outbox.createSubscription({ name: 's', topic: 't' });
    await a.outbox.append('t', labelled('m1', 'm2'));
    await copyDatabase(servers.old, servers.restored, 'stall');
    const b = await ordoOn(inDb(servers.restored.url, 'stall'));

    // Appended in the new cluster before its first round, and left open.
    const open = new pg.Client({ connectionString: inDb(servers.restored.url, 'stall') });
    await open.connect();
    try {
      await open.query('BEGIN');
      await open.query(`SELECT ordo.append('t', 'm', '{"label":"open"}')`);

      // Four callers poll meanwhile: the round cannot begin (the new cluster is recorded once no
      // append is in flight); each is told so quickly.
      const refusals: { code: string; message: string; ms: number }[] = [];
      let polling = true;
      const poller = async () => {
        while (polling) {
          const started = Date.now();
          const got = await b.outbox.receive('s').catch((e: OrdoError) => e);
          expect(got).toBeInstanceOf(OrdoError);
          const { code, message } = got as OrdoError;
          refusals.push({ code, message, ms: Date.now() - started });
        }
      };
      const pollers = Array.from({ length: 4 }, poller);
      const appendMs: number[] = [];
      for (let i = 0; i < 15; i++) {
        const started = Date.now();
        await b.outbox.append('t', labelled(`x${i}`));
        appendMs.push(Date.now() - started);
        await new Promise((r) => setTimeout(r, 50));
      }
      polling = false;
      await Promise.all(pollers);
      expect(Math.max(...appendMs), appendMs.join(' ')).toBeLessThan(1_000);
      expect(refusals.length).toBeGreaterThan(4);
      expect(new Set(refusals.map((r) => r.code))).toEqual(new Set(['timeout']));
      expect(Math.max(...refusals.map((r) => r.ms))).toBeLessThan(1_000);
      // One waits a moment for the appends in flight; the others, meanwhile, not at all.
      expect(refusals.some((r) => r.message.includes('once no append is in flight'))).toBe(true);
      expect(refusals.some((r) => r.message.includes('in another session'))).toBe(true);
      await open.query('COMMIT');
    } finally {
      await open.end();
    }
    expect(await drain(b, 's', 100)).toEqual([
      'm1',
      'm2',
      'open',
      ...Array.from({ length: 15 }, (_, i) => `x${i}`),
    ]);
  });
});
