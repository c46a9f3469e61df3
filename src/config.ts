import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import { parseConnectionString } from './db/connection-string.js';
import { durationOption } from './durations.js';
import { boolean, describe, identifier, invalid, knownKeys, plainObject, safeInteger } from './validate.js';

export interface EmbeddedOptions {
  /** Where the embedded PostgreSQL keeps its data; created on first use. Default `./.ordo/pg`. */
  dataDir?: string;
}

export interface OrdoOptions {
  /**
   * A PostgreSQL URL, read as libpq reads it: it may name several hosts
   * (`postgres://h1:5432,h2:5432/db?target_session_attrs=read-write`), and then every new
   * connection tries them in turn until one gives a session target_session_attrs accepts
   * (read-write or primary; ordo refuses a URL that asks for a standby). `sslmode` has libpq's
   * meaning (`prefer` falls back to a plain session, `require` does not check the certificate).
   * Default: `ORDO_DATABASE_URL`, then `DATABASE_URL`.
   */
  databaseUrl?: string;
  /** A `pg` pool of your own; ordo never ends it. */
  pool?: pg.Pool;
  /** Schema holding ordo's tables and functions. Default `ORDO_SCHEMA`, then `ordo`. */
  schema?: string;
  /** This instance's node id (a UUID); random by default. */
  nodeId?: string;
  /** Start (or reuse) an embedded PostgreSQL instead of connecting to a URL. */
  embedded?: boolean | EmbeddedOptions;
  /** Apply pending migrations at start (default true). When false, an out-of-date schema is refused. */
  migrate?: boolean;
  /** Connections in the pool ordo creates (default 10). */
  poolSize?: number;
  /**
   * A direct PostgreSQL URL (read as databaseUrl is) for the one LISTEN connection, when `databaseUrl` goes through a
   * pooler in transaction mode (PgBouncer, Supabase, Neon), where notifications are lost.
   * Default `ORDO_LISTEN_URL`; without it, LISTEN takes the same route as every query.
   */
  listenUrl?: string;
  /** How long opening a connection, or waiting for a free one in ordo's pool, may take (default '10s'). */
  connectTimeout?: string | number;
  /**
   * How long one statement on ordo's pool may take before it is abandoned with `timeout` and
   * its connection closed (default '30s'): a frozen database cannot hold a request forever.
   */
  statementTimeout?: string | number;
  /** Where ordo reports what it notices (lost notifications); default: warnings go to process.emitWarning. */
  log?: Log;
  /**
   * Send ordo's statements on node-postgres connections (ordo's pool, and a pg client given as
   * `tx`) as named prepared statements, parsed and planned once per connection instead of for
   * every call (default false). Leave it off behind a pooler in transaction mode (PgBouncer
   * before 1.21 or without `max_prepared_statements`, Supabase's port 6543, Neon's `-pooler`
   * host): there the next transaction may run on a server connection that never saw the
   * statement, which fails with `prepared_statement_missing`.
   */
  prepare?: boolean;
}

export interface LogEntry {
  level: 'info' | 'warn';
  /** Stable, for warnings a program may react to (`notifications_lost`). */
  code?: string;
  message: string;
}

export type Log = (entry: LogEntry) => void;

const defaultLog: Log = (entry) => {
  if (entry.level === 'warn') process.emitWarning(entry.message, { type: 'OrdoWarning', code: entry.code });
};

export type DatabaseSource =
  { kind: 'url'; url: string } | { kind: 'pool'; pool: pg.Pool } | { kind: 'embedded'; dataDir: string };

export interface Config {
  source: DatabaseSource;
  schema: string;
  nodeId: string;
  migrate: boolean;
  poolSize: number;
  listenUrl: string | undefined;
  log: Log;
  connectTimeoutMs: number;
  statementTimeoutMs: number;
  prepare: boolean;
}

const OPTION_KEYS = [
  'databaseUrl',
  'pool',
  'schema',
  'nodeId',
  'embedded',
  'migrate',
  'poolSize',
  'listenUrl',
  'log',
  'connectTimeout',
  'statementTimeout',
  'prepare',
] as const;
const HOUR_MS = 3_600_000;
const DAY_MS = 86_400_000;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** Validates createOrdo's options once, with messages that say what to change. */
export function resolveConfig(options: OrdoOptions = {}, env: NodeJS.ProcessEnv = process.env): Config {
  const o = plainObject('createOrdo options', options);
  knownKeys('createOrdo', o, OPTION_KEYS);
  const schema = identifier('schema', options.schema ?? (env.ORDO_SCHEMA || 'ordo'));
  const nodeId = options.nodeId ?? randomUUID();
  if (typeof nodeId !== 'string' || !UUID.test(nodeId)) {
    throw invalid(`nodeId must be a UUID (got ${describe(nodeId)})`);
  }
  const migrate = boolean('migrate', options.migrate ?? true);
  const poolSize = safeInteger('poolSize', options.poolSize ?? 10, 1, 1000);
  const listenUrl = options.listenUrl ?? (env.ORDO_LISTEN_URL || undefined);
  // Read here to refuse a bad one at once; createOrdo reads it again (parsing is pure).
  if (listenUrl !== undefined) parseConnectionString('listenUrl', listenUrl);
  if (options.log !== undefined && typeof options.log !== 'function') {
    throw invalid('log must be a function ({ level, code, message }) => void');
  }
  return {
    source: resolveSource(options, env),
    schema,
    nodeId: nodeId.toLowerCase(),
    migrate,
    poolSize,
    listenUrl,
    log: options.log ?? defaultLog,
    connectTimeoutMs: durationOption('connectTimeout', options.connectTimeout ?? '10s', 100, HOUR_MS),
    statementTimeoutMs: durationOption('statementTimeout', options.statementTimeout ?? '30s', 100, DAY_MS),
    prepare: boolean('prepare', options.prepare ?? false),
  };
}

function resolveSource(options: OrdoOptions, env: NodeJS.ProcessEnv): DatabaseSource {
  const given = [options.databaseUrl !== undefined, options.pool !== undefined, !!options.embedded];
  if (given.filter(Boolean).length > 1) {
    throw invalid('give only one of databaseUrl, pool and embedded');
  }
  if (options.pool !== undefined) {
    if (typeof (options.pool as { connect?: unknown })?.connect !== 'function') {
      throw invalid('pool must be a pg.Pool');
    }
    return { kind: 'pool', pool: options.pool };
  }
  if (options.embedded) {
    const e = options.embedded === true ? {} : plainObject('embedded', options.embedded);
    knownKeys('embedded', e, ['dataDir']);
    const dataDir = (e as EmbeddedOptions).dataDir ?? '.ordo/pg';
    if (typeof dataDir !== 'string' || dataDir === '') {
      throw invalid(`embedded.dataDir must be a directory path (got ${describe(dataDir)})`);
    }
    return { kind: 'embedded', dataDir };
  }
  const url = options.databaseUrl ?? envDatabaseUrl(env);
  if (url === undefined) {
    throw invalid(
      'no database given: pass databaseUrl, pool or embedded: true, or set ORDO_DATABASE_URL or DATABASE_URL',
    );
  }
  parseConnectionString('databaseUrl', url);
  return { kind: 'url', url };
}

/** ORDO_DATABASE_URL, then DATABASE_URL; an empty variable counts as unset. */
export function envDatabaseUrl(env: NodeJS.ProcessEnv = process.env): string | undefined {
  return env.ORDO_DATABASE_URL || env.DATABASE_URL || undefined;
}
