// The outbox, tried hard (issue #5): idempotent append, validation, the poll query's plan,
// lag naming the transaction that blocks, dead letters, the handler's transaction, prune,
// leases, from 'now', LISTEN/NOTIFY wake-up. Real PostgreSQL of this file's own, no mocks.
import { setTimeout as sleep } from 'node:timers/promises';
import fc from 'fast-check';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  createOrdo,
  type MessageInput,
  type Ordo,
  OrdoError,
  type OutboxMessage,
  type Subscription,
} from '../src/index.js';
import { arrayElements } from '../src/db/arrays.js';
import { type OwnPostgres, ownPostgres } from './support/own-postgres.js';

let server: OwnPostgres;
let admin: pg.Pool;
/** Every Ordo a test made, closed in afterAll should the test have failed before its finally. */
const made = new Set<Ordo>();
let schemas = 0;

beforeAll(async () => {
  // pg_snapshot_xmin is cluster-wide: this file has a server of its own.
  // Two-phase transactions are allowed, so that a prepared one can be shown holding a consumer back.
  server = await ownPostgres({ max_prepared_transactions: '4' });
  admin = new pg.Pool({ connectionString: server.url, max: 6, application_name: 'ordo-test-admin' });
  admin.on('error', () => undefined);
  // Autovacuum takes transaction ids and commits in whatever database it visits; the plan and
  // idle-loop tests must see only their own. This server belongs to this file alone.
  await admin.query('ALTER SYSTEM SET autovacuum = off');
  await admin.query('SELECT pg_reload_conf()');
});

afterAll(async () => {
  await Promise.all([...made].map((o) => close(o).catch(() => undefined)));
  await admin?.end();
  await server?.stop();
});

/** An Ordo on a schema of its own (or a given one), so no test sees another's rows. */
async function fresh(
  options: { schema?: string; poolSize?: number; databaseUrl?: string } = {},
): Promise<{ o: Ordo; s: string }> {
  const s = options.schema ?? `t${++schemas}`;
  const o = await createOrdo({
    databaseUrl: options.databaseUrl ?? server.url,
    schema: s,
    poolSize: options.poolSize ?? 4,
  });
  made.add(o);
  return { o, s };
}

/** Closes `o`, or fails the test (instead of hanging it) when close() does not finish. */
async function close(o: Ordo): Promise<void> {
  made.delete(o);
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    o.close(),
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error('close() did not finish within 10 s')), 10_000);
    }),
  ]).finally(() => clearTimeout(timer));
}

async function client(applicationName = 'ordo-test', url = server.url): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: url, application_name: applicationName });
  await c.connect();
  return c;
}

/** Waits until `check` returns true; `check` may throw to fail at once. */
async function waitFor(what: string, check: () => Promise<boolean> | boolean, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(10);
  }
}

async function count(s: string, where = 'true', values: unknown[] = []): Promise<number> {
  const { rows } = await admin.query(`SELECT count(*)::int AS n FROM ${s}.messages WHERE ${where}`, values);
  return rows[0].n;
}

/** The error a call ends with, whether it threw at once or rejected; fails if it succeeded. */
async function failure(call: () => unknown): Promise<OrdoError> {
  try {
    await call();
  } catch (e) {
    expect(e).toBeInstanceOf(OrdoError);
    return e as OrdoError;
  }
  throw new Error('the call succeeded');
}

const msgs = (labels: string[], extra: Record<string, unknown> = {}) =>
  labels.map((label) => ({ type: 'm', data: { label }, ...extra }));

