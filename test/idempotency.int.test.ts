// Idempotent takes: the same key gets the same numbers, whoever asks again and however many
// ask at once; a rolled-back take frees its key; old keys are forgotten by maintain().
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildServer } from '../src/server/app.js';
import { createOrdo, type Ordo } from '../src/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';

let db: TestDatabase;
let ordo: Ordo;
let other: Ordo;
let sql: pg.Pool;

beforeAll(async () => {
  db = await freshDatabase();
  ordo = await createOrdo({ databaseUrl: db.url });
  other = await createOrdo({ databaseUrl: db.url });
  sql = db.pool(2);
  await ordo.sequences.define({ name: 'inv', format: 'INV-{n:4}' });
});

afterAll(async () => {
  await ordo?.close();
  await other?.close();
  await db?.drop();
});

describe('idempotencyKey', () => {
  it('the same key gets the same values, from any client, in SQL too; a new key gets the next ones', async () => {
    const first = await ordo.sequences.nextMany('inv', 3, { idempotencyKey: 'order-1' });
    expect(first.map((i) => i.text)).toEqual(['INV-0001', 'INV-0002', 'INV-0003']);
    expect(await other.sequences.nextMany('inv', 3, { idempotencyKey: 'order-1' })).toEqual(first);
    const { rows } = await sql.query(
      `SELECT value, text, replayed FROM ordo.take_once('inv', '', now(), 3, 'order-1')`,
    );
    expect(rows).toEqual(first.map((i) => ({ value: String(i.value), text: i.text, replayed: true })));
    expect((await ordo.sequences.next('inv', { idempotencyKey: 'order-2' })).value).toBe(4);
    expect((await ordo.sequences.next('inv')).value).toBe(5);
  });

  it('50 concurrent calls with one key, from two clients: one set of values, the counter moves once', async () => {
    const calls = Array.from({ length: 50 }, (_, i) =>
      (i % 2 ? ordo : other).sequences.nextMany('inv', 2, { idempotencyKey: 'burst' }),
    );
    const answers = await Promise.all(calls);
    for (const a of answers) expect(a).toEqual(answers[0]);
    const taken = answers[0]!.map((i) => i.value);
    expect(taken[1]).toBe(taken[0]! + 1);
    expect((await ordo.sequences.next('inv')).value).toBe(taken[1]! + 1);
  });

  it('in a caller transaction: a rollback gives back the values and frees the key; a commit keeps both', async () => {
    const before = (await ordo.sequences.next('inv')).value;
    await expect(
      ordo.transaction(async (tx) => {
        await ordo.sequences.next('inv', { tx, idempotencyKey: 'rolled' });
        throw new Error('business failure');
      }),
    ).rejects.toThrow('business failure');
    const retried = await ordo.transaction((tx) =>
      ordo.sequences.next('inv', { tx, idempotencyKey: 'rolled' }),
    );
    expect(retried.value).toBe(before + 1);
    expect(await ordo.sequences.next('inv', { idempotencyKey: 'rolled' })).toEqual(retried);
  });

  it('a key used for another call (scope or count) is refused, and nothing is taken', async () => {
    await ordo.sequences.define({ name: 'scoped', format: '{scope}-{n}' });
    await ordo.sequences.next('scoped', { scope: 'acme', idempotencyKey: 'k' });
    await expect(
      ordo.sequences.next('scoped', { scope: 'globex', idempotencyKey: 'k' }),
    ).rejects.toMatchObject({
      code: 'invalid_argument',
      message:
        "The idempotency key 'k' was already used on 'scoped' for 1 value(s) in scope 'acme': use a new key for another call",
    });
    await expect(
      ordo.sequences.nextMany('scoped', 2, { scope: 'acme', idempotencyKey: 'k' }),
    ).rejects.toMatchObject({
      code: 'invalid_argument',
    });
    expect((await ordo.sequences.next('scoped', { scope: 'globex' })).value).toBe(1);
    expect((await ordo.sequences.next('scoped', { scope: 'acme' })).value).toBe(2);
  });

  it('bad keys and batched sequences are refused with invalid_argument', async () => {
    await ordo.sequences.define({ name: 'ids', kind: 'batched' });
    await expect(ordo.sequences.next('ids', { idempotencyKey: 'x' })).rejects.toMatchObject({
      code: 'invalid_argument',
      message: expect.stringContaining('is batched: it takes no idempotency key'),
    });
    await expect(ordo.sequences.next('inv', { idempotencyKey: 'a\uD800' })).rejects.toMatchObject({
      code: 'invalid_argument',
      message: 'idempotencyKey is not well-formed Unicode (a lone surrogate); it would be stored altered',
    });
    for (const key of ['', 'x'.repeat(201), 7, 'a\u0000b']) {
      await expect(ordo.sequences.next('inv', { idempotencyKey: key as string })).rejects.toMatchObject({
        code: 'invalid_argument',
        message: expect.stringContaining('idempotencyKey must be a text of 1 to 200 characters'),
      });
    }
    await expect(ordo.sequences.next('nope', { idempotencyKey: 'x' })).rejects.toMatchObject({
      code: 'sequence_not_found',
    });
  });

  it('lone surrogates in scopes and throttle keys are refused: they would collapse into one counter or key', async () => {
    for (const scope of ['\uD800', 'a\uDC00', '\uDBFF\uDBFF']) {
      await expect(ordo.sequences.next('inv', { scope })).rejects.toMatchObject({
        code: 'invalid_argument',
        message: 'scope is not well-formed Unicode (a lone surrogate); it would be stored altered',
      });
    }
    // A pair is a character like any other.
    expect((await ordo.sequences.next('inv', { scope: '\uD83D\uDE00' })).value).toBe(1);
    await ordo.throttles.define({ name: 'surrogates', concurrency: 5 });
    await expect(ordo.throttles.acquire('surrogates', { key: '\uD800' })).rejects.toMatchObject({
      code: 'invalid_argument',
      message: 'key is not well-formed Unicode (a lone surrogate); it would be stored altered',
    });
  });

  it('over HTTP: the Idempotency-Key header; a retry answers the same values', async () => {
    const app = await buildServer(ordo);
    try {
      const call = (key: string, payload: object = {}) =>
        app.inject({
          method: 'POST',
          url: '/v1/sequences/inv/next',
          headers: { 'idempotency-key': key },
          payload,
        });
      const a = await call('http-1', { count: 2 });
      const b = await call('http-1', { count: 2 });
      expect(a.statusCode).toBe(200);
      expect(b.json()).toEqual(a.json());
      const reused = await call('http-1', { count: 3 });
      expect(reused.statusCode).toBe(400);
      expect(reused.json().code).toBe('invalid_argument');
      const long = await call('k'.repeat(201));
      expect(long.statusCode).toBe(400);
      expect(long.json().message).toMatch(/^headers\.idempotency-key must NOT have more than 200 characters/);
    } finally {
      await app.close();
    }
  });

  it('maintain() forgets keys after a day (the same key then takes new values) and removing a sequence removes its keys', async () => {
    const kept = await ordo.sequences.next('inv', { idempotencyKey: 'old' });
    await sql.query(
      `UPDATE ordo.issued SET issued_at = now() - interval '25 hours' WHERE idempotency_key = 'old'`,
    );
    const done = await ordo.maintain();
    expect(done.find((d) => d.what === 'idempotency keys')!.deleted).toBeGreaterThanOrEqual(1);
    expect((await ordo.sequences.next('inv', { idempotencyKey: 'old' })).value).toBeGreaterThan(kept.value);
    await ordo.sequences.remove('scoped');
    const { rows } = await sql.query(`SELECT count(*)::int AS n FROM ordo.issued WHERE sequence = 'scoped'`);
    expect(rows[0].n).toBe(0);
  });
});
