import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo } from '../src/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';

let db: TestDatabase;
let ordo: Ordo;

beforeAll(async () => {
  db = await freshDatabase();
  ordo = await createOrdo({ databaseUrl: db.url });
});
afterAll(async () => {
  await ordo?.close();
  await db?.drop();
});

describe('gapless sequences', () => {
  it('defines, gets and numbers', async () => {
    const def = await ordo.sequences.define({
      name: 'invoice',
      reset: 'year',
      timeZone: 'Europe/Paris',
      format: 'INV-{YYYY}-{n:6}',
    });
    expect(def).toMatchObject({
      name: 'invoice',
      kind: 'gapless',
      start: 1,
      reset: 'year',
      timeZone: 'Europe/Paris',
    });
    const a = await ordo.sequences.next('invoice', { scope: 'acme', at: '2026-03-01T10:00:00Z' });
    expect(a).toEqual({ value: 1, text: 'INV-2026-000001', period: '2026-01-01', scope: 'acme' });
    expect(await ordo.nextval('invoice', { scope: 'acme', at: '2026-03-01T10:00:00Z' })).toBe(2);
  });
});

describe('definitions and transactions through the public API', () => {
  it('gets, lists and removes definitions; removing drops the counters', async () => {
    await ordo.sequences.define({ name: 'temp', start: 10, increment: 5, maxValue: 1000 });
    expect(await ordo.sequences.get('temp')).toMatchObject({
      start: 10,
      increment: 5,
      minValue: 10,
      maxValue: 1000,
    });
    expect((await ordo.sequences.list()).map((d) => d.name)).toContain('temp');
    expect(await ordo.nextval('temp')).toBe(10);
    expect(await ordo.sequences.remove('temp')).toBe(true);
    expect(await ordo.sequences.get('temp')).toBeNull();
    expect(await ordo.sequences.remove('temp', { ifExists: true })).toBe(false);
    // Defined again, it starts afresh: nothing of the old counters survived.
    await ordo.sequences.define({ name: 'temp', start: 10 });
    expect(await ordo.nextval('temp')).toBe(10);
    expect((await ordo.sequences.status()).filter((s) => s.name === 'temp')).toEqual([
      { name: 'temp', reset: 'never', scope: '', period: null, value: 10 },
    ]);
  });

  it('transaction() commits what fn did, and rolls back (returning the number) when fn throws', async () => {
    await ordo.sequences.define({ name: 'txseq' });
    await expect(
      ordo.transaction(async (tx) => {
        expect((await ordo.sequences.next('txseq', { tx })).value).toBe(1);
        throw new Error('declined');
      }),
    ).rejects.toThrow('declined');
    const kept = await ordo.transaction(async (tx) => ordo.sequences.nextMany('txseq', 3, { tx }));
    expect(kept.map((i) => i.value)).toEqual([1, 2, 3]);
    expect(await ordo.nextval('txseq')).toBe(4);
  });
});

describe('every pooled connection lent to a transaction', () => {
  it('12 transactions on a pool of 6 each take a number of a sequence this client has not looked up yet', async () => {
    await ordo.sequences.define({ name: 'lent' });
    // A fresh client: nothing cached. Its pool's six connections are all lent to transactions,
    // whose next() must not wait for a seventh to look the definition up.
    const fresh = await createOrdo({ databaseUrl: db.url, poolSize: 6, connectTimeout: '3s' });
    try {
      const values = await Promise.all(
        Array.from({ length: 12 }, () => fresh.transaction((tx) => fresh.nextval('lent', { tx }))),
      );
      expect([...values].sort((a, b) => a - b)).toEqual(Array.from({ length: 12 }, (_, i) => i + 1));
    } finally {
      await fresh.close();
    }
  });
});

describe('durability', () => {
  it('a transaction that takes a number commits durably even where synchronous_commit is off', async () => {
    await ordo.sequences.define({ name: 'durable' });
    const setting = await ordo.transaction(async (tx) => {
      await tx.query('SET LOCAL synchronous_commit = off');
      await ordo.sequences.next('durable', { tx });
      return (await tx.query('SHOW synchronous_commit')).rows[0].synchronous_commit;
    });
    // Read at commit: a number acknowledged and then lost in a crash would be handed out again.
    expect(setting).toBe('on');
  });
});

describe('close()', () => {
  it('lets a transaction begun before close() finish with its own tx, then refuses new calls', async () => {
    const other = await createOrdo({ databaseUrl: db.url, poolSize: 2 });
    await other.sequences.define({ name: 'closing_tx', ifNotExists: true });
    let release!: () => void;
    const gate = new Promise<void>((r) => {
      release = r;
    });
    const work = other.transaction(async (tx) => {
      await gate;
      return other.sequences.next('closing_tx', { tx });
    });
    const closing = other.close();
    await expect(other.nextval('closing_tx')).rejects.toMatchObject({ code: 'closed' });
    release();
    expect((await work).value).toBe(1);
    await closing;
    await expect(other.transaction(async () => 1)).rejects.toMatchObject({ code: 'closed' });
  });
});

describe('a sequence redefined as the other kind by another client', () => {
  it('standalone calls refresh the cached definition and go on; a call in a transaction reports it', async () => {
    const other = await createOrdo({ databaseUrl: db.url, poolSize: 2 });
    try {
      await ordo.sequences.define({ name: 'shifting' });
      expect(await ordo.nextval('shifting')).toBe(1); // caches 'gapless'
      await other.sequences.define({ name: 'shifting', kind: 'batched', batch: 10, overwrite: true });
      // Never backwards: the batched sequence continues above the gapless values.
      expect(await ordo.nextval('shifting')).toBeGreaterThanOrEqual(2);

      // A client that listens to nothing yet (it has used no batched sequence) keeps its cache.
      const quiet = await createOrdo({ databaseUrl: db.url, poolSize: 2 });
      try {
        await quiet.sequences.define({ name: 'shifting_tx' });
        await quiet.transaction(async (tx) => quiet.sequences.next('shifting_tx', { tx })); // caches 'gapless'
        await other.sequences.define({ name: 'shifting_tx', kind: 'batched', overwrite: true });
        const error = await quiet
          .transaction(async (tx) => quiet.sequences.next('shifting_tx', { tx }))
          .catch((e: unknown) => e);
        expect(error).toMatchObject({ code: 'invalid_argument' });
        expect((error as Error).message).toContain('is batched, not gapless');
        // The next call knows the new kind.
        expect(typeof (await quiet.nextval('shifting_tx'))).toBe('number');
      } finally {
        await quiet.close();
      }
    } finally {
      await other.close();
    }
  });
});
