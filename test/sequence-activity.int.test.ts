// The read side of sequences that the dashboard and the metrics use: counters() (current value
// per scope and period), ranges() (what each node holds of a batched sequence, and how much of
// its own it used), activity() (values taken so far, for rates) and onReservation().
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo, OrdoError } from '../src/index.js';
import { type OrdoDatabase, ordoDatabase } from './support/database.js';

let t: OrdoDatabase;
let ordo: Ordo;
/** Another node on the same database (an Ordo of its own, so another node id). */
let other: Ordo;

beforeAll(async () => {
  t = await ordoDatabase({ poolSize: 4 });
  ordo = t.ordo;
  other = await createOrdo({ databaseUrl: t.db.url, poolSize: 2 });
});
afterAll(async () => {
  await other?.close();
  await t?.close();
});

describe('sequences.counters()', () => {
  it('the current value per scope and period, the most recently used first, within a limit', async () => {
    await ordo.sequences.define({ name: 'c_invoice', reset: 'year', timeZone: 'UTC', start: 10 });
    await ordo.sequences.define({ name: 'c_ticket' });
    await ordo.sequences.nextMany('c_invoice', 3, { scope: 'acme', at: '2025-06-01T00:00:00Z' });
    await ordo.sequences.nextMany('c_invoice', 2, { scope: 'acme', at: '2026-06-01T00:00:00Z' });
    await ordo.sequences.next('c_ticket', { scope: '<b>x</b>' });
    await ordo.sequences.next('c_invoice', { scope: 'globex', at: '2026-06-01T00:00:00Z' });

    const all = await ordo.sequences.counters();
    expect(all.map((c) => [c.sequence, c.scope, c.period, c.value])).toEqual([
      ['c_invoice', 'globex', '2026-01-01', 10],
      ['c_ticket', '<b>x</b>', null, 1],
      ['c_invoice', 'acme', '2026-01-01', 11],
      ['c_invoice', 'acme', '2025-01-01', 12],
    ]);
    for (const c of all) expect(c.updatedAt).toBeInstanceOf(Date);
    // Most recently used first: each counter was last used no later than the one before it.
    for (let i = 1; i < all.length; i++)
      expect(all[i]!.updatedAt.getTime()).toBeLessThanOrEqual(all[i - 1]!.updatedAt.getTime());

    const invoices = await ordo.sequences.counters({ name: 'c_invoice', limit: 2 });
    expect(invoices.map((c) => [c.scope, c.period, c.value])).toEqual([
      ['globex', '2026-01-01', 10],
      ['acme', '2026-01-01', 11],
    ]);
    expect(await ordo.sequences.counters({ name: 'c_nothing' })).toEqual([]);
  });

  it('a value taken in a transaction still open is not read, and nothing waits for it', async () => {
    await ordo.sequences.define({ name: 'c_open' });
    await ordo.sequences.next('c_open');
    const client = new pg.Client({ connectionString: t.db.url });
    await client.connect();
    try {
      await client.query('BEGIN');
      await ordo.sequences.next('c_open', { tx: client });
      const read = await ordo.sequences.counters({ name: 'c_open' });
      expect(read.map((c) => c.value)).toEqual([1]);
      await client.query('COMMIT');
      expect((await ordo.sequences.counters({ name: 'c_open' })).map((c) => c.value)).toEqual([2]);
    } finally {
      await client.end();
    }
  });

  it('refuses bad options with invalid_argument', async () => {
    for (const options of [{ limit: 0 }, { limit: 1.5 }, { name: 'bad name' }, { other: 1 }]) {
      const error = await ordo.sequences.counters(options as never).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(OrdoError);
      expect((error as OrdoError).code).toBe('invalid_argument');
    }
  });
});