describe('append and messageId', () => {
  it('a repeated messageId is stored once: the same call again, repeats within one call; other topics apart', async () => {
    const { o, s } = await fresh();
    try {
      const [first] = await o.outbox.append('orders', {
        type: 'OrderPlaced',
        data: { id: 1, lines: [1, 2] },
        key: '1',
        messageId: 'o-1',
        headers: { trace: 'abc' },
      });
      expect(first).toMatchObject({ messageId: 'o-1', duplicate: false });
      expect(first!.position).toBeGreaterThan(0);
      expect(first!.transactionId).toMatch(/^\d+$/);
      expect(
        await o.outbox.append('orders', { type: 'OrderPlaced', data: { id: 1 }, messageId: 'o-1' }),
      ).toEqual([{ messageId: 'o-1', position: null, transactionId: null, duplicate: true }]);

      const many = await o.outbox.append('orders', [
        { type: 'a', data: 1, messageId: 'o-2' },
        { type: 'b', data: 2, messageId: 'o-2' },
        { type: 'c', data: 3 },
        { type: 'd', data: 4, messageId: 'o-1' },
        { type: 'e', data: 5, messageId: 'o-3' },
        { type: 'f', data: 6, messageId: null },
      ]);
      expect(many.map((a) => a.duplicate)).toEqual([false, true, false, true, false, false]);
      const stored = many.filter((a) => !a.duplicate);
      // One statement, one transaction; positions follow the order given.
      expect(new Set(stored.map((a) => a.transactionId)).size).toBe(1);
      const positions = stored.map((a) => a.position!);
      expect(positions).toEqual([...positions].sort((a, b) => a - b));
      // The first of the repeats is the one kept.
      const { rows } = await admin.query(
        `SELECT type, key, message_id, data, headers FROM ${s}.messages WHERE topic = 'orders' ORDER BY position`,
      );
      expect(rows).toEqual([
        {
          type: 'OrderPlaced',
          key: '1',
          message_id: 'o-1',
          data: { id: 1, lines: [1, 2] },
          headers: { trace: 'abc' },
        },
        { type: 'a', key: null, message_id: 'o-2', data: 1, headers: {} },
        { type: 'c', key: null, message_id: null, data: 3, headers: {} },
        { type: 'e', key: null, message_id: 'o-3', data: 5, headers: {} },
        { type: 'f', key: null, message_id: null, data: 6, headers: {} },
      ]);
      // The same id on another topic is another message.
      expect((await o.outbox.append('refunds', { type: 'r', data: 1, messageId: 'o-1' }))[0]!.duplicate).toBe(
        false,
      );
      // The SQL entry point for triggers and other languages: null for a repeat.
      const sql = await admin.query(
        `SELECT ${s}.append('orders', 't', '{}', NULL, 'o-1') AS again, ${s}.append('orders', 't', '{}', NULL, 'o-4') AS fresh`,
      );
      expect(sql.rows[0].again).toBeNull();
      expect(Number(sql.rows[0].fresh)).toBeGreaterThan(Math.max(...positions));
      expect(await count(s, `topic = 'orders'`)).toBe(6);
    } finally {
      await close(o);
    }
  });

  it("append_answer() answers with the transaction's id, then each message's position, or null when its id was stored before (fast-check)", async () => {
    const { o, s } = await fresh();
    let run = 0;
    try {
      const message = fc.option(fc.constantFrom('a', 'b', 'c', 'd'), { nil: null });
      const calls = fc.array(fc.array(message, { minLength: 1, maxLength: 8 }), {
        minLength: 1,
        maxLength: 5,
      });
      await fc.assert(
        fc.asyncProperty(calls, async (batches) => {
          const topic = `positions.${++run}`;
          const stored = new Set<string>();
          let last = 0;
          for (const ids of batches) {
            const n = ids.length;
            const { rows } = await admin.query(
              `SELECT ${s}.append_answer($1, array_fill('t'::text, ARRAY[$2::int]), array_fill('1'::jsonb, ARRAY[$2::int]),
                 array_fill(NULL::text, ARRAY[$2::int]), $3::text[], array_fill(NULL::jsonb, ARRAY[$2::int]))::text AS p`,
              [topic, n, ids],
            );
            const [transactionId, ...answer] = arrayElements(rows[0].p);
            const positions = answer.map((p) => (p === null ? null : Number(p)));
            // The model: a message without an id is stored; one with an id, when that id is not yet.
            const expected = ids.map((id) => {
              if (id === null) return true;
              if (stored.has(id)) return false;
              stored.add(id);
              return true;
            });
            expect(positions.map((p) => p !== null)).toEqual(expected);
            const kept = positions.filter((p): p is number => p !== null);
            expect(kept).toEqual([...kept].sort((a, b) => a - b));
            expect(kept[0] ?? last + 1).toBeGreaterThan(last);
            last = kept.at(-1) ?? last;
            const { rows: written } = await admin.query(
              `SELECT position, message_id, transaction_id::text FROM ${s}.messages
                WHERE topic = $1 AND position = ANY($2::bigint[]) ORDER BY position`,
              [topic, kept],
            );
            expect(written).toEqual(
              positions.flatMap((p, i) =>
                p === null
                  ? []
                  : [{ position: String(p), message_id: ids[i], transaction_id: transactionId }],
              ),
            );
          }
          // append_many() answers with the same, read off append_answer() once.
          const before = await count(s, `topic = '${topic}'`);
          const { rows } = await admin.query(
            `SELECT message_id, position, transaction_id::text FROM ${s}.append_many($1, ARRAY['t', 't', 't'],
               ARRAY['1', '1', '1']::jsonb[], ARRAY[NULL, NULL, NULL]::text[], ARRAY['e', NULL, 'e'],
               ARRAY[NULL, NULL, NULL]::jsonb[])`,
            [topic],
          );
          expect(rows.map((r) => r.message_id)).toEqual(['e', null]);
          expect(Number(rows[0].position)).toBeLessThan(Number(rows[1].position));
          expect(await count(s, `topic = '${topic}'`)).toBe(before + 2);
          const { rows: ids } = await admin.query(
            `SELECT DISTINCT transaction_id::text FROM ${s}.messages WHERE topic = $1 AND position = ANY($2::bigint[])`,
            [topic, rows.map((r) => r.position)],
          );
          expect(ids).toEqual([{ transaction_id: rows[0].transaction_id }]);
          expect(rows[1].transaction_id).toBe(rows[0].transaction_id);
        }),
        { numRuns: 40 },
      );
    } finally {
      await close(o);
    }
  });

  it('two transactions appending the same messageId at once: one stored; after a rollback the other stores it', async () => {
    const { o, s } = await fresh();
    const [c1, c2] = [await client(), await client()];
    try {
      const pid2 = (await c2.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
      for (const end of ['COMMIT', 'ROLLBACK'] as const) {
        const id = `race-${end}`;
        await c1.query('BEGIN');
        await c2.query('BEGIN');
        const [a] = await o.outbox.append('orders', { type: 't', data: 1, messageId: id }, { tx: c1 });
        expect(a!.duplicate).toBe(false);
        const pending = o.outbox.append('orders', { type: 't', data: 2, messageId: id }, { tx: c2 });
        // The unique index makes the second wait for the first transaction to end.
        await waitFor('the second append to wait for the first transaction', async () => {
          const { rows } = await admin.query('SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1', [
            pid2,
          ]);
          return rows[0]?.wait_event_type === 'Lock';
        });
        await c1.query(end);
        const [b] = await pending;
        await c2.query('COMMIT');
        expect(b!.duplicate).toBe(end === 'COMMIT');
        const { rows } = await admin.query(`SELECT data FROM ${s}.messages WHERE message_id = $1`, [id]);
        expect(rows).toEqual([{ data: end === 'COMMIT' ? 1 : 2 }]);
      }
    } finally {
      await c1.end();
      await c2.end();
      await close(o);
    }
  });
});

describe('validation: invalid_argument, and nothing written', () => {
  it('every bad append is refused with invalid_argument and stores nothing', async () => {
    const { o, s } = await fresh();
    const circular: Record<string, unknown> = {};
    circular.self = circular;
    const ok = { type: 't', data: 1 };
    const bad: [string, string | unknown, unknown, unknown?][] = [
      ['empty topic', '', ok],
      ['topic starting with .', '.x', ok],
      ['topic starting with -', '-x', ok],
      ['topic with a space', 'a b', ok],
      ['topic with a letter outside ASCII', 'é', ok],
      ['topic of 201 characters', 'x'.repeat(201), ok],
      ['topic not a string', 42, ok],
      ['topic null', null, ok],
      ['empty list', 't', []],
      ['10001 messages', 't', Array.from({ length: 10_001 }, () => ok)],
      ['message null', 't', null],
      ['message a string', 't', 'hello'],
      ['a null in the list', 't', [ok, null]],
      ['missing type', 't', { data: 1 }],
      ['empty type', 't', { type: '', data: 1 }],
      ['type of 201 characters', 't', { type: 'x'.repeat(201), data: 1 }],
      ['type not a string', 't', { type: 5, data: 1 }],
      ['data missing', 't', { type: 't' }],
      ['data undefined', 't', { type: 't', data: undefined }],
      ['data a function', 't', { type: 't', data: () => 1 }],
      ['data a bigint', 't', { type: 't', data: 1n }],
      ['data circular', 't', { type: 't', data: circular }],
      ['unknown key', 't', { type: 't', data: 1, extra: true }],
      ['misspelt key', 't', { type: 't', data: 1, message_id: 'x' }],
      ['headers an array', 't', { type: 't', data: 1, headers: [] }],
      ['headers a string', 't', { type: 't', data: 1, headers: 'x' }],
      ['headers null', 't', { type: 't', data: 1, headers: null }],
      ['headers with a bigint', 't', { type: 't', data: 1, headers: { n: 1n } }],
      ['headers that serialise to a string', 't', { type: 't', data: 1, headers: new Date() }],
      ['key of 201 characters', 't', { type: 't', data: 1, key: 'k'.repeat(201) }],
      ['key a number', 't', { type: 't', data: 1, key: 5 }],
      ['empty messageId', 't', { type: 't', data: 1, messageId: '' }],
      ['messageId of 201 characters', 't', { type: 't', data: 1, messageId: 'm'.repeat(201) }],
      ['messageId a number', 't', { type: 't', data: 1, messageId: 5 }],
      ['the last of several bad', 't', [ok, ok, { type: '', data: 1 }]],
      // Refused by PostgreSQL: the whole statement fails, so the good ones go too.
      ['NUL in type', 't', [ok, { type: 'a\u0000b', data: 1 }]],
      ['NUL in data', 't', [ok, { type: 't', data: 'a\u0000b' }]],
      ['NUL in key', 't', [ok, { type: 't', data: 1, key: 'a\u0000' }]],
      ['options unknown key', 't', ok, { foo: 1 }],
      ['options null', 't', ok, null],
      ['tx without query()', 't', ok, { tx: {} }],
    ];
    try {
      const wrong: string[] = [];
      for (const [what, topic, messages, options] of bad) {
        const e = await failure(() =>
          (o.outbox.append as (...a: unknown[]) => unknown)(
            topic,
            messages,
            ...(options === undefined ? [] : [options]),
          ),
        ).catch((x: Error) => x);
        if (!(e instanceof OrdoError) || e.code !== 'invalid_argument') wrong.push(`${what}: ${String(e)}`);
      }
      expect(wrong).toEqual([]);
      expect(await count(s)).toBe(0);
      // The limits themselves are accepted.
      await o.outbox.append('x'.repeat(200), {
        type: 'y'.repeat(200),
        data: null,
        key: 'k'.repeat(200),
        messageId: 'm'.repeat(200),
      });
      expect(
        await o.outbox.append(
          't',
          Array.from({ length: 10_000 }, () => ok),
        ),
      ).toHaveLength(10_000);
      expect(await count(s)).toBe(10_001);
    } finally {
      await close(o);
    }
  });

  it('append_many from SQL refuses a bad message with OX003 naming it and what to change, and writes nothing', async () => {
    const { o, s } = await fresh();
    const append = (types: unknown[], keys: unknown[], ids: unknown[], headers: unknown[]) =>
      admin
        .query(
          `SELECT count(*) FROM ${s}.append_many('sql', $1::text[], $2::jsonb[], $3::text[], $4::text[], $5::jsonb[])`,
          [
            types,
            types.map(() => '1'),
            keys,
            ids,
            headers.map((h) => (h === null ? null : JSON.stringify(h))),
          ],
        )
        .then(
          (r) => `appended ${r.rows[0].count}`,
          (e: { code?: string; message: string }) => `${e.code}: ${e.message}`,
        );
    try {
      const two = (bad: Partial<Record<'type' | 'key' | 'id' | 'headers', unknown>>) =>
        append(
          ['t', bad.type ?? 't'],
          [null, bad.key ?? null],
          [null, bad.id ?? null],
          [null, bad.headers ?? null],
        );
      expect(await two({ type: '' })).toBe('OX003: message 2: type must be 1 to 200 characters');
      expect(await two({ type: 'x'.repeat(201) })).toBe('OX003: message 2: type must be 1 to 200 characters');
      expect(await two({ key: 'k'.repeat(201) })).toBe(
        'OX003: message 2: key must be at most 200 characters',
      );
      expect(await two({ id: '' })).toBe('OX003: message 2: message id must be 1 to 200 characters');
      expect(await two({ id: 'm'.repeat(201) })).toBe(
        'OX003: message 2: message id must be 1 to 200 characters',
      );
      expect(await two({ headers: [] })).toBe('OX003: message 2: headers must be a JSON object, not array');
      expect(await two({ headers: 'x' })).toBe('OX003: message 2: headers must be a JSON object, not string');
      expect(await append([null], [null], [null], [null])).toBe(
        'OX003: message 1: type must be 1 to 200 characters',
      );
      expect(await append(['t', 't'], [null], [null, null], [null, null])).toBe(
        'OX003: An append needs its arrays (types, data, keys, message ids, headers) of one length',
      );
      expect(await count(s)).toBe(0);
      // The limits themselves, with and without a message id; absent headers are {}.
      expect(await two({ type: 'y'.repeat(200), key: 'k'.repeat(200), headers: { a: 'b' } })).toBe(
        'appended 2',
      );
      expect(await two({ id: 'm'.repeat(200) })).toBe('appended 2');
      const { rows } = await admin.query(`SELECT DISTINCT headers FROM ${s}.messages ORDER BY 1`);
      expect(rows.map((r) => r.headers)).toEqual([{}, { a: 'b' }]);
    } finally {
      await close(o);
    }
  });

  it('append reports bad input as a rejected promise, like every other call, not by throwing at once', async () => {
    const { o } = await fresh();
    try {
      const outcome = (call: () => Promise<unknown>) => {
        try {
          const p = call();
          p.catch(() => undefined);
          return p;
        } catch (e) {
          return `threw synchronously: ${String(e)}`;
        }
      };
      // `promise.catch(...)` and Promise.all([...]) rely on this; subscribe, lag, prune… do it.
      expect(outcome(() => o.outbox.append('bad topic', { type: 't', data: 1 }))).toBeInstanceOf(Promise);
      expect(outcome(() => o.outbox.append('t', []))).toBeInstanceOf(Promise);
      expect(
        outcome(() => o.outbox.subscribe({ name: 'bad name', topic: 't', handler: () => undefined })),
      ).toBeInstanceOf(Promise);
    } finally {
      await close(o);
    }
  });

  it('text that is not well-formed Unicode (a lone surrogate) is refused with invalid_argument, never stored altered', async () => {
    const { o, s } = await fresh();
    try {
      const cases: [string, Record<string, unknown>][] = [
        ['data', { type: 't', data: 'a\ud800b' }],
        ['headers', { type: 't', data: 1, headers: { trace: 'x\udc00' } }],
        ['type', { type: 't\ud800', data: 1 }],
        ['key', { type: 't', data: 1, key: 'k\ud800' }],
        ['messageId', { type: 't', data: 1, messageId: 'm\ud800' }],
      ];
      const outcomes: Record<string, string> = {};
      for (const [what, message] of cases) {
        const before = await count(s);
        let outcome: string;
        try {
          const [a] = await o.outbox.append('t', message as never);
          outcome = `accepted (duplicate: ${a!.duplicate})`;
        } catch (e) {
          outcome = (e as OrdoError).code;
        }
        const stored = await count(s);
        outcomes[what] = `${outcome}, ${stored - before} stored`;
      }
      expect(outcomes).toEqual(
        Object.fromEntries(cases.map(([what]) => [what, 'invalid_argument, 0 stored'])),
      );
    } finally {
      await close(o);
    }
  });

  it('bad subscribe options (and other calls\u2019 options) are refused with invalid_argument and create nothing', async () => {
    const { o, s } = await fresh();
    const handler = () => undefined;
    const base = { name: 'n', topic: 't', handler };
    const badSubscribe: [string, unknown][] = [
      ['null', null],
      ['a string', 'n'],
      ['no name', { topic: 't', handler }],
      ['bad name', { ...base, name: 'a b' }],
      ['name of 201 characters', { ...base, name: 'n'.repeat(201) }],
      ['no topic', { name: 'n', handler }],
      ['bad topic', { ...base, topic: '.t' }],
      ['no handler', { name: 'n', topic: 't' }],
      ['handler not a function', { ...base, handler: 'h' }],
      ['batchSize 0', { ...base, batchSize: 0 }],
      ['batchSize 10001', { ...base, batchSize: 10_001 }],
      ['batchSize 1.5', { ...base, batchSize: 1.5 }],
      ['batchSize a string', { ...base, batchSize: '10' }],
      ['from end', { ...base, from: 'end' }],
      ['maxAttempts 0', { ...base, maxAttempts: 0 }],
      ['onExhausted drop', { ...base, onExhausted: 'drop' }],
      ['lease below 300ms', { ...base, lease: '100ms' }],
      ['lease nonsense', { ...base, lease: 'soon' }],
      ['lease negative', { ...base, lease: -1 }],
      ['pollInterval 0', { ...base, pollInterval: 0 }],
      ['pollInterval 0s', { ...base, pollInterval: '0s' }],
      ['retryDelay 0', { ...base, retryDelay: 0 }],
      ['maxRetryDelay below retryDelay', { ...base, retryDelay: '100ms', maxRetryDelay: '50ms' }],
      ['onError not a function', { ...base, onError: 'log' }],
      ['unknown option', { ...base, batch_size: 10 }],
    ];
    try {
      const wrong: string[] = [];
      const expectInvalid = async (what: string, call: () => unknown) => {
        const e = await failure(call).catch((x: Error) => x);
        if (!(e instanceof OrdoError) || e.code !== 'invalid_argument') wrong.push(`${what}: ${String(e)}`);
      };
      for (const [what, options] of badSubscribe) {
        await expectInvalid(`subscribe ${what}`, () => o.outbox.subscribe(options as never));
      }
      await expectInvalid('lag bad name', () => o.outbox.lag('a b'));
      await expectInvalid('deadLetters limit 0', () => o.outbox.deadLetters('n', { limit: 0 }));
      await expectInvalid('deadLetters unknown option', () => o.outbox.deadLetters('n', { max: 1 } as never));
      await expectInvalid('removeSubscription unknown option', () =>
        o.outbox.removeSubscription('n', { force: true } as never),
      );
      await expectInvalid('prune without olderThan', () => o.outbox.prune({} as never));
      await expectInvalid('prune olderThan nonsense', () => o.outbox.prune({ olderThan: 'old' }));
      await expectInvalid('prune olderThan negative', () => o.outbox.prune({ olderThan: -1 }));
      await expectInvalid('prune bad topic', () => o.outbox.prune({ olderThan: '1d', topic: 'a b' }));
      await expectInvalid('prune unknown option', () =>
        o.outbox.prune({ olderThan: '1d', all: true } as never),
      );
      expect(wrong).toEqual([]);
      const { rows } = await admin.query(`SELECT count(*)::int AS n FROM ${s}.subscriptions`);
      expect(rows[0].n).toBe(0);
    } finally {
      await close(o);
    }
  });

  it('a name bound to another topic: subscription_conflict; unknown names: subscription_not_found', async () => {
    const { o } = await fresh();
    try {
      const sub = await o.outbox.subscribe({ name: 'billing', topic: 'orders', handler: () => undefined });
      await sub.stop();
      expect(
        await failure(() =>
          o.outbox.subscribe({ name: 'billing', topic: 'refunds', handler: () => undefined }),
        ),
      ).toMatchObject({ code: 'subscription_conflict' });
      expect((await o.outbox.lag('billing')).topic).toBe('orders');
      expect(await failure(() => o.outbox.lag('ghost'))).toMatchObject({ code: 'subscription_not_found' });
      expect(await failure(() => o.outbox.removeSubscription('ghost'))).toMatchObject({
        code: 'subscription_not_found',
      });
      expect(await o.outbox.removeSubscription('ghost', { ifExists: true })).toBe(false);
      expect(await o.outbox.removeSubscription('billing')).toBe(true);
      expect(await failure(() => o.outbox.lag('billing'))).toMatchObject({ code: 'subscription_not_found' });
      expect(await o.outbox.subscriptions()).toEqual([]);
    } finally {
      await close(o);
    }
  });

  it('after close(), every outbox call is refused with closed', async () => {
    const { o } = await fresh();
    const sub = await o.outbox.subscribe({ name: 'n', topic: 't', handler: () => undefined });
    await close(o);
    expect(await sub.done).toEqual({ reason: 'stopped' });
    const calls: [string, () => unknown][] = [
      ['append', () => o.outbox.append('t', { type: 't', data: 1 })],
      ['subscribe', () => o.outbox.subscribe({ name: 'n', topic: 't', handler: () => undefined })],
      ['lag', () => o.outbox.lag('n')],
      ['sub.lag', () => sub.lag()],
      ['subscriptions', () => o.outbox.subscriptions()],
      ['deadLetters', () => o.outbox.deadLetters('n')],
      ['removeSubscription', () => o.outbox.removeSubscription('n')],
      ['prune', () => o.outbox.prune({ olderThan: '1d' })],
    ];
    const codes: Record<string, string> = {};
    for (const [what, call] of calls) codes[what] = (await failure(call)).code;
    expect(codes).toEqual(Object.fromEntries(calls.map(([what]) => [what, 'closed'])));
  });
});

describe("receive's plan: index scans that stop after the batch, never a sort of the backlog", () => {
  let o: Ordo;
  let s: string;
  const TOPICS = ['alpha', 'beta', 'gamma', 'delta', 'epsilon'];

  beforeAll(async () => {
    ({ o, s } = await fresh({ schema: 'plans' }));
    // 50,000 messages over five topics, from 50 transactions of 1,000, topics interleaved.
    for (let i = 0; i < 50; i++) {
      await o.outbox.append(
        TOPICS[i % TOPICS.length]!,
        Array.from({ length: 1000 }, (_, j) => ({ type: 'm', data: { i, j }, key: String(j % 7) })),
      );
    }
    await admin.query(`ANALYZE ${s}.messages`);
  });
  afterAll(async () => {
    await close(o);
  });

  interface PlanNode {
    'Node Type': string;
    'Index Name'?: string;
    'Relation Name'?: string;
    'Actual Rows'?: number;
    'Actual Loops'?: number;
    Plans?: PlanNode[];
  }
  const nodes = (n: PlanNode): PlanNode[] => [n, ...(n.Plans ?? []).flatMap(nodes)];

  /**
   * The plan of the statement inside receive() that picks the batch, as a consumer runs it:
   * auto_explain reports nested statements as NOTICEs. Returns the indexes its scans use and
   * the most rows any scan read.
   */
  async function explainReceive(
    sub: string,
    max: number,
  ): Promise<{ indexes: string[]; scanned: number; sorts: string[] }> {
    await admin.query(`SELECT * FROM ${s}.lease_partition($1, 0, 'explainer', 60000)`, [sub]);
    const c = await client();
    const notices: string[] = [];
    c.on('notice', (n) => notices.push(n.message ?? ''));
    try {
      await c.query(`LOAD 'auto_explain'`);
      for (const setting of [
        'auto_explain.log_min_duration = 0',
        'auto_explain.log_nested_statements = on',
        'auto_explain.log_level = notice',
        'auto_explain.log_format = json',
        'auto_explain.log_analyze = on',
      ]) {
        await c.query(`SET ${setting}`);
      }
      await c.query(`SELECT * FROM ${s}.receive($1, 0, 'explainer', $2, 60000)`, [sub, max]);
    } finally {
      await c.end();
    }
    const plans = notices
      .map((n) => JSON.parse(n.slice(n.indexOf('{'))) as { 'Query Text': string; Plan: PlanNode })
      .filter((p) => p['Query Text'].includes('WITH candidates AS'));
    expect(plans).toHaveLength(1);
    const all = nodes(plans[0]!.Plan);
    // The messages read; the statement also moves the partition's own row.
    const scans = all.filter(
      (n) => /Scan/.test(n['Node Type']) && n['Index Name'] && n['Relation Name'] === 'messages',
    );
    return {
      indexes: [...new Set(scans.map((n) => n['Index Name']!))].sort(),
      scanned: Math.max(0, ...scans.map((n) => (n['Actual Rows'] ?? 0) * (n['Actual Loops'] ?? 1))),
      // A sort is only allowed over what the scans returned, never over the topic.
      sorts: all.filter((n) => n['Node Type'] === 'Sort').map((n) => String(n['Actual Rows'])),
    };
  }

  it('with a deep backlog (a subscription at the start of a topic of 10,000)', async () => {
    await o.outbox
      .subscribe({ name: 'deep', topic: 'gamma', handler: () => undefined })
      .then((x) => x.stop());
    const plan = await explainReceive('deep', 1000);
    expect(plan.indexes).toContain('messages_topic_position');
    for (const index of plan.indexes) expect(['messages_order', 'messages_topic_position']).toContain(index);
    expect(plan.scanned).toBeLessThanOrEqual(1001);
    for (const rows of plan.sorts) expect(Number(rows)).toBeLessThanOrEqual(3003);
  });

  it('when caught up (nothing after the base)', async () => {
    await o.outbox
      .subscribe({ name: 'caught', topic: 'gamma', from: 'now', handler: () => undefined })
      .then((x) => x.stop());
    const plan = await explainReceive('caught', 1000);
    expect(plan.scanned).toBe(0);
  });

  it('when a backlog arrived after the last ANALYZE (a caught-up consumer, then a burst)', async () => {
    await o.outbox
      .subscribe({ name: 'burst', topic: 'delta', from: 'now', handler: () => undefined })
      .then((x) => x.stop());
    await admin.query(`ANALYZE ${s}.messages`);
    for (let i = 0; i < 20; i++) {
      await o.outbox.append(
        'delta',
        Array.from({ length: 1000 }, (_, j) => ({ type: 'm', data: { i, j } })),
      );
    }
    // What each receive costs: with a sort of the backlog, 20,000 rows would be read to return 1,000.
    const plan = await explainReceive('burst', 1000);
    expect(plan.indexes).toContain('messages_topic_position');
    expect(plan.scanned).toBeLessThanOrEqual(1001);
  });
});

describe('lag names the open transaction that holds back its own messages, and nothing else waits', () => {
  it('a forgotten transaction that appended nothing holds nothing back; one that appended is named, and its messages come after it commits', async () => {
    const { o, s } = await fresh();
    const idle = await client('forgotten-psql');
    const appender = await client('forgotten-migration');
    const got: string[] = [];
    const sub = await o.outbox.subscribe<{ label: string }>({
      name: 'mailer',
      topic: 'mail',
      pollInterval: '100ms',
      handler: (ms) => void got.push(...ms.map((m) => m.data.label)),
    });
    try {
      await idle.query('BEGIN');
      await idle.query('SELECT pg_current_xact_id()');
      await o.outbox.append('mail', msgs(['m1', 'm2']));
      await waitFor('m1 and m2, with an idle transaction open', () => got.length === 2);
      expect((await sub.lag()).blockedBy).toBeNull();

      await appender.query('BEGIN');
      await appender.query(`SELECT ${s}.append('mail', 'm', '{"label":"held"}')`);
      const pid = (await appender.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
      const begun = Date.now();
      await o.outbox.append('mail', msgs(['m3']));
      await waitFor('m3, committed after the open appender began', () => got.length === 3);
      await sleep(200);
      const lag = await sub.lag();
      expect(got).toEqual(['m1', 'm2', 'm3']);
      expect(lag).toMatchObject({
        name: 'mailer',
        topic: 'mail',
        messagesBehind: 0,
        waiting: 1,
        blockedBy: {
          pid,
          preparedGid: null,
          state: 'idle in transaction',
          applicationName: 'forgotten-migration',
        },
      });
      expect(lag.owner).not.toBeNull();
      expect(lag.blockedBy!.xidAge).toBeGreaterThanOrEqual(1);
      expect(lag.blockedBy!.openForMs).toBeGreaterThanOrEqual(200);
      expect(lag.blockedBy!.openForMs).toBeLessThanOrEqual(Date.now() - begun + 1000);
      expect((await o.outbox.subscriptions())[0]!.blockedBy).toMatchObject({ pid });

      await appender.query('COMMIT');
      await waitFor('its message, once it committed', () => got.length === 4);
      expect(got).toEqual(['m1', 'm2', 'm3', 'held']);
      await waitFor('the acknowledgement', async () => (await sub.lag()).delivered === 4);
      expect(await sub.lag()).toMatchObject({ messagesBehind: 0, waiting: 0, blockedBy: null, delivered: 4 });
      expect(await count(s)).toBe(4);
    } finally {
      await idle.end();
      await appender.end();
      await sub.stop();
      await close(o);
    }
  });

  it('a transaction in another database of the server holds nothing back', async () => {
    await admin.query('CREATE DATABASE elsewhere');
    const url = new URL(server.url);
    url.pathname = '/elsewhere';
    const other = await client('other-app', url.toString());
    const { o } = await fresh();
    const got: string[] = [];
    const sub = await o.outbox.subscribe<{ label: string }>({
      name: 'n',
      topic: 't',
      pollInterval: '100ms',
      handler: (ms) => void got.push(...ms.map((m) => m.data.label)),
    });
    try {
      await other.query('BEGIN');
      await other.query('SELECT pg_current_xact_id()');
      await o.outbox.append('t', msgs(['x']));
      await waitFor('the message', () => got.length === 1);
      expect((await sub.lag()).blockedBy).toBeNull();
    } finally {
      await other.end();
      await sub.stop();
      await close(o);
    }
  });

  it('a prepared (two-phase) transaction that appended is named by its gid', async () => {
    const { o, s } = await fresh();
    const notifier = await client();
    const c = await client();
    const got: string[] = [];
    const sub = await o.outbox.subscribe<{ label: string }>({
      name: 'n',
      topic: 't',
      pollInterval: '100ms',
      handler: (ms) => void got.push(...ms.map((m) => m.data.label)),
    });
    try {
      // A transaction that sent NOTIFY cannot be prepared; one appender per topic notifies, so
      // the second of two open appenders can be.
      await notifier.query('BEGIN');
      await notifier.query(`SELECT ${s}.append('t', 'm', '{"label":"notifier"}')`);
      await c.query('BEGIN');
      await c.query(`SELECT ${s}.append('t', 'm', '{"label":"prepared"}')`);
      await c.query(`PREPARE TRANSACTION 'ordo-test-gid'`);
      await notifier.query('COMMIT');
      await o.outbox.append('t', msgs(['after']));
      await waitFor('the messages committed', () => got.length === 2);
      const lag = await sub.lag();
      expect(lag.blockedBy).toMatchObject({ pid: null, preparedGid: 'ordo-test-gid' });
      expect(lag.blockedBy!.openForMs).toBeGreaterThanOrEqual(0);
      await c.query(`COMMIT PREPARED 'ordo-test-gid'`);
      await waitFor('the prepared one, once committed', () => got.length === 3);
      expect(got).toEqual(['notifier', 'after', 'prepared']);
      await waitFor('blockedBy to clear', async () => (await sub.lag()).blockedBy === null);
    } finally {
      await c.query(`ROLLBACK PREPARED 'ordo-test-gid'`).catch(() => undefined);
      await c.end();
      await notifier.end();
      await sub.stop();
      await close(o);
    }
  });
});

type Msg = OutboxMessage<{ label: string; bad?: boolean }>;

/** A table the handlers write to through their tx: what is in it was committed. */
async function effects(s: string): Promise<void> {
  await admin.query(`CREATE TABLE ${s}.effects (position bigint PRIMARY KEY, label text NOT NULL)`);
}
async function effectLabels(s: string): Promise<string[]> {
  const { rows } = await admin.query(`SELECT label FROM ${s}.effects ORDER BY position`);
  return rows.map((r) => r.label);
}
const record = (tx: pg.PoolClient, s: string, ms: Msg[]) =>
  tx.query(`INSERT INTO ${s}.effects (position, label) SELECT * FROM unnest($1::bigint[], $2::text[])`, [
    ms.map((m) => m.position),
    ms.map((m) => m.data.label),
  ]);

describe('failures: retries, dead letters, stop', () => {
  it('failing messages in a batch of 50 (the first, and one inside) are isolated, tried maxAttempts times, parked with their error; the rest delivered once', async () => {
    const { o, s } = await fresh();
    await effects(s);
    const labels = Array.from({ length: 50 }, (_, i) => `m${String(i).padStart(2, '0')}`);
    const poison = new Set(['m00', 'm20']);
    const appended = await o.outbox.append(
      'jobs',
      labels.map((label) => ({
        type: 'job',
        data: { label, bad: poison.has(label) },
        key: 'k',
        messageId: label,
      })),
    );
    await o.outbox.append('jobs', msgs(['after1', 'after2']));
    const calls: { labels: string[]; attempt: number }[] = [];
    const errors: OrdoError[] = [];
    const sub = await o.outbox.subscribe<{ label: string; bad?: boolean }>({
      name: 'worker',
      topic: 'jobs',
      batchSize: 100,
      maxAttempts: 3,
      retryDelay: '1ms',
      maxRetryDelay: '5ms',
      onError: (e) => void errors.push(e),
      handler: async (ms, { tx, attempt }) => {
        calls.push({ labels: ms.map((m) => m.data.label), attempt });
        await record(tx, s, ms);
        const bad = ms.find((m) => m.data.bad);
        if (bad) throw new Error(`poison ${bad.data.label}`);
      },
    });
    try {
      await waitFor('everything but the poison delivered', async () => (await sub.lag()).delivered === 50);
      const lag = await sub.lag();
      expect(lag).toMatchObject({ messagesBehind: 0, attempts: 0, lastError: null, delivered: 50 });
      const expected = [...labels.filter((l) => !poison.has(l)), 'after1', 'after2'];
      expect(await effectLabels(s)).toEqual(expected);
      // The whole batch first, then one at a time: each poison alone, attempts 1, 2, 3; the
      // failed batch does not count against either.
      expect(calls[0]!.labels).toEqual([...labels, 'after1', 'after2']);
      for (const p of poison) {
        expect(calls.filter((c) => c.labels.includes(p)).map((c) => [c.labels.length, c.attempt])).toEqual([
          [52, 1],
          [1, 1],
          [1, 2],
          [1, 3],
        ]);
      }
      expect(errors.map((e) => e.code)).toEqual(Array.from({ length: 7 }, () => 'handler_failed'));
      const dead = await o.outbox.deadLetters('worker');
      expect(dead.map((d) => d.messageId)).toEqual(['m00', 'm20']);
      expect(dead[1]).toMatchObject({
        position: appended[20]!.position,
        transactionId: appended[20]!.transactionId,
        topic: 'jobs',
        type: 'job',
        key: 'k',
        messageId: 'm20',
        data: { label: 'm20', bad: true },
        attempts: 3,
        error: 'poison m20',
      });
      expect(dead[0]).toMatchObject({ attempts: 3, error: 'poison m00' });
      expect(dead[1]!.parkedAt).toBeInstanceOf(Date);
    } finally {
      await sub.stop();
      await close(o);
    }
  });

  it("onExhausted 'stop': done resolves exhausted with handler_failed, and the cursor stays before the message", async () => {
    const { o, s } = await fresh();
    await effects(s);
    const appended = await o.outbox.append('jobs', [
      { type: 'job', data: { label: 'g1' } },
      { type: 'job', data: { label: 'g2' } },
      { type: 'job', data: { label: 'bad', bad: true } },
      { type: 'job', data: { label: 'g3' } },
    ]);
    const sub = await o.outbox.subscribe<{ label: string; bad?: boolean }>({
      name: 'strict',
      topic: 'jobs',
      maxAttempts: 2,
      onExhausted: 'stop',
      retryDelay: '1ms',
      maxRetryDelay: '5ms',
      handler: async (ms, { tx }) => {
        await record(tx, s, ms);
        if (ms.some((m) => m.data.bad)) throw new Error('cannot handle bad');
      },
    });
    const end = await sub.done;
    expect(end.reason).toBe('exhausted');
    expect(end.error).toBeInstanceOf(OrdoError);
    expect(end.error!.code).toBe('handler_failed');
    expect(end.error!.message).toContain('cannot handle bad');
    const lag = await o.outbox.lag('strict');
    expect(lag).toMatchObject({
      partitions: [expect.objectContaining({ position: appended[1]!.position })],
      attempts: 2,
      lastError: 'cannot handle bad',
      messagesBehind: 2,
      delivered: 2,
      owner: null,
    });
    expect(await o.outbox.deadLetters('strict')).toEqual([]);
    expect(await effectLabels(s)).toEqual(['g1', 'g2']);
    // Started again with a handler that copes, it resumes at the message it stopped on.
    const again = await o.outbox.subscribe<{ label: string }>({
      name: 'strict',
      topic: 'jobs',
      handler: (ms, { tx }) => record(tx, s, ms).then(() => undefined),
    });
    try {
      await waitFor('the rest', async () => (await again.lag()).messagesBehind === 0);
      expect(await effectLabels(s)).toEqual(['g1', 'g2', 'bad', 'g3']);
    } finally {
      await again.stop();
      await close(o);
    }
  });
});

describe("the handler's tx", () => {
  it('writes through it happen exactly once: gone with a failed attempt, committed with the checkpoint', async () => {
    const { o, s } = await fresh();
    await effects(s);
    const labels = Array.from({ length: 10 }, (_, i) => `e${i}`);
    await o.outbox.append('events', msgs(labels));
    const seen: { labels: string[]; before: number; attempt: number }[] = [];
    let calls = 0;
    const sub = await o.outbox.subscribe<{ label: string }>({
      name: 'projector',
      topic: 'events',
      retryDelay: '1ms',
      maxRetryDelay: '5ms',
      handler: async (ms, { tx, attempt }) => {
        const before = (await tx.query(`SELECT count(*)::int AS n FROM ${s}.effects`)).rows[0].n;
        seen.push({ labels: ms.map((m) => m.data.label), before, attempt });
        await record(tx, s, ms as Msg[]);
        // The first call (all ten) and the first delivery of e5 alone fail after writing.
        if (++calls === 1 || (ms[0]!.data.label === 'e5' && attempt === 1)) throw new Error('flaky');
      },
    });
    try {
      await waitFor('all ten', async () => (await sub.lag()).delivered === 10);
      expect(await effectLabels(s)).toEqual(labels);
      // What the failed attempts wrote was rolled back before the next one looked.
      expect(seen.map((x) => [x.labels.join(','), x.before, x.attempt])).toEqual([
        [labels.join(','), 0, 1],
        ...labels.slice(0, 5).map((l, i) => [l, i, 1]),
        ['e5', 5, 1],
        ['e5', 5, 2],
        ...labels.slice(6).map((l, i) => [l, 6 + i, 1]),
      ]);
    } finally {
      await sub.stop();
      await close(o);
    }
  });

  it('begins with the first statement sent through it, which may set its isolation level; a handler that sends none is acknowledged too', async () => {
    const { o, s } = await fresh();
    await effects(s);
    await o.outbox.append('events', msgs(['quiet', 'writer']));
    const seen: string[] = [];
    const sub = await o.outbox.subscribe<{ label: string }>({
      name: 'isolated',
      topic: 'events',
      batchSize: 1,
      handler: async (ms, { tx }) => {
        if (ms[0]!.data.label === 'quiet') return;
        // Allowed only as a transaction's first statement.
        await tx.query('SET TRANSACTION ISOLATION LEVEL REPEATABLE READ');
        seen.push((await tx.query('SHOW transaction_isolation')).rows[0].transaction_isolation);
        await record(tx, s, ms as Msg[]);
      },
    });
    try {
      await waitFor('both delivered', async () => (await sub.lag()).delivered === 2);
      expect(seen).toEqual(['repeatable read']);
      expect(await effectLabels(s)).toEqual(['writer']);
    } finally {
      await sub.stop();
      await close(o);
    }
  });

  it('a handler that breaks its transaction with an SQL error is retried, even when it swallows the error', async () => {
    const { o, s } = await fresh();
    await effects(s);
    await o.outbox.append('events', msgs(['swallowed', 'thrown']));
    const tries = new Map<string, number>();
    const errors: string[] = [];
    const sub = await o.outbox.subscribe<{ label: string }>({
      name: 'breaker',
      topic: 'events',
      batchSize: 1,
      retryDelay: '1ms',
      maxRetryDelay: '5ms',
      onError: (e) => void errors.push(`${e.code}: ${e.message}`),
      handler: async (ms, { tx }) => {
        const label = ms[0]!.data.label;
        const n = (tries.get(label) ?? 0) + 1;
        tries.set(label, n);
        await record(tx, s, ms as Msg[]);
        if (n > 1) return;
        if (label === 'swallowed') {
          // The transaction is now aborted; the handler returns as if all were well.
          await tx.query('SELECT 1/0').catch(() => undefined);
        } else {
          await tx.query(`SELECT * FROM ${s}.no_such_table`);
        }
      },
    });
    try {
      await waitFor('both delivered', async () => (await sub.lag()).delivered === 2);
      expect(Object.fromEntries(tries)).toEqual({ swallowed: 2, thrown: 2 });
      expect(await effectLabels(s)).toEqual(['swallowed', 'thrown']);
      expect(errors).toHaveLength(2);
      expect(errors[0]).toMatch(/^handler_failed: .*current transaction is aborted/);
      expect(errors[1]).toMatch(/^handler_failed: .*no_such_table/);
    } finally {
      await sub.stop();
      await close(o);
    }
  });
});

describe('what a handler receives', () => {
  it('each field as appended, the instant to the millisecond as stored; the same as receive() and deadLetters() give', async () => {
    const { o, s } = await fresh();
    const appended: MessageInput[] = [
      {
        type: 'Full',
        key: 'k-\u00e9\u{1F600}',
        messageId: 'id-1',
        headers: { trace: 'abc', n: [1, 2] },
        data: {
          s: 'quote " backslash \\ tab \t \u00e9\u{1F600}',
          n: 1.5,
          big: 2 ** 53 - 1,
          nested: [{ a: null }],
        },
      },
      { type: 'Bare', data: null },
      { type: 'Text', data: 'just text', headers: {} },
      { type: 'Number', data: -0.25 },
    ];
    await o.outbox.append('shapes', appended);
    // Instants at each edge of a millisecond, as PostgreSQL stores them (microseconds); the
    // third is one that seconds × 1000, in a float, would put a millisecond early.
    await admin.query(
      `UPDATE ${s}.messages SET created_at = (CASE type
         WHEN 'Full' THEN '2026-11-24 22:06:48.123999+00' WHEN 'Bare' THEN '2026-11-24 22:06:48.124000+00'
         WHEN 'Text' THEN '2038-01-19 04:11:16.575+00' ELSE '1999-12-31 23:59:59.000001+00' END)::timestamptz`,
    );
    const { rows } = await admin.query(
      `SELECT position, transaction_id::text, floor(extract(epoch FROM created_at) * 1000)::float8 AS ms
         FROM ${s}.messages ORDER BY position`,
    );
    const expected = rows.map((r, i) => {
      const m = appended[i]!;
      return {
        position: Number(r.position),
        transactionId: r.transaction_id,
        topic: 'shapes',
        type: m.type,
        key: m.key ?? null,
        messageId: m.messageId ?? null,
        data: m.data,
        headers: m.headers ?? {},
        createdAt: new Date(r.ms),
      };
    });
    expect(expected.map((m) => m.createdAt.toISOString())).toEqual([
      '2026-11-24T22:06:48.123Z',
      '2026-11-24T22:06:48.124Z',
      '2038-01-19T04:11:16.575Z',
      '1999-12-31T23:59:59.000Z',
    ]);
    const handled: OutboxMessage[] = [];
    const sub = await o.outbox.subscribe({
      name: 'shapes',
      topic: 'shapes',
      handler: (ms) => void handled.push(...ms),
    });
    try {
      await waitFor('all four', () => handled.length === 4);
      expect(handled).toEqual(expected);
      await o.outbox.createSubscription({ name: 'shapes-http', topic: 'shapes' });
      expect((await o.outbox.receive('shapes-http', { max: 10 })).messages).toEqual(expected);
      // Parked, then read back.
      const parked = await o.outbox.subscribe({
        name: 'shapes-parked',
        topic: 'shapes',
        maxAttempts: 1,
        retryDelay: '1ms',
        handler: () => {
          throw new Error('park it');
        },
      });
      await waitFor(
        'all four parked',
        async () => (await o.outbox.deadLetters('shapes-parked')).length === 4,
      );
      await parked.stop();
      const letters = await o.outbox.deadLetters('shapes-parked');
      expect(letters.map(({ attempts: _, error: __, parkedAt: ___, ...m }) => m)).toEqual(expected);
    } finally {
      await sub.stop();
      await close(o);
    }
  });
});

describe("the acknowledgement's commit (ack_handled)", () => {
  it('waits for the WAL flush only when the handler wrote in the transaction', async () => {
    const { o, s } = await fresh();
    await effects(s);
    await o.outbox.append('events', msgs(['a', 'b']));
    await o.outbox.createSubscription({ name: 'flush', topic: 'events' });
    const c = await client();
    try {
      const settings = async (handlerWrites: boolean) => {
        await c.query(`SELECT * FROM ${s}.lease_partition('flush', 0, 'me', 60000)`);
        const { rows } = await c.query(
          `SELECT position, version FROM ${s}.receive('flush', 0, 'me', 1, 60000)`,
        );
        await c.query('BEGIN');
        if (handlerWrites) await c.query(`INSERT INTO ${s}.effects VALUES ($1, 'w')`, [rows[0].position]);
        const acked = await c.query(`SELECT ${s}.ack_handled('flush', 0, 'me', $1, 60000) AS handled`, [
          rows[0].version,
        ]);
        const { rows: shown } = await c.query('SHOW synchronous_commit');
        await c.query('COMMIT');
        return [acked.rows[0].handled, shown[0].synchronous_commit];
      };
      expect(await settings(false)).toEqual([1, 'off']);
      expect(await settings(true)).toEqual([1, 'on']);
      // Each setting was the transaction's alone, and both batches were passed.
      expect((await c.query('SHOW synchronous_commit')).rows[0].synchronous_commit).toBe('on');
      expect((await o.outbox.lag('flush')).delivered).toBe(2);
      // A batch of another version is refused, as by ack().
      await c.query('BEGIN');
      const stale = await c.query(`SELECT ${s}.ack_handled('flush', 0, 'me', 1, 60000) AS handled`);
      await c.query('ROLLBACK');
      expect(stale.rows[0].handled).toBeNull();
    } finally {
      await c.end();
      await close(o);
    }
  });
});

describe('prune', () => {
  it('keeps what a subscription still needs, deletes what every subscription of the topic passed, respects olderThan and topic', async () => {
    const { o, s } = await fresh();
    const got = { fast: [] as string[], slow: [] as string[] };
    const start = (name: 'fast' | 'slow') =>
      o.outbox.subscribe<{ label: string }>({
        name,
        topic: 'P',
        handler: (ms) => void got[name].push(...ms.map((m) => m.data.label)),
      });
    const ps = Array.from({ length: 10 }, (_, i) => `p${i + 1}`);
    // R has a subscription that has read nothing yet; Q has none at all.
    await (await o.outbox.subscribe({ name: 'r-reader', topic: 'R', handler: () => undefined })).stop();
    await o.outbox.append('Q', msgs(['q1', 'q2', 'q3']));
    await o.outbox.append('R', msgs(['r1', 'r2']));
    const fast = await start('fast');
    let slow = await start('slow');
    try {
      await o.outbox.append('P', msgs(ps.slice(0, 5)));
      await waitFor('both to read p1..p5', () => got.fast.length === 5 && got.slow.length === 5);
      await waitFor('both checkpoints', async () =>
        (await Promise.all([fast.lag(), slow.lag()])).every((l) => l.delivered === 5),
      );
      await slow.stop();
      await o.outbox.append('P', msgs(ps.slice(5)));
      await waitFor('fast to read p6..p10', async () => (await fast.lag()).delivered === 10);

      // Nothing is old enough yet.
      expect(await o.outbox.prune({ olderThan: '1h' })).toBe(0);
      // Age every message but p10 (created_at is when it was appended: set it in the past).
      await admin.query(
        `UPDATE ${s}.messages SET created_at = now() - interval '2 hours' WHERE data->>'label' <> 'p10'`,
      );
      const left = async () =>
        (await admin.query(`SELECT data->>'label' AS l FROM ${s}.messages ORDER BY position`)).rows.map(
          (r) => r.l,
        );
      // Topic P only: p1..p5 are behind both subscriptions; p6..p9 behind fast only; p10 is young.
      expect(await o.outbox.prune({ olderThan: '1h', topic: 'P' })).toBe(5);
      expect(await left()).toEqual(['q1', 'q2', 'q3', 'r1', 'r2', ...ps.slice(5)]);
      // Every topic: Q has no subscription, so all of it goes; R's reader has not read r1, r2.
      expect(await o.outbox.prune({ olderThan: '1h' })).toBe(3);
      expect(await left()).toEqual(['r1', 'r2', ...ps.slice(5)]);

      // The slow subscription resumes and gets exactly what it still needed.
      slow = await start('slow');
      await waitFor('slow to catch up', async () => (await slow.lag()).delivered === 10);
      expect(got.slow).toEqual(ps);
      expect(await o.outbox.prune({ olderThan: '1h' })).toBe(4);
      expect(await o.outbox.prune({ olderThan: 0 })).toBe(1);
      expect(await left()).toEqual(['r1', 'r2']);
      // Forgetting R's reader frees R.
      await o.outbox.removeSubscription('r-reader');
      expect(await o.outbox.prune({ olderThan: 0 })).toBe(2);
    } finally {
      await fast.stop();
      await slow.stop();
      await close(o);
    }
  });
});

describe('leases: one consumer per subscription across instances', () => {
  it('two ordo instances on one name: one handler at a time; stop() hands the lease over at once', async () => {
    const { o: one, s } = await fresh();
    const { o: two } = await fresh({ schema: s });
    await effects(s);
    const by = { one: [] as string[], two: [] as string[] };
    let active = 0;
    let most = 0;
    const handler =
      (who: 'one' | 'two') =>
      async (ms: Msg[], { tx }: { tx: pg.PoolClient }) => {
        most = Math.max(most, ++active);
        try {
          await sleep(5);
          await record(tx, s, ms);
          by[who].push(...ms.map((m) => m.data.label));
        } finally {
          active--;
        }
      };
    // A lapsed-lease takeover would take 60 s, and a poll an hour: a prompt handover can only
    // come from the released lease and its notification.
    const options = { name: 'shared', topic: 'T', lease: '60s', pollInterval: '1h', batchSize: 3 };
    const first = await one.outbox.subscribe({ ...options, handler: handler('one') });
    let second: Awaited<ReturnType<typeof two.outbox.subscribe>> | undefined;
    try {
      await waitFor('the first to hold the lease', async () => (await first.lag()).owner !== null);
      second = await two.outbox.subscribe({ ...options, handler: handler('two') });
      for (let i = 0; i < 4; i++) await one.outbox.append('T', msgs([0, 1, 2, 3, 4].map((j) => `a${i}${j}`)));
      await waitFor('the first to deliver all 20', async () => (await first.lag()).delivered === 20);
      expect(by.one).toHaveLength(20);
      expect(by.two).toEqual([]);

      expect(await first.stop()).toEqual({ reason: 'stopped' });
      await two.outbox.append('T', msgs(['b0', 'b1', 'b2', 'b3', 'b4']));
      await waitFor(
        'the second to take over and deliver',
        async () => (await second!.lag()).delivered === 25,
        5_000,
      );
      expect(by.two).toEqual(['b0', 'b1', 'b2', 'b3', 'b4']);
      expect(most).toBe(1);
      const all = await effectLabels(s);
      expect(all).toHaveLength(25);
      expect(new Set(all).size).toBe(25);
    } finally {
      await first.stop();
      await second?.stop();
      await close(one);
      await close(two);
    }
  });

  it('a holder whose lease lapses (handler hung, renewals starved) is replaced after the lease; its batch is redelivered, its late commit refused', async () => {
    // The holder's pool has one connection: while its handler hangs holding it, the lease
    // renewals queue behind it and cannot run, as in a process that is frozen.
    const { o: holder, s } = await fresh({ poolSize: 1 });
    const { o: rescuer } = await fresh({ schema: s });
    // No unique key: the holder's late writes must be undone by its refused checkpoint.
    await admin.query(`CREATE TABLE ${s}.writes (label text NOT NULL, who text NOT NULL)`);
    const write = (tx: pg.PoolClient, who: string, ms: Msg[]) =>
      tx.query(`INSERT INTO ${s}.writes SELECT unnest($1::text[]), $2`, [ms.map((m) => m.data.label), who]);
    const writes = async () =>
      (await admin.query(`SELECT label, who FROM ${s}.writes ORDER BY label`)).rows.map(
        (r) => `${r.label}:${r.who}`,
      );
    const appended = await holder.outbox.append('T', msgs(['x1', 'x2', 'x3']));
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const inHand: number[] = [];
    const stuck = await holder.outbox.subscribe<{ label: string }>({
      name: 'shared',
      topic: 'T',
      lease: '1s',
      pollInterval: '100ms',
      handler: async (ms, { tx }) => {
        inHand.push(...ms.map((m) => m.position));
        await gate;
        await write(tx, 'holder', ms as Msg[]);
      },
    });
    const rescued: number[] = [];
    let rescue: Awaited<ReturnType<typeof rescuer.outbox.subscribe>> | undefined;
    try {
      await waitFor('the holder to be stuck in its handler', () => inHand.length === 3);
      rescue = await rescuer.outbox.subscribe<{ label: string }>({
        name: 'shared',
        topic: 'T',
        lease: '1s',
        pollInterval: '100ms',
        handler: async (ms, { tx }) => {
          await write(tx, 'rescuer', ms as Msg[]);
          rescued.push(...ms.map((m) => m.position));
        },
      });
      await waitFor('the rescuer to take over after the lease', () => rescued.length === 3);
      // The same messages: the holder's batch never committed.
      expect(rescued).toEqual(inHand);
      expect(rescued).toEqual(appended.map((a) => a.position));
      await waitFor('the rescuer’s checkpoint', async () => (await rescue!.lag()).delivered === 3);

      // The holder wakes up, writes, and tries to checkpoint the same batch: refused, rolled back.
      release();
      // Its single connection serves this only once that step has ended.
      await holder.outbox.lag('shared');
      expect(await writes()).toEqual(['x1:rescuer', 'x2:rescuer', 'x3:rescuer']);
      // It does not come back while the rescuer renews.
      await holder.outbox.append('T', msgs(['y1']));
      await waitFor('y1', () => rescued.length === 4);
      await sleep(300);
      expect(inHand).toHaveLength(3);
      expect(await writes()).toEqual(['x1:rescuer', 'x2:rescuer', 'x3:rescuer', 'y1:rescuer']);
    } finally {
      release();
      await stuck.stop();
      await rescue?.stop();
      await close(holder);
      await close(rescuer);
    }
  });
});

describe('the consumer and its connections', () => {
  it('handlers failing while every pool connection is in a batch: the consumers retry, not deadlock', async () => {
    const { o } = await fresh({ poolSize: 2 });
    const tries = { a: 0, b: 0 };
    let inBatch = 0;
    let bothIn!: () => void;
    const together = new Promise<void>((r) => (bothIn = r));
    const handler = (name: 'a' | 'b') => async () => {
      // Both consumers hold a connection (the pool's two) when their handlers fail.
      if (++tries[name] === 1) {
        if (++inBatch === 2) bothIn();
        await together;
        throw new Error('transient');
      }
    };
    const options = { retryDelay: '1ms', maxRetryDelay: '5ms', pollInterval: '100ms' } as const;
    await o.outbox.append('A', msgs(['a']));
    await o.outbox.append('B', msgs(['b']));
    const subs = [
      await o.outbox.subscribe({ name: 'a', topic: 'A', handler: handler('a'), ...options }),
      await o.outbox.subscribe({ name: 'b', topic: 'B', handler: handler('b'), ...options }),
    ];
    try {
      await waitFor('both handlers to be retried', () => tries.a >= 2 && tries.b >= 2, 3_000);
    } finally {
      if (!(tries.a >= 2 && tries.b >= 2)) {
        // Deadlocked: give the pool room so that the consumers go on and the test can end.
        const pool = (o as unknown as { pool: { options: { max: number }; _pulseQueue(): void } }).pool;
        pool.options.max = 10;
        for (let i = 0; i < 10; i++) pool._pulseQueue();
      }
      for (const sub of subs) await sub.stop();
      await close(o);
    }
  });

  it('a connection cut while the handler runs (idle_in_transaction_session_timeout) is retried, with no uncaught error', async () => {
    await admin.query('CREATE DATABASE strict_db');
    await admin.query(`ALTER DATABASE strict_db SET idle_in_transaction_session_timeout = '200ms'`);
    const url = new URL(server.url);
    url.pathname = '/strict_db';
    const { o } = await fresh({ databaseUrl: url.toString(), schema: 'ordo' });
    const uncaught: string[] = [];
    const onUncaught = (e: Error) => void uncaught.push(e.message);
    process.on('uncaughtException', onUncaught);
    let calls = 0;
    const errors: string[] = [];
    const sub = await o.outbox.subscribe({
      name: 'slow',
      topic: 'T',
      retryDelay: '1ms',
      maxRetryDelay: '5ms',
      onError: (e) => void errors.push(e.code),
      handler: async (_, { tx }) => {
        if (++calls > 1) return;
        // The transaction begins with a statement through it; then slow work outside the
        // database, longer than the server lets a transaction idle.
        await tx.query('SELECT 1');
        await sleep(1000);
      },
    });
    try {
      await o.outbox.append('T', msgs(['m']));
      await waitFor('the message to be delivered', async () => (await sub.lag()).delivered === 1);
      expect(calls).toBe(2);
      expect(errors.length).toBeGreaterThanOrEqual(1);
      expect(uncaught).toEqual([]);
    } finally {
      process.off('uncaughtException', onUncaught);
      await sub.stop();
      await close(o);
    }
  });
});

describe("from: 'now'", () => {
  it('skips what committed before, delivers what commits after, an older open transaction’s messages included', async () => {
    const { o } = await fresh();
    const late = await client();
    const got: string[] = [];
    try {
      await o.outbox.append('T', msgs(['old1', 'old2']));
      await late.query('BEGIN');
      await o.outbox.append('T', msgs(['in-flight']), { tx: late });
      const sub = await o.outbox.subscribe<{ label: string }>({
        name: 'tail',
        topic: 'T',
        from: 'now',
        pollInterval: '100ms',
        handler: (ms) => void got.push(...ms.map((m) => m.data.label)),
      });
      await o.outbox.append('T', msgs(['new1']));
      // The open transaction holds back only its own message; new1 committed first, so it comes first.
      await waitFor('new1', async () => (await sub.lag()).delivered === 1);
      await late.query('COMMIT');
      await o.outbox.append('T', msgs(['new2']));
      await waitFor('three messages', async () => (await sub.lag()).delivered === 3);
      expect(got).toEqual(['new1', 'in-flight', 'new2']);
      await sub.stop();
      // `from` only places a new subscription: started again from the beginning, it goes on.
      const again = await o.outbox.subscribe<{ label: string }>({
        name: 'tail',
        topic: 'T',
        from: 'beginning',
        pollInterval: '100ms',
        handler: (ms) => void got.push(...ms.map((m) => m.data.label)),
      });
      await o.outbox.append('T', msgs(['new3']));
      await waitFor('new3', async () => (await again.lag()).delivered === 4);
      expect(got).toEqual(['new1', 'in-flight', 'new2', 'new3']);
      await again.stop();
    } finally {
      await late.end();
      await close(o);
    }
  });
});

describe('wake-up', () => {
  it('with pollInterval 1h, a committed append is delivered promptly through LISTEN/NOTIFY; a silent insert is not', async () => {
    const { o, s } = await fresh();
    const got: string[] = [];
    const writer = await client();
    const sub = await o.outbox.subscribe<{ label: string }>({
      name: 'n',
      topic: 'T',
      pollInterval: '1h',
      lease: '60s',
      handler: (ms) => void got.push(...ms.map((m) => m.data.label)),
    });
    try {
      await o.outbox.append('T', msgs(['first']));
      await waitFor('first', async () => (await sub.lag()).delivered === 1);
      // After a delivery the consumer looks again a few times (8 quick looks, 1 to 50 ms apart,
      // longer on a loaded machine), then finds nothing and sleeps for an hour.
      await sleep(2000);
      // Control: a row inserted without ordo.append sends no notification, so it stays put.
      await admin.query(
        `INSERT INTO ${s}.messages (topic, type, data) VALUES ('T', 'm', '{"label":"silent"}')`,
      );
      await sleep(1000);
      expect(got).toEqual(['first']);
      // In a transaction: the notification goes out on commit.
      await writer.query('BEGIN');
      await o.outbox.append('T', msgs(['in-tx']), { tx: writer });
      await sleep(300);
      expect(got).toEqual(['first']);
      await writer.query('COMMIT');
      await waitFor('the notified delivery', () => got.length === 3, 5_000);
      expect(got).toEqual(['first', 'silent', 'in-tx']);
      await o.outbox.append('T', msgs(['loud']));
      await waitFor('loud', () => got.length === 4, 5_000);
    } finally {
      await writer.end();
      await sub.stop();
      await close(o);
    }
  });

  it('an idle subscription does not spin: a handful of transactions a second, where a 1 ms poll makes hundreds', async () => {
    // Each in a database of its own, so pg_stat_database counts its transactions alone.
    const urls: Record<string, string> = {};
    for (const db of ['idle_db', 'busy_db']) {
      await admin.query(`CREATE DATABASE ${db}`);
      const url = new URL(server.url);
      url.pathname = `/${db}`;
      urls[db] = url.toString();
    }
    const { o: idle } = await fresh({ databaseUrl: urls.idle_db, schema: 'ordo' });
    const { o: busy } = await fresh({ databaseUrl: urls.busy_db, schema: 'ordo' });
    const subs = [
      await idle.outbox.subscribe({ name: 'n', topic: 'T', pollInterval: '1s', handler: () => undefined }),
      await busy.outbox.subscribe({ name: 'n', topic: 'T', pollInterval: '1ms', handler: () => undefined }),
    ];
    const commits = async () => {
      // A fresh connection each time: no statistics snapshot kept from an earlier read.
      const { rows } = await admin.query(
        `SELECT datname, xact_commit::int AS n FROM pg_stat_database WHERE datname IN ('idle_db', 'busy_db')`,
      );
      return Object.fromEntries(rows.map((r) => [r.datname, r.n])) as Record<string, number>;
    };
    try {
      await sleep(1000);
      const before = await commits();
      await sleep(2000);
      const after = await commits();
      const delta = { idle: after.idle_db! - before.idle_db!, busy: after.busy_db! - before.busy_db! };
      // About two per poll (the read's transaction, then the pending check).
      expect(delta.idle).toBeLessThan(20);
      // The same measure sees a consumer that polls all the time.
      expect(delta.busy).toBeGreaterThan(100);
    } finally {
      for (const sub of subs) await sub.stop();
      await close(idle);
      await close(busy);
    }
  });
});

describe('stop()', () => {
  it('right after subscribe(): no batch is handled or checkpointed after stop() was called', async () => {
    const { o } = await fresh();
    await o.outbox.append('t', msgs(['a', 'b']));
    for (let i = 0; i < 5; i++) {
      let handled = 0;
      const sub = await o.outbox.subscribe({
        name: `quick-${i}`,
        topic: 't',
        handler: () => {
          handled++;
        },
      });
      expect(await sub.stop()).toEqual({ reason: 'stopped' });
      const lag = await o.outbox.lag(`quick-${i}`);
      expect({ handled, delivered: lag.delivered, owner: lag.owner }).toEqual({
        handled: 0,
        delivered: 0,
        owner: null,
      });
    }
    await close(o);
  });
});

describe('a batch abandoned before its handler', () => {
  it('stopped while its batch is read: nothing handled, and its connection goes back to the pool in no transaction', async () => {
    // One connection, the consumer's and then this test's: what the consumer leaves on it shows.
    const pool = new pg.Pool({ connectionString: server.url, max: 1 });
    pool.on('error', () => undefined);
    let sub: Subscription | undefined;
    pool.on('connect', (c) => {
      const query = c.query.bind(c) as (...args: unknown[]) => unknown;
      // stop() while receive() is on its way: the batch arrives for a consumer that stopped.
      c.query = ((...args: unknown[]) => {
        const text = (args[0] as { text?: unknown } | undefined)?.text;
        if (typeof text === 'string' && text.includes('.receive(')) void sub?.stop();
        return query(...args);
      }) as typeof c.query;
    });
    const o = await createOrdo({ pool, schema: `t${++schemas}` });
    made.add(o);
    try {
      await o.outbox.append('t', msgs(['a', 'b']));
      let handled = 0;
      sub = await o.outbox.subscribe({ name: 'abandoned', topic: 't', handler: () => void handled++ });
      expect(await sub.done).toEqual({ reason: 'stopped' });
      const { rows } = await pool.query('SELECT transaction_timestamp() = statement_timestamp() AS alone');
      expect(rows[0].alone).toBe(true);
      const lag = await o.outbox.lag('abandoned');
      expect({ handled, delivered: lag.delivered, owner: lag.owner }).toEqual({
        handled: 0,
        delivered: 0,
        owner: null,
      });
    } finally {
      await close(o);
      await pool.end();
    }
  });
});

describe('removeSubscription', () => {
  it('ends the running consumer of the subscription at its next read, even when it is idle', async () => {
    const { o } = await fresh();
    const calls: number[] = [];
    const sub = await o.outbox.subscribe({
      name: 'gone',
      topic: 'T',
      pollInterval: '100ms',
      lease: '1s',
      handler: (ms) => void calls.push(ms.length),
    });
    try {
      await waitFor('the consumer to hold its lease', async () => (await sub.lag()).owner !== null);
      expect(await o.outbox.removeSubscription('gone')).toBe(true);
      // Polls every 100 ms and renews its lease every 333 ms: 3 s is plenty of next reads.
      const end = await Promise.race([sub.done, sleep(3000).then(() => 'still running after 3 s')]);
      expect(end).toMatchObject({ reason: 'stopped', error: { code: 'subscription_not_found' } });
      // Nor is a removed subscription's handler given messages.
      await o.outbox.append('T', msgs(['late']));
      await sleep(300);
      expect(calls).toEqual([]);
    } finally {
      await sub.stop();
      await close(o);
    }
  });
});
