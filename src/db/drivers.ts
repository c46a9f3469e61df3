import { createHash } from 'node:crypto';
import pg from 'pg';
import pgUtils from 'pg/lib/utils.js';
import { describe, invalid } from '../validate.js';
import type { Queryable } from './queryable.js';

/*
 * ordo's statements were written for node-postgres: parameters in its text format, sent
 * untyped so that PostgreSQL types each one from the statement, and rows parsed by pg's
 * default parsers (int8 as a string, timestamptz as a Date, …). Other drivers serialise by
 * the type the server reports (postgres.js writes each element of a jsonb[] as a JSON string,
 * and the text 'true' for a boolean as false) and parse by their own rules (Drizzle keeps
 * timestamps as text). So every driver gets pg's parameters, and wherever the driver lets us
 * see column types, rows are parsed as pg parses them. Nothing here imports those drivers:
 * they are recognised by shape.
 */

/** A postgres.js transaction (`sql.begin`), savepoint or reserved connection (`sql.reserve()`). */
export type PostgresJsTransaction = {
  unsafe(query: string, parameters?: any[], options?: any): any;
  typed(value: any, oid: number): any;
} & ({ savepoint(...args: any[]): any } | { release(): void });

/** A Kysely transaction (`db.transaction().execute(async (trx) => …)`), on any PostgreSQL dialect. */
export interface KyselyTransaction {
  readonly isTransaction: true;
  withoutPlugins(): { executeQuery(query: any): Promise<{ rows: any[] }> };
}

/** A Drizzle transaction (`db.transaction(async (tx) => …)`) on node-postgres or postgres.js. */
export interface DrizzleTransaction {
  readonly _: { readonly session: unknown };
  rollback(): never;
}

/** What the adapters return; asQueryable takes it as it is. */
class Adapted implements Queryable {
  constructor(readonly query: (text: string, values?: unknown[]) => Promise<{ rows: any[] }>) {}
}

/** PostgreSQL's `unknown`: the server types such a parameter from the statement, as an untyped one. */
const UNKNOWN_OID = 705;

const ACCEPTED =
  'tx must be a pg Client/PoolClient, or a transaction of postgres.js (sql.begin() or sql.reserve(): ' +
  'fromPostgresJs), Kysely (db.transaction().execute(): fromKysely) or Drizzle (db.transaction(): ' +
  'fromDrizzle), or an object with query(text, values) returning { rows } (fromRawSql for a client ' +
  'that only runs SQL text, such as Prisma)';

/**
 * Any `tx` ordo accepts, as the one method ordo calls. Drizzle comes first: its `query` is a
 * query builder, not a method that runs SQL.
 */
export function recognise(tx: unknown): Queryable {
  if (tx instanceof Adapted) return tx;
  if ((typeof tx !== 'object' && typeof tx !== 'function') || tx === null) return shape(tx);
  // A transaction's connection comes back call after call (every number of a business
  // transaction, a pooled client for many): its adapter is made once. The adapters keep no
  // state but the object, and look its methods up on each call.
  let known = adapters.get(tx as object);
  if (known === undefined) {
    known = shape(tx);
    adapters.set(tx as object, known);
  }
  return known;
}

const adapters = new WeakMap<object, Queryable>();

function shape(tx: unknown): Queryable {
  const drizzle = drizzleKind(tx);
  if (drizzle) return fromDrizzle(tx as DrizzleTransaction);
  const t = tx as Record<string, unknown> | null | undefined;
  if (typeof t?.executeQuery === 'function' && 'isTransaction' in t)
    return fromKysely(tx as KyselyTransaction);
  if (typeof t?.unsafe === 'function' && typeof t.typed === 'function') {
    return fromPostgresJs(tx as PostgresJsTransaction);
  }
  if (typeof t?.query === 'function') return isPg(t) ? fromPg(t as unknown as PgClient) : (tx as Queryable);
  throw invalid(`${ACCEPTED} (got ${what(tx)})`);
}

/**
 * A parameter as node-postgres sends it, by its own prepareValue: arrays as array literals
 * (NULL elements, elements quoted and escaped), objects as JSON, a Date with its offset, a
 * bigint as digits. Booleans and numbers stay as they are, which every driver writes alike
 * (postgres.js would read the text 'true' for a boolean as false); a Buffer becomes bytea's
 * hex text, which a driver cannot mistake for a string.
 */
export function toText(value: unknown): string | number | boolean | null {
  if (typeof value === 'boolean' || typeof value === 'number') return value;
  const text = pgUtils.prepareValue(value);
  return Buffer.isBuffer(text) ? `\\x${text.toString('hex')}` : text;
}

/**
 * A postgres.js transaction, savepoint or reserved connection as ordo's `tx`. Parameters go
 * out as pg's text, declared `unknown` (postgres.js has no serialiser for that type, so the
 * text is sent as it is); rows come back raw and are parsed by column type as pg parses
 * them, whatever parsers or column transform the postgres.js instance has (Drizzle replaces
 * its timestamp parsers).
 */
