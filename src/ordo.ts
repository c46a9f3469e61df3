import pg from 'pg';
import { type Config, type OrdoOptions, resolveConfig } from './config.js';
import { type EmbeddedServer, startEmbedded } from './db/embedded.js';
import { clientLike, guardClient, hearClientErrors } from './db/clients.js';
import { describeHost, parseConnectionString } from './db/connection-string.js';
import {
  hostMemoryOf,
  MultiHostClient,
  type MultiHostConfig,
  multiHostConfig,
} from './db/multi-host-client.js';
import { InFlight } from './db/in-flight.js';
import { migrate, quoteIdent } from './db/migrations.js';
import { Notifications, type NotificationStatus } from './db/notifications.js';
import { closedError, neverSent, toOrdoError } from './errors.js';
import { Outbox } from './outbox/outbox.js';
import { outboxPlans } from './outbox/plans.js';
import { executeQuery, type StatementResult } from './query/executor.js';
import { sequencePlans } from './sequences/plans.js';
import { type NextOptions, Sequences } from './sequences/sequences.js';
import { Throttles } from './throttles/throttles.js';

const MAINTAIN_EVERY_MS = 3_600_000;

/** Which database a client uses; never its password. */
export type DatabaseInfo =
  | {
      kind: 'embedded';
      dataDir: string;
      host: string;
      port: number;
      /** This start initialised the data directory. */
      created: boolean;
      /** A server left running by a killed process was reused. */
      adopted: boolean;
    }
  | {
      kind: 'url';
      /** The first host of the URL (a Unix socket directory starts with `/`). */
      host: string;
      port: number;
      /** Every host of the URL, in its order: each new connection takes the first that will do. */
      hosts: { host: string; port: number }[];
      database: string;
      user: string;
    }
  | { kind: 'pool' };

/** The ordo client: owns the pool (unless given one) and wires the modules to it. */
export class Ordo {
  readonly sequences: Sequences;
  readonly throttles: Throttles;
  readonly outbox: Outbox;
  readonly schema: string;
  readonly nodeId: string;
  /** Which database this client uses (embedded: where and on which port). */
  readonly database: DatabaseInfo;
  private closing: Promise<void> | undefined;
  private closed = false;
  private readonly inFlight: InFlight;
  private readonly listener: Notifications;
  private readonly givenUrl: string | undefined;
  private readonly maintainStatement: string;
  private readonly maintenance: NodeJS.Timeout;

  /** @internal Use createOrdo(). */
  constructor(
    config: Config,
    private readonly pool: pg.Pool,
    private readonly ownsPool: boolean,
    private readonly embedded: EmbeddedServer | undefined,
    listen: MultiHostConfig | undefined,
  ) {
    this.givenUrl = config.source.kind === 'url' ? config.source.url : undefined;
    this.schema = config.schema;
    this.nodeId = config.nodeId;
    this.database = describeDatabase(config, embedded);
    this.inFlight = new InFlight(pool, config.connectTimeoutMs, config.prepare);
    this.maintainStatement = `SELECT what, deleted FROM ${quoteIdent(config.schema)}.maintain()`;
    this.maintenance = setInterval(() => void this.maintain().catch(() => undefined), MAINTAIN_EVERY_MS);
    this.maintenance.unref();
    this.listener = new Notifications(
      () => (listen === undefined ? clientLike(pool) : new MultiHostClient(listen)),
      (channel, payload) => pool.query('SELECT pg_notify($1, $2)', [channel, payload]),
      listen === undefined ? 'database' : 'listenUrl',
      config.log,
    );
    this.sequences = new Sequences(
      pool,
      sequencePlans(config.schema),
      (withTx) => this.ensureOpen(withTx),
      this.inFlight,
      config.nodeId,
      () => this.closing !== undefined,
      this.listener,
    );
    this.outbox = new Outbox(
      pool,
      outboxPlans(config.schema),
      (withTx) => this.ensureOpen(withTx),
      this.inFlight,
      this.listener,
    );
    this.throttles = new Throttles(
      pool,
      config.schema,
      (withTx) => this.ensureOpen(withTx),
      this.inFlight,
      config.nodeId,
      this.listener,
    );
  }

