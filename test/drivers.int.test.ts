// Every PostgreSQL driver people use in TypeScript as ordo's `tx`: pg, postgres.js, Kysely
// (on pg and on postgres.js) and Drizzle (node-postgres and postgres.js), the real libraries
// on this file's own database, no mocks. For each: a rollback gives a gapless number back and
// leaves no message and no permit; committed rows hold exactly what was given; the values ordo
// returns (numbers, periods, Dates) are the ones pg gives.
import { drizzle as drizzleNodePg } from 'drizzle-orm/node-postgres';
import { integer, pgTable } from 'drizzle-orm/pg-core';
import { drizzle as drizzlePostgresJs } from 'drizzle-orm/postgres-js';
import { CamelCasePlugin, Kysely, type KyselyPlugin, PostgresDialect } from 'kysely';
import pg from 'pg';
import postgres from 'postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { asQueryable } from '../src/db/queryable.js';
import {
  createOrdo,
  fromDrizzle,
  fromKysely,
  fromPostgresJs,
  fromRawSql,
  type MessageInput,
  type Ordo,
  OrdoError,
  type Queryable,
} from '../src/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { postgresJsPool } from './support/kysely-postgres-js.js';

let db: TestDatabase;
let ordo: Ordo;
let pool: pg.Pool;
/** Every postgres.js instance made here, ended in afterAll. */
const instances: postgres.Sql[] = [];
let kyselyOnPg: Kysely<Record<string, never>>;
let rawPool: pg.Pool | undefined;

class Rollback extends Error {}

interface Driver {
  name: string;
  /** Runs fn in one of this driver's transactions, handing it the driver's own object as `tx`. */
  transaction<T>(fn: (tx: Queryable) => Promise<T>): Promise<T>;
  /** Whether rows come back parsed by column type as pg parses them (Kysely shows no column types). */
  pgRows: boolean;
}

/**
 * ordo's option types still name Queryable (Tx would admit these objects); the drivers' own
 * objects are recognised at run time, which is what these tests prove.
 */
const asIs = (tx: unknown) => tx as Queryable;

/** BEGIN … COMMIT on a client of `from`, or ROLLBACK when fn throws. */
async function pgTransaction<T>(from: pg.Pool, fn: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  const client = await from.connect();
  try {
    await client.query('BEGIN');
    const value = await fn(client);
    await client.query('COMMIT');
    return value;
  } catch (e) {
    await client.query('ROLLBACK');
    throw e;
  } finally {
    client.release();
  }
}

const drivers: Driver[] = [
  { name: 'pg PoolClient', pgRows: true, transaction: (fn) => pgTransaction(pool, fn) },
  {
    // Its pool parses nothing (every value a string): ordo still reads rows with pg's defaults.
    name: 'pg PoolClient of a pool with its own type parsers',
    pgRows: true,
    transaction(fn) {
      rawPool ??= new pg.Pool({
        connectionString: db.url,
        max: 2,
        types: { getTypeParser: () => (text: string) => text },
      });
      return pgTransaction(rawPool, fn);
    },
  },
  {
    name: 'postgres.js sql.begin',
    pgRows: true,
    transaction: (fn) => sqlOf('plain').begin((tx) => fn(asIs(tx))) as never,
  },
  {
    name: 'postgres.js reserved connection, camelCase transform',
    pgRows: true,
    async transaction(fn) {
      const reserved = await sqlOf('camel').reserve();
      try {
        await reserved.unsafe('BEGIN');
        const value = await fn(asIs(reserved));
        await reserved.unsafe('COMMIT');
        return value;
      } catch (e) {
        await reserved.unsafe('ROLLBACK');
        throw e;
      } finally {
        reserved.release();
      }
    },
  },
  {
    name: 'Kysely on pg, with plugins',
    pgRows: true,
    transaction: (fn) => kyselyOnPg.transaction().execute((trx) => fn(asIs(trx))),
  },
  {
    name: 'Kysely on postgres.js',
    pgRows: false,
    transaction: (fn) =>
      kyselyOnPostgresJs()
        .transaction()
        .execute((trx) => fn(asIs(trx))),
  },
  {
    name: 'Drizzle node-postgres',
    pgRows: true,
    transaction: (fn) => drizzleNodePg({ client: pool }).transaction((tx) => fn(asIs(tx))),
  },
  {
    name: 'Drizzle postgres.js',
    pgRows: true,
    transaction: (fn) => drizzlePostgresJs({ client: sqlOf('drizzle') }).transaction((tx) => fn(asIs(tx))),
  },
  {
    // Prisma's $queryRawUnsafe in an interactive transaction has this shape: SQL text in, rows out.
    name: 'fromRawSql (the Prisma recipe) on a pg client',
    pgRows: true,
    transaction: (fn) =>
      pgTransaction(pool, (client) => fn(fromRawSql(async (text) => (await client.query(text)).rows))),
  },
];