export function fromPostgresJs(sql: PostgresJsTransaction): Queryable {
  const s = sql as unknown as Record<string, unknown>;
  if (typeof s?.unsafe !== 'function' || typeof s.typed !== 'function') {
    throw invalid(`fromPostgresJs needs the tx of sql.begin(async (tx) => …) (got ${what(sql)})`);
  }
  if (typeof s.savepoint !== 'function' && typeof s.release !== 'function') {
    // The pool itself: each statement could run on another connection, outside any transaction.
    throw invalid(
      'tx is a postgres.js sql pool, not a transaction: pass the tx of sql.begin(async (tx) => …) or a connection from sql.reserve()',
    );
  }
  return new Adapted(async (text, values = []) => {
    const parameters = values.map((v) => {
      const t = toText(v);
      return t === null ? null : sql.typed(String(t), UNKNOWN_OID);
    });
    const result = await sql
      .unsafe(text, parameters)
      .raw()
      .catch((e: unknown) => rethrow(e));
    return { rows: byColumnType(result.columns ?? [], result) };
  });
}

/**
 * A Kysely transaction as ordo's `tx`. Kysely hands parameters to whichever driver its
 * dialect wraps, unseen: postgres.js would serialise them again by the server's type (a JSON
 * text for a jsonb parameter becomes a JSON string). So the values are written into the
 * statement as literals (see inline), which every dialect sends as they are. Statements run
 * without the instance's plugins (a CamelCasePlugin would rename ordo's columns). Kysely
 * shows no column types: rows are as the dialect's driver parses them (with PostgresDialect,
 * pg's).
 */
export function fromKysely(trx: KyselyTransaction): Queryable {
  const t = trx as unknown as Record<string, unknown>;
  if (typeof t?.executeQuery !== 'function' || typeof t.withoutPlugins !== 'function') {
    throw invalid(
      `fromKysely needs the trx of db.transaction().execute(async (trx) => …) (got ${what(trx)})`,
    );
  }
  if (t.isTransaction !== true) {
    throw invalid(
      'tx is a Kysely instance, not a transaction: pass the trx of db.transaction().execute(async (trx) => …)',
    );
  }
  const plain = trx.withoutPlugins();
  return new Adapted(async (text, values = []) => {
    const sql = inline(text, values);
    const { rows } = await plain
      .executeQuery({
        sql,
        parameters: [],
        query: { kind: 'RawNode', sqlFragments: [sql], parameters: [] },
        queryId: { queryId: 'ordo' },
      })
      .catch((e: unknown) => rethrow(e));
    return { rows: rows.map(snakeKeys) };
  });
}

/**
 * A Drizzle transaction as ordo's `tx`: its connection (a pg client or a postgres.js
 * transaction) is used as that driver's, below Drizzle's own type parsers.
 */
export function fromDrizzle(tx: DrizzleTransaction): Queryable {
  const kind = drizzleKind(tx);
  if (kind === 'database') {
    throw invalid(
      'tx is a Drizzle database, not a transaction: pass the tx of db.transaction(async (tx) => …)',
    );
  }
  const client = (tx as { _?: { session?: { client?: unknown } } } | undefined)?._?.session?.client;
  if (kind !== 'transaction' || !client) {
    throw invalid(`fromDrizzle needs the tx of db.transaction(async (tx) => …) (got ${what(tx)})`);
  }
  return recognise(client);
}

/**
 * For a client that can only run a SQL text, such as Prisma's `$queryRawUnsafe` in an
 * interactive transaction (Prisma types its parameters itself: a text for a uuid parameter
 * fails). Each `$n` is replaced by pg's text of the value as a quoted literal, which
 * PostgreSQL types from the statement exactly as it types an untyped parameter; `run`
 * returns the rows (int8 as a string, number or bigint, timestamps as Dates or text).
 */
export function fromRawSql(run: (text: string) => Promise<readonly object[]>): Queryable {
  if (typeof run !== 'function')
    throw invalid(`fromRawSql needs a function (text) => rows (got ${what(run)})`);
  return new Adapted(async (text, values = []) => {
    const rows = await run(inline(text, values));
    return { rows: rows.map((r) => snakeKeys(r as Record<string, unknown>)) };
  });
}

/** Quoted texts and names, comments and dollar-quoted bodies pass unchanged; `$n` outside them is replaced. */
const SQL_PARTS =
  /'(?:[^']|'')*'|"(?:[^"]|"")*"|--[^\n]*|\/\*[\s\S]*?\*\/|(\$(?:[A-Za-z_]\w*)?\$)[\s\S]*?\1|\$(\d+)/g;

/** The statement with its parameters written in as literals. */
export function inline(text: string, values: readonly unknown[]): string {
  return text.replace(SQL_PARTS, (part, _tag, n: string | undefined) => {
    if (n === undefined) return part;
    const i = Number(n) - 1;
    if (i >= values.length) throw new Error(`The statement uses $${n} but has ${values.length} values`);
    const t = toText(values[i]);
    return t === null ? 'NULL' : pg.escapeLiteral(String(t));
  });
}

/** pg's Client and PoolClient carry connectionParameters, its Pool the Client class it makes. */
function isPg(x: Record<string, unknown>): boolean {
  return (
    typeof x.connect === 'function' &&
    (typeof x.connectionParameters === 'object' || typeof x.Client === 'function')
  );
}