describe('sequences.ranges()', () => {
  it("each node's ranges of the current definition, and how much this node used of its own", async () => {
    await ordo.sequences.define({ name: 'r_ids', kind: 'batched', batch: 10, start: 100 });
    // This node takes 3 values of its first range; the other node takes 1 of the next one.
    await ordo.sequences.nextMany('r_ids', 3);
    await other.sequences.next('r_ids');

    const ranges = await ordo.sequences.ranges('r_ids');
    const mine = ranges.filter((r) => r.nodeId === ordo.nodeId);
    const theirs = ranges.filter((r) => r.nodeId === other.nodeId);
    expect(mine.length).toBeGreaterThanOrEqual(1);
    expect(theirs.length).toBeGreaterThanOrEqual(1);
    for (const r of ranges) {
      expect(r.sequence).toBe('r_ids');
      expect(r.size).toBe(10);
      expect(r.last - r.first).toBe(9);
      expect(r.reservedAt).toBeInstanceOf(Date);
    }
    // The range in use: the first, 3 of its 10 values used. A prefetched one (if any): none used.
    expect(mine[0]).toMatchObject({ first: 100, last: 109, used: 3 });
    for (const spare of mine.slice(1)) expect(spare.used).toBe(0);
    // Another node keeps its count in its own memory: unknown here, known there.
    for (const r of theirs) expect(r.used).toBeNull();
    const seenThere = await other.sequences.ranges('r_ids');
    expect(seenThere.find((r) => r.nodeId === other.nodeId && r.used !== null)?.used).toBe(1);
    // Ranges of this node never overlap those of the other.
    for (const a of mine) for (const b of theirs) expect(a.last < b.first || b.last < a.first).toBe(true);

    // Using up the first range: it reads as used up (the node moved on), the next one as in use.
    await ordo.sequences.nextMany('r_ids', 7 + 4);
    const later = (await ordo.sequences.ranges('r_ids')).filter((r) => r.nodeId === ordo.nodeId);
    const inUse = later.find((r) => r.used !== null && r.used > 0 && r.used < r.size);
    expect(inUse?.used).toBe(4);
    expect(later.length).toBeLessThanOrEqual(2);

    // Every sequence without a name; a redefinition (new epoch) drops the old ranges.
    expect((await ordo.sequences.ranges()).some((r) => r.sequence === 'r_ids')).toBe(true);
    await ordo.sequences.define({ name: 'r_ids', kind: 'batched', batch: 5, overwrite: true });
    expect(await ordo.sequences.ranges('r_ids')).toEqual([]);
  });

  it('a gapless sequence holds no ranges; a bad name is invalid_argument', async () => {
    await ordo.sequences.define({ name: 'r_gapless' });
    await ordo.sequences.next('r_gapless');
    expect(await ordo.sequences.ranges('r_gapless')).toEqual([]);
    await expect(ordo.sequences.ranges('bad name')).rejects.toMatchObject({ code: 'invalid_argument' });
  });
});

describe('sequences.activity()', () => {
  it('values taken so far: gapless in every scope and period, batched as reserved by every node', async () => {
    await ordo.sequences.define({ name: 'a_gapless', start: 5, increment: 5 });
    await ordo.sequences.define({ name: 'a_batched', kind: 'batched', batch: 50, start: 1000 });
    await ordo.sequences.define({ name: 'a_unused' });
    const taken = async () => new Map((await ordo.sequences.activity()).map((a) => [a.name, a]));

    const before = await taken();
    expect(before.get('a_gapless')).toMatchObject({ kind: 'gapless', taken: 0 });
    expect(before.get('a_batched')).toMatchObject({ kind: 'batched', taken: 0 });
    expect(before.get('a_unused')!.taken).toBe(0);

    await ordo.sequences.nextMany('a_gapless', 3, { scope: 'a' });
    await ordo.sequences.nextMany('a_gapless', 2, { scope: 'b' });
    await ordo.sequences.next('a_batched');
    const after = await taken();
    expect(after.get('a_gapless')!.taken).toBe(5);
    // A batched node reserves a range (and may prefetch the next): whole batches.
    const reserved = after.get('a_batched')!.taken;
    expect(reserved % 50).toBe(0);
    expect(reserved).toBeGreaterThanOrEqual(50);
    expect(reserved).toBeLessThanOrEqual(100);
    expect(after.get('a_gapless')!.at.getTime()).toBeGreaterThanOrEqual(
      before.get('a_gapless')!.at.getTime(),
    );

    // A rolled-back value is not counted.
    const client = new pg.Client({ connectionString: t.db.url });
    await client.connect();
    try {
      await client.query('BEGIN');
      await ordo.sequences.next('a_gapless', { scope: 'a', tx: client });
      await client.query('ROLLBACK');
    } finally {
      await client.end();
    }
    expect((await taken()).get('a_gapless')!.taken).toBe(5);
  });
});

describe('sequences.onReservation()', () => {
  it('hears each reservation this node makes, with its duration, until unsubscribed; reservations counts the ranges', async () => {
    await ordo.sequences.define({ name: 'o_ids', kind: 'batched', batch: 5 });
    const heard: [string, number][] = [];
    const stop = ordo.sequences.onReservation((sequence, ms) => heard.push([sequence, ms]));
    const before = ordo.sequences.reservations.get('o_ids') ?? 0;
    await ordo.sequences.nextMany('o_ids', 12);
    await ordo.sequences.idle();
    const made = (ordo.sequences.reservations.get('o_ids') ?? 0) - before;
    expect(made).toBeGreaterThanOrEqual(3);
    const mine = heard.filter(([s]) => s === 'o_ids');
    // One statement may reserve several ranges (a node that waited asks for more).
    expect(mine.length).toBeGreaterThanOrEqual(1);
    expect(mine.length).toBeLessThanOrEqual(made);
    // The ranges of one statement share its reserved_at.
    const { rows } = await t.sql.query(
      `SELECT count(DISTINCT reserved_at)::int AS statements, count(*)::int AS ranges FROM ${t.S}.sequence_batches WHERE sequence = $1`,
      ['o_ids'],
    );
    expect(rows[0]).toEqual({ statements: mine.length, ranges: made });
    for (const [, ms] of mine) expect(ms).toBeGreaterThanOrEqual(0);

    stop();
    const count = heard.length;
    await ordo.sequences.nextMany('o_ids', 20);
    expect(heard.length).toBe(count);
  });
});