/** One postgres.js instance per use: Drizzle changes the parsers of the instance it is given. */
const named = new Map<string, postgres.Sql>();
function sqlOf(use: 'plain' | 'camel' | 'drizzle' | 'kysely'): postgres.Sql {
  let sql = named.get(use);
  if (!sql) {
    sql = postgres(db.url, {
      max: 3,
      onnotice: () => undefined,
      ...(use === 'camel' ? { transform: postgres.camel } : {}),
    });
    named.set(use, sql);
    instances.push(sql);
  }
  return sql;
}

let kyselyOnPostgresJsDb: Kysely<Record<string, never>> | undefined;
function kyselyOnPostgresJs(): Kysely<Record<string, never>> {
  kyselyOnPostgresJsDb ??= new Kysely({
    dialect: new PostgresDialect({ pool: postgresJsPool(sqlOf('kysely')) }),
  });
  return kyselyOnPostgresJsDb;
}

/** A plugin that adds a column to every row: ordo's statements must not go through plugins. */
const tagging: KyselyPlugin = {
  transformQuery: ({ node }) => node,
  transformResult: async ({ result }) => ({
    ...result,
    rows: result.rows.map((r) => ({ ...r, tagged: true })),
  }),
};

beforeAll(async () => {
  db = await freshDatabase('ordo_drivers');
  ordo = await createOrdo({ databaseUrl: db.url });
  pool = db.pool(6);
  kyselyOnPg = new Kysely({
    dialect: new PostgresDialect({ pool }),
    plugins: [new CamelCasePlugin(), tagging],
  });
});

afterAll(async () => {
  await ordo?.close();
  await Promise.all(instances.map((sql) => sql.end({ timeout: 1 })));
  await rawPool?.end();
  await db?.drop();
});

/** Runs fn in the driver's transaction and rolls it back. */
async function rolledBack(d: Driver, fn: (tx: Queryable) => Promise<unknown>): Promise<void> {
  await expect(
    d.transaction(async (tx) => {
      await fn(tx);
      throw new Rollback();
    }),
  ).rejects.toBeInstanceOf(Rollback);
}

/** Messages with everything that can go wrong between a driver and a jsonb[] or text[] parameter. */
const MESSAGES: MessageInput[] = [
  {
    type: 'Object',
    data: {
      s: 'quote " backslash \\ comma , braces {} [] newline \n tab \t',
      unicode: 'é 😀 \u2028',
      n: -1.5e-7,
    },
    key: 'k,{"}\\ NULL',
    messageId: 'm,{"}\\1',
    headers: { trace: 'a"b\\c', nested: { list: [1, null, 'x'] } },
  },
  { type: 'Array', data: [1, 'two', null, { three: [3] }, []], key: null, messageId: null },
  { type: 'String', data: 'a "string" with \\ and {braces}, commas', key: 'NULL', messageId: 'NULL' },
  { type: 'Number', data: 1e21, key: '' },
  { type: 'True', data: true, messageId: '"quoted"' },
  { type: 'JsonNull', data: null, key: '{}' },
  { type: 'Empty', data: {}, headers: {} },
  { type: 'EmptyString', data: '', key: ' spaces ' },
  // Stored once: the second is a duplicate of the first within the same append.
  { type: 'Again', data: 1, messageId: 'm,{"}\\1' },
];

/** The rows MESSAGES must leave, as PostgreSQL holds them (read with pg). */
const EXPECTED = MESSAGES.slice(0, -1).map((m) => ({
  type: m.type,
  data: JSON.parse(JSON.stringify(m.data)),
  kind:
    m.data === null
      ? 'null'
      : Array.isArray(m.data)
        ? 'array'
        : typeof m.data === 'object'
          ? 'object'
          : typeof m.data,
  key: m.key ?? null,
  message_id: m.messageId ?? null,
  headers: m.headers ?? {},
}));