  /**
   * Runs `fn` in a transaction on one of ordo's connections: committed when `fn` resolves,
   * rolled back when it throws. Pass `tx` to ordo's calls and run your own statements on it.
   */
  async transaction<T>(fn: (tx: pg.PoolClient) => Promise<T>): Promise<T> {
    this.ensureOpen();
    return this.inFlight.track(this.inTransaction(fn));
  }

  private async inTransaction<T>(fn: (tx: pg.PoolClient) => Promise<T>): Promise<T> {
    // Nothing has run until BEGIN succeeds: a server restarting, or a connection cut as it was
    // taken or while it began, is waited out on another connection within connectTimeout.
    const { client, guard } = await this.inFlight
      .retry(
        () => this.begin(),
        undefined,
        (e) => neverSent(e) || toOrdoError(e).code === 'database_unavailable',
      )
      .catch((e: unknown) => {
        throw toOrdoError(e);
      });
    let broken = false;
    try {
      const result = await fn(client);
      // A commit can fail on ordo's account (a sequence attached at commit is exhausted): say
      // so as an OrdoError. What fn throws is the caller's and passes through as it is.
      await client.query('COMMIT').catch((e: unknown) => {
        throw toOrdoError(e);
      });
      return result;
    } catch (e) {
      await client.query('ROLLBACK').catch(() => {
        broken = true;
      });
      throw e;
    } finally {
      guard.release(broken);
    }
  }

  private async begin(): Promise<{ client: pg.PoolClient; guard: ReturnType<typeof guardClient> }> {
    const client = await this.pool.connect();
    const guard = guardClient(client);
    try {
      await client.query('BEGIN');
      return { client, guard };
    } catch (e) {
      guard.release(true);
      throw e;
    }
  }

  /**
   * Deletes what nothing needs any more (idempotency keys past a day, permits ended a day ago,
   * range ownership rows of a week ago), in bounded steps; every client does it once an hour,
   * one at a time. Returns what was deleted.
   */
  async maintain(): Promise<{ what: string; deleted: number }[]> {
    this.ensureOpen();
    const { rows } = await this.inFlight.query(this.pool, this.maintainStatement, []);
    return rows.map((r) => ({ what: r.what, deleted: Number(r.deleted) }));
  }

  /**
   * The host ordo's pool connected to last (`host:port`, or a socket folder): with several
   * hosts in the URL, the primary in use. Undefined for a pool of yours, or before the first
   * connection.
   */
  server(): string | undefined {
    const host = hostMemoryOf(this.pool)?.last;
    return host === undefined ? undefined : describeHost(host.host, host.port);
  }

  /** One round trip to the database, in milliseconds; `database_unavailable` when it does not answer. */
  async ping(): Promise<number> {
    this.ensureOpen();
    const started = performance.now();
    // Not retried: a readiness probe wants the answer now, not after connectTimeout.
    await this.inFlight.query(this.pool, 'SELECT 1', [], 0);
    return Math.round((performance.now() - started) * 10) / 10;
  }

  /**
   * Whether notifications reach this client: LISTEN wakes outbox consumers and tells nodes of
   * redefinitions. Behind a pooler in transaction mode they are lost: ordo then polls often and
   * this says so (give `listenUrl` a direct route). Waits for the first probe's answer.
   */
  notifications(): Promise<NotificationStatus> {
    this.ensureOpen();
    return this.listener.status();
  }

  /** The next value of a sequence, as a number. */
  async nextval(name: string, options?: NextOptions): Promise<number> {
    // Batched values already in memory: no validation, lookup or I/O beyond a map read.
    if (options === undefined && this.closing === undefined) {
      const value = this.sequences.handOutNow(name);
      if (value !== undefined) return value;
    }
    return (await this.sequences.next(name, options)).value;
  }

  /**
   * After close() is called, calls on ordo's own pool are refused; a call that brings its own
   * `tx` (say, inside a transaction() that began earlier) may finish until the pool has ended.
   */
  private ensureOpen(withTx = false): void {
    if (this.closed || (this.closing && !withTx)) throw closedError();
  }