interface PgClient {
  query(config: PgConfig, values?: unknown[]): Promise<{ rows: any[] }>;
}

interface PgConfig {
  name?: string;
  text: string;
  types: typeof pg.types;
}

/** A pg client with pg's default parsers, even when its pool was given other `types`. */
class PgAdapted extends Adapted {
  constructor(readonly client: PgClient) {
    super((text, values) => client.query(pgConfig(text), values));
  }
}

function fromPg(client: PgClient): Queryable {
  return new PgAdapted(client);
}

/**
 * `db.query` as a named prepared statement when `db` is node-postgres (a pool, a client, or a
 * client given as `tx`): pg parses it on each connection once, and then sends only its name
 * and parameters. Undefined for every other driver (postgres.js prepares by its own `prepare`
 * setting).
 */
export function queryPrepared(
  db: Queryable,
  text: string,
  values: unknown[],
): Promise<{ rows: any[] }> | undefined {
  const client =
    db instanceof PgAdapted
      ? db.client
      : isPg(db as unknown as Record<string, unknown>)
        ? (db as unknown as PgClient)
        : undefined;
  return client?.query(pgConfig(text, true), values);
}

/**
 * pg copies a query config's own properties one by one (cloneQueryConfig, through property
 * descriptors), which costs more than the rest of a short query in Node; a config whose text
 * and types are on its prototype is copied for nothing. One prototype per statement text, and
 * one with a name drawn from the text for a prepared statement, so that one text has one name
 * on every connection (pg refuses a name reused for another text). ordo sends a few dozen
 * texts: past MAX_CONFIGS a text gets a plain object, unnamed (a server keeps every statement
 * prepared on a connection until it closes).
 */
const configs = new Map<string, { plain: PgConfig; named: PgConfig }>();
const MAX_CONFIGS = 1000;

function pgConfig(text: string, prepared = false): PgConfig {
  let shared = configs.get(text);
  if (shared === undefined) {
    const plain = { text, types: pg.types };
    if (configs.size >= MAX_CONFIGS) return plain;
    const name = `ordo_${createHash('sha256').update(text).digest('hex').slice(0, 24)}`;
    shared = { plain, named: { ...plain, name } };
    configs.set(text, shared);
  }
  return Object.create(prepared ? shared.named : shared.plain) as PgConfig;
}

/** Raw rows (each value the server's text, or null) parsed by column type as pg parses them. */
function byColumnType(
  columns: readonly { name: string; type: number }[],
  raw: readonly (readonly (Buffer | null)[])[],
): Record<string, unknown>[] {
  const names = columns.map((c) => snakeCase(c.name));
  const parsers = columns.map((c) => pg.types.getTypeParser(c.type, 'text') as (text: string) => unknown);
  return raw.map((values) => {
    const row: Record<string, unknown> = {};
    values.forEach((v, i) => {
      row[names[i]!] = v === null ? null : parsers[i]!(v.toString('utf8'));
    });
    return row;
  });
}

/**
 * ordo names its columns in lower snake_case; a driver option may rename them (postgres.js's
 * transform: camel, pascal or kebab case), and this undoes it.
 */
function snakeCase(name: string): string {
  if (!/[A-Z-]/.test(name)) return name;
  return name
    .replaceAll('-', '_')
    .replace(/(?<=[a-z0-9])[A-Z]/g, (c) => `_${c}`)
    .toLowerCase();
}

function snakeKeys(row: Record<string, unknown>): Record<string, unknown> {
  const keys = Object.keys(row);
  if (keys.every((k) => snakeCase(k) === k)) return row;
  return Object.fromEntries(keys.map((k) => [snakeCase(k), row[k]]));
}

/** postgres.js names the table of an error table_name; ordo reads pg's name. */
function rethrow(error: unknown): never {
  const e = error as { table?: unknown; table_name?: unknown } | null;
  if (e && typeof e === 'object' && e.table === undefined && e.table_name !== undefined) {
    Object.defineProperty(e, 'table', { value: e.table_name });
  }
  throw error;
}

const DRIZZLE_KIND = Symbol.for('drizzle:entityKind');

/** Drizzle marks its classes with an entity kind; a transaction's class descends from PgTransaction. */
function drizzleKind(x: unknown): 'transaction' | 'database' | undefined {
  if (typeof x !== 'object' || x === null) return undefined;
  let kind: 'database' | undefined;
  for (let c = x.constructor as unknown; typeof c === 'function'; c = Object.getPrototypeOf(c)) {
    const k = (c as unknown as Record<symbol, unknown>)[DRIZZLE_KIND];
    if (k === 'PgTransaction') return 'transaction';
    if (k === 'PgDatabase') kind = 'database';
  }
  return kind;
}

function what(x: unknown): string {
  if (typeof x !== 'object' || x === null) return describe(x);
  const name = (x.constructor as { name?: unknown } | undefined)?.name;
  return typeof name === 'string' && name !== 'Object'
    ? `a ${name}`
    : 'an object without query(text, values)';
}