async function stored(topic: string) {
  const { rows } = await pool.query(
    `SELECT type, data, jsonb_typeof(data) AS kind, key, message_id, headers
       FROM ordo.messages WHERE topic = $1 ORDER BY position`,
    [topic],
  );
  return rows;
}

describe.each(drivers.map((d, i) => ({ d, i, name: d.name })))('$name as tx', ({ d, i }) => {
  it('a gapless number taken in a rolled-back transaction comes back; committed ones stay', async () => {
    const name = `invoice${i}`;
    await ordo.sequences.define({
      name,
      reset: 'day',
      timeZone: 'Asia/Tokyo',
      format: '{YYYY}-{MM}-{DD}/{n:3}',
    });
    const at = new Date('2026-03-28T23:30:00Z'); // 08:30 on 29 March in Tokyo
    const issued = (value: number) => ({
      value,
      text: `2026-03-29/${String(value).padStart(3, '0')}`,
      period: '2026-03-29',
      scope: 'acme',
    });
    await rolledBack(d, async (tx) => {
      expect(await ordo.sequences.next(name, { tx, at, scope: 'acme' })).toEqual(issued(1));
    });
    const committed = await d.transaction(async (tx) => [
      await ordo.sequences.next(name, { tx, at, scope: 'acme' }),
      ...(await ordo.sequences.nextMany(name, 2, { tx, at: '2026-03-29T10:00:00+09:00', scope: 'acme' })),
      await ordo.sequences.next(name, { tx, at, scope: 'acme', idempotencyKey: 'retry-1' }),
    ]);
    expect(committed).toEqual([1, 2, 3, 4].map(issued));
    // The key's answer was committed with the value: a retry outside gets the same one.
    expect(await ordo.sequences.next(name, { at, scope: 'acme', idempotencyKey: 'retry-1' })).toEqual(
      issued(4),
    );
    await rolledBack(d, async (tx) => {
      expect(await ordo.sequences.next(name, { tx, at, scope: 'acme' })).toEqual(issued(5));
    });
    expect(await ordo.sequences.next(name, { at, scope: 'acme' })).toEqual(issued(5));
    const { rows } = await pool.query(
      `SELECT to_char(period, 'YYYY-MM-DD') AS period, value FROM ordo.counters WHERE sequence = $1`,
      [name],
    );
    expect(rows).toEqual([{ period: '2026-03-29', value: '5' }]);
    // Without `at`: the transaction's own now(), whichever driver holds it.
    const today = await d.transaction((tx) => ordo.sequences.next(`invoice${i}`, { tx }));
    expect(today).toMatchObject({ value: 1, scope: '' });
    expect(today.period).toMatch(/^\d{4}-\d{2}-\d{2}$/);
  });

  it('a number of a sequence that never resets has no period (null, not the text NULL)', async () => {
    const name = `forever${i}`;
    await ordo.sequences.define({ name, format: '{scope}-{n}' });
    const issued = await d.transaction((tx) => ordo.sequences.next(name, { tx, scope: 'NULL' }));
    expect(issued).toEqual({ value: 1, text: 'NULL-1', period: null, scope: 'NULL' });
  });

  it('an outbox append rolled back is gone; a committed one holds exactly the messages given', async () => {
    const topic = `orders${i}`;
    await rolledBack(d, (tx) => ordo.outbox.append(topic, MESSAGES, { tx }));
    expect(await stored(topic)).toEqual([]);
    const appended = await d.transaction((tx) => ordo.outbox.append(topic, MESSAGES, { tx }));
    expect(await stored(topic)).toEqual(EXPECTED);
    expect(appended.map((a) => [a.messageId, a.duplicate])).toEqual(
      MESSAGES.map((m, n) => [m.messageId ?? null, n === MESSAGES.length - 1]),
    );
    // One transaction's id, as text, and positions in the order given.
    const kept = appended.filter((a) => !a.duplicate);
    expect(new Set(kept.map((a) => a.transactionId)).size).toBe(1);
    expect(kept[0]!.transactionId).toMatch(/^\d+$/);
    const order = kept.map((a) => a.position!);
    expect(order).toEqual([...order].sort((a, b) => a - b));
    const positions = appended.slice(0, -1).map((a) => a.position!);
    expect(positions.every((p) => typeof p === 'number')).toBe(true);
    expect(positions).toEqual([...positions].sort((a, b) => a - b));
    expect(new Set(appended.slice(0, -1).map((a) => a.transactionId)).size).toBe(1);
    expect(appended[0]!.transactionId).toMatch(/^\d+$/);
    // A single message, not in a list.
    const [one] = await d.transaction((tx) =>
      ordo.outbox.append(topic, { type: 'One', data: [null] }, { tx }),
    );
    expect(one).toMatchObject({ messageId: null, duplicate: false });
    expect(one!.position).toBeGreaterThan(positions.at(-1)!);
    expect((await stored(topic)).at(-1)).toEqual({
      type: 'One',
      data: [null],
      kind: 'array',
      key: null,
      message_id: null,
      headers: {},
    });
  });

  it('a throttle acquired in a rolled-back transaction leaves no permit; permits read as pg reads them', async () => {
    const name = `foo${i}`;
    await ordo.throttles.define({ name, every: '1h', concurrency: 1, lease: '10m' });
    await rolledBack(d, async (tx) => {
      expect(await ordo.throttles.acquire(name, { tx, key: 'k' })).toMatchObject({ granted: true });
    });
    expect(await ordo.throttles.running(name)).toEqual([]);
    expect((await ordo.throttles.state(name, 'k')).starts).toBe(0);

    const permit = await d.transaction((tx) =>
      ordo.throttles.acquire(name, { tx, key: 'k', holder: 'w"1\\' }),
    );
    if (!permit.granted) throw new Error('not granted');
    const row = async () =>
      (
        await pool.query('SELECT acquired_at, expires_at, ended_at FROM ordo.permits WHERE id = $1', [
          permit.id,
        ])
      ).rows[0];
    const first = await row();
    expect(permit.acquiredAt).toBeInstanceOf(Date);
    expect(permit.acquiredAt).toEqual(first.acquired_at);
    expect(permit.expiresAt).toEqual(first.expires_at);
    expect(permit.holder).toBe('w"1\\');
    expect(permit.id).toMatch(/^[0-9a-f-]{36}$/);

    const refused = await d.transaction((tx) => ordo.throttles.acquire(name, { tx, key: 'k' }));
    expect(refused).toMatchObject({ granted: false, reason: 'every' });
    if (refused.granted) throw new Error('granted twice');
    expect(refused.retryAfterMs).toBeGreaterThan(3_000_000);
    expect(Number.isInteger(refused.retryAfterMs)).toBe(true);

    const until = await d.transaction((tx) => permit.extend({ tx }));
    expect(until).toBeInstanceOf(Date);
    expect(until).toEqual((await row()).expires_at);
    // A boolean parameter (refund) and a text: postgres.js would read the text 'true' as false.
    const failed = await d.transaction((tx) => permit.fail(new Error('boom'), { tx, refund: true }));
    expect(failed).toEqual({
      id: permit.id,
      name,
      key: 'k',
      outcome: 'failed',
      endedAt: (await row()).ended_at,
      refunded: true,
    });
    expect(failed.endedAt).toBeInstanceOf(Date);
    const { rows } = await pool.query('SELECT error FROM ordo.permits WHERE id = $1', [permit.id]);
    expect(rows).toEqual([{ error: 'boom' }]);
    // Refunded: the next start is allowed at once.
    const again = await d.transaction((tx) => ordo.throttles.acquire(name, { tx, key: 'k' }));
    if (!again.granted) throw new Error('the refund was not given back');
    const completed = await d.transaction((tx) => again.complete({ tx }));
    expect(completed).toMatchObject({ id: again.id, outcome: 'completed', refunded: false });
  });
});