  /**
   * Runs SurrealQL-compatible statements (DEFINE / ALTER / REMOVE SEQUENCE, sequence::nextval,
   * INFO FOR DB), one entry per statement: `{ result }` or `{ error, code }`.
   */
  query(text: string): Promise<StatementResult[]> {
    return executeQuery(this, text);
  }

  /**
   * A URL to connect to the database with psql or another tool: for an embedded PostgreSQL,
   * with its generated password (keep it to yourself); otherwise the URL ordo was given.
   */
  connectionUrl(): string | undefined {
    return this.embedded?.url ?? this.givenUrl;
  }

  /** Answers the calls in flight, then ends the pool it created and the embedded server. */
  close(): Promise<void> {
    this.closing ??= (async () => {
      await this.outbox.close();
      await this.sequences.idle();
      await this.inFlight.idle();
      await this.sequences.close();
      await this.throttles.close();
      await this.listener.stop();
      clearInterval(this.maintenance);
      this.closed = true;
      if (this.ownsPool) await this.pool.end();
      await this.embedded?.stop();
    })();
    return this.closing;
  }
}

function describeDatabase(config: Config, embedded: EmbeddedServer | undefined): DatabaseInfo {
  if (embedded) {
    const { dataDir, port, created, adopted } = embedded;
    return { kind: 'embedded', dataDir, host: '127.0.0.1', port, created, adopted };
  }
  if (config.source.kind !== 'url') return { kind: 'pool' };
  // Only what a person needs to recognise the database: never the password.
  const { hosts, database, user } = parseConnectionString('databaseUrl', config.source.url);
  return {
    kind: 'url',
    host: hosts[0]!.host,
    port: hosts[0]!.port,
    hosts: hosts.map(({ host, port }) => ({ host, port })),
    database: database ?? user ?? '',
    user: user ?? '',
  };
}

export async function createOrdo(options: OrdoOptions = {}): Promise<Ordo> {
  const config = resolveConfig(options);
  const { source } = config;
  // Made once, before anything is started (it reads certificate files): every LISTEN
  // connection, reconnections included, shares its host memory.
  const listen =
    config.listenUrl === undefined
      ? undefined
      : multiHostConfig('listenUrl', parseConnectionString('listenUrl', config.listenUrl), {
          application_name: 'ordo listen',
          connectionTimeoutMillis: config.connectTimeoutMs,
        });
  const embedded = source.kind === 'embedded' ? await startEmbedded(source.dataDir) : undefined;
  const [label, url] =
    source.kind === 'url' ? ['databaseUrl', source.url] : ['the embedded URL', embedded?.url];
  // Every URL, one host or several, is read and connected to as libpq would (multi-host-client.ts).
  const pool =
    source.kind === 'pool'
      ? source.pool
      : new pg.Pool(
          multiHostConfig(label, parseConnectionString(label, url), {
            max: config.poolSize,
            application_name: 'ordo',
            connectionTimeoutMillis: config.connectTimeoutMs,
            // Client-side, so that it also holds behind a pooler (which refuses statement_timeout
            // as a startup parameter); the connection of a statement cut short is closed.
            query_timeout: config.statementTimeoutMs,
          }),
        );
  const ownsPool = source.kind !== 'pool';
  const memory = hostMemoryOf(pool);
  if (memory && memory.hosts.length > 1) {
    // Said once per move: every connection opened after it goes to the new host.
    memory.onMove = (from, to) =>
      config.log({
        level: 'warn',
        code: 'primary_moved',
        message:
          `${describeHost(to.host, to.port)} is the host that accepts ordo's sessions now, ` +
          `in place of ${describeHost(from.host, from.port)}: a failover (connections to the old host are closed as they fail)`,
      });
  }
  // A connection that dies (server restart), idle or just handed out, must not crash the
  // process; the next query gets a fresh connection and reports its own error.
  if (ownsPool) {
    pool.on('error', () => undefined);
    hearClientErrors(pool);
  }
  try {
    await migrate(pool, config.schema, config.migrate);
  } catch (e) {
    if (ownsPool) await pool.end().catch(() => undefined);
    await embedded?.stop().catch(() => undefined);
    throw e;
  }
  return new Ordo(config, pool, ownsPool, embedded, listen);
}