/** Parameters with every trap between a driver and PostgreSQL's text format; each comes back as text. */
const PARAMETERS = {
  text: `SELECT $1::jsonb::text AS object, $2::jsonb::text AS string, $3::jsonb::text AS number,
      $4::jsonb::text AS json_null, $5::jsonb IS NULL AS sql_null, $6::text[]::text AS texts,
      $7::jsonb[]::text AS jsons, $8::int8::text AS big, extract(epoch FROM $9::timestamptz)::text AS at,
      $10::int[]::text AS ints, $11::text[]::text AS nested, $12::boolean::text AS yes,
      $13::boolean::text AS no, $14::uuid[]::text AS uuids, $15::timestamptz[]::text AS times,
      $16::text AS plain, $17::text[]::text AS empty, $18::numeric::text AS fraction,
      '$1 -- in a literal' AS literal /* $2 in a comment */`,
  values: [
    { a: 'x"y\\z', b: [1, null], c: 'é😀', d: null },
    '"a JSON string"',
    12.5,
    'null',
    null,
    ['a,b', null, 'NULL', '', 'q"uote', 'back\\slash', '{brace}', ' space ', 'comma,'],
    ['{"a":1}', '"s"', 'null', null, '[1,"{}"]'],
    9007199254740993n,
    new Date('2026-03-29T01:30:00.123Z'),
    [1, 2, null],
    [
      ['a', 'b'],
      ['c', null],
    ],
    true,
    false,
    ['0b5e2d1c-8a4f-4c55-9b7e-3f2a1d0c9e8b', '6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b'],
    [new Date('2026-01-01T00:00:00Z'), null],
    "it's $1 -- not a comment /* nor this */",
    [],
    0.1,
  ] as unknown[],
};

/** Columns of the types ordo reads, and more: each must come back as pg gives it. */
const COLUMNS = `SELECT 9007199254740993::int8 AS big, 5::int4 AS small, 1.50::numeric AS fraction, true AS yes,
    '2026-03-29 01:30:00.123456+00'::timestamptz AS at, '2026-03-29 01:30:00.5'::timestamp AS local,
    '{"a":[1,null]}'::jsonb AS json, ARRAY['a', NULL, 'NULL']::text[] AS texts, ARRAY[1, NULL]::int8[] AS bigs,
    '0b5e2d1c-8a4f-4c55-9b7e-3f2a1d0c9e8b'::uuid AS id, NULL::text AS nothing, 'x' AS transaction_id`;

describe('each driver next to pg', () => {
  it('parameters arrive exactly as node-postgres sends them', async () => {
    const expected = (await pool.query(PARAMETERS.text, PARAMETERS.values)).rows;
    expect(expected[0]).toMatchObject({ sql_null: true, json_null: 'null', yes: 'true', no: 'false' });
    for (const d of drivers) {
      const rows = await d.transaction(
        async (tx) => (await asQueryable(tx).query(PARAMETERS.text, PARAMETERS.values)).rows,
      );
      expect({ driver: d.name, rows }).toEqual({ driver: d.name, rows: expected });
    }
  });

  it('rows come back as pg parses them wherever the driver shows column types', async () => {
    const expected = (await pool.query(COLUMNS)).rows;
    expect(expected[0].at).toBeInstanceOf(Date);
    for (const d of drivers.filter((x) => x.pgRows)) {
      const rows = await d.transaction(async (tx) => (await asQueryable(tx).query(COLUMNS)).rows);
      expect({ driver: d.name, rows }).toEqual({ driver: d.name, rows: expected });
    }
  });

  it('the adapters are the same as the objects given as they are', async () => {
    const text = 'SELECT $1::text[] AS texts, now() AS at';
    const values = [['a', null]];
    const expected = { texts: ['a', null], at: expect.any(Date) };
    expect((await sqlOf('plain').begin((tx) => fromPostgresJs(tx).query(text, values))).rows).toEqual([
      expected,
    ]);
    expect(
      (await kyselyOnPg.transaction().execute((trx) => fromKysely(trx).query(text, values))).rows,
    ).toEqual([expected]);
    const drizzle = drizzlePostgresJs({ client: sqlOf('drizzle') });
    expect((await drizzle.transaction((tx) => fromDrizzle(tx).query(text, values))).rows).toEqual([expected]);
    const reserved = await sqlOf('plain').reserve();
    try {
      expect((await fromPostgresJs(reserved).query(text, values)).rows).toEqual([expected]);
    } finally {
      reserved.release();
    }
    const nested = await drizzle.transaction((tx) =>
      tx.transaction((inner) => fromDrizzle(inner).query(text, values)),
    );
    expect(nested.rows).toEqual([expected]);
  });

  it('the one-line postgres.js adapter corrupts what it sends, and the checks above see it', async () => {
    const naive = (tx: postgres.TransactionSql): Queryable => ({
      query: async (text, values) => ({ rows: await tx.unsafe(text, values as never[]) }),
    });
    // Each jsonb[] element goes out as a JSON string: append_many's check on headers fails, misleadingly.
    const error = await sqlOf('plain')
      .begin((tx) => ordo.outbox.append('naive', MESSAGES, { tx: naive(tx) }))
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(OrdoError);
    expect(error).toMatchObject({
      code: 'invalid_argument',
      message: expect.stringContaining('headers must be a JSON object, not string'),
    });
    expect(await stored('naive')).toEqual([]);
    // Where no constraint stands in the way, the values are silently other ones.
    const text = 'SELECT $1::jsonb::text AS object, $2::jsonb::text AS json_null, $3::jsonb[]::text AS jsons';
    const values = [JSON.stringify({ a: [1, null] }), 'null', ['{"a":1}', null]];
    const sent = async (q: Queryable) => (await q.query(text, values)).rows[0];
    const expected = await sent(pool);
    expect(expected).toEqual({
      object: '{"a": [1, null]}',
      json_null: 'null',
      jsons: '{"{\\"a\\": 1}",NULL}',
    });
    expect(await sqlOf('plain').begin((tx) => sent(asQueryable(tx)))).toEqual(expected);
    expect(await sqlOf('plain').begin((tx) => sent(naive(tx)))).toEqual({
      object: '"{\\"a\\":[1,null]}"',
      json_null: '"null"',
      jsons: '{"\\"{\\\\\\"a\\\\\\":1}\\"",NULL}',
    });
  });
});

describe('a tx that is not a transaction', () => {
  const things = pgTable('things', { id: integer('id') });

  async function refused(tx: unknown, says: RegExp): Promise<void> {
    await ordo.sequences.define({ name: 'refused', ifNotExists: true });
    await ordo.throttles.define({ name: 'refused', every: '1s', ifNotExists: true });
    const calls = [
      () => ordo.sequences.next('refused', { tx: asIs(tx) }),
      () => ordo.sequences.nextMany('refused', 2, { tx: asIs(tx) }),
      () => ordo.outbox.append('refused', { type: 't', data: 1 }, { tx: asIs(tx) }),
      () => ordo.throttles.acquire('refused', { tx: asIs(tx) }),
      () => ordo.throttles.complete('0b5e2d1c-8a4f-4c55-9b7e-3f2a1d0c9e8b', { tx: asIs(tx) }),
    ];
    for (const call of calls) {
      const error = await call().catch((e: unknown) => e);
      expect(error).toBeInstanceOf(OrdoError);
      expect(error).toMatchObject({ code: 'invalid_argument', message: expect.stringMatching(says) });
    }
  }

  it('a Drizzle database (its query is a query builder) is refused with what to pass instead', async () => {
    const withSchema = drizzleNodePg({ client: pool, schema: { things } });
    expect(typeof withSchema.query.things.findMany).toBe('function');
    await refused(withSchema, /Drizzle database, not a transaction: pass the tx of db\.transaction\(/);
    await refused(drizzlePostgresJs({ client: sqlOf('drizzle') }), /Drizzle database, not a transaction/);
    // @ts-expect-error: the compiler refuses a database too (it has no rollback()).
    expect(() => fromDrizzle(withSchema)).toThrow(/Drizzle database, not a transaction/);
  });

  it('a Kysely instance outside a transaction is refused', async () => {
    await refused(
      kyselyOnPg,
      /Kysely instance, not a transaction: pass the trx of db\.transaction\(\)\.execute/,
    );
    // @ts-expect-error: the compiler refuses it too (isTransaction is not true).
    expect(() => fromKysely(kyselyOnPg)).toThrow(OrdoError);
  });

  it('a postgres.js pool (sql itself) is refused: its statements could run on any connection', async () => {
    await refused(sqlOf('plain'), /postgres\.js sql pool, not a transaction: pass the tx of sql\.begin/);
    // @ts-expect-error: the compiler refuses it too (no savepoint(), no release()).
    expect(() => fromPostgresJs(sqlOf('plain'))).toThrow(/sql\.reserve\(\)/);
  });

  it('anything else is refused with the list of what is accepted', async () => {
    const accepted = /pg Client\/PoolClient, or a transaction of postgres\.js \(sql\.begin\(\).*fromRawSql/;
    for (const tx of [{}, { query: {} }, 'BEGIN', 42, null, new Map()]) await refused(tx, accepted);
    await refused(new Map(), /\(got a Map\)/);
    expect(() => fromRawSql('SELECT 1' as never)).toThrow(OrdoError);
    expect(await ordo.sequences.next('refused')).toMatchObject({ value: 1 });
  });
});
