/**
 * A node-postgres Client that connects as libpq does to a URL naming several hosts: hosts in
 * turn, each with the tries its sslmode asks for (ssl-mode.ts), until a session is one that
 * target_session_attrs accepts (target-session.ts). Every new connection is checked so; the
 * host of the last accepted session is tried first by the next one.
 *
 * A pg.Client connects once, and pg.Pool needs the very Client it made to be the one that
 * connected. Checking a host with a short-lived client of its own and then connecting the
 * pool's would open two sessions for every one kept, and a failover between the two would
 * hand out a session nobody checked. So each try runs on this client itself: before a try it
 * is re-initialised from a fresh pg.Client for that host (every own property but its event
 * listeners), and a try that fails has its connection's listeners removed before it is
 * closed, so nothing of it reaches this client's listeners. The session that passes the check
 * is the one kept: one session per connection, checked where it is used.
 */
import { EventEmitter } from 'node:events';
import type { Duplex } from 'node:stream';
import pg from 'pg';
import { type ConnectionTarget, describeHost, type HostAddress } from './connection-string.js';
import { type TlsTry, tlsTries } from './ssl-mode.js';
import { sessionRefusal } from './target-session.js';

/**
 * The host tried first by the next connection: the one that gave the last accepted session.
 * A failover moves it when a session on another host is accepted; forget() makes the next
 * connection try the hosts in the URL's order again (for a caller that learnt the primary
 * moved).
 */
export class HostMemory {
  #last: HostAddress | undefined;
  /** Told once per move of the accepted session to another host: a failover, seen by ordo. */
  onMove: ((from: HostAddress, to: HostAddress) => void) | undefined;

  constructor(readonly hosts: readonly HostAddress[]) {}

  get last(): HostAddress | undefined {
    return this.#last;
  }

  /** The hosts in the order the next connection tries them. */
  order(): HostAddress[] {
    const last = this.#last;
    return last === undefined ? [...this.hosts] : [last, ...this.hosts.filter((h) => h !== last)];
  }

  remember(host: HostAddress): void {
    const from = this.#last;
    this.#last = host;
    if (from !== undefined && from !== host) this.onMove?.(from, host);
  }

  forget(): void {
    this.#last = undefined;
  }
}

/** What every client made for one URL shares. */
export interface MultiHostSettings {
  target: ConnectionTarget;
  /** Names the URL in messages: `databaseUrl`, `listenUrl`. */
  label: string;
  tls: TlsTry[];
  memory: HostMemory;
}

export type MultiHostConfig = pg.ClientConfig & { multiHost: MultiHostSettings };

/**
 * The options of a pool (or of one client) on `target`, with `options` (pool size, timeouts,
 * application_name…) for every session. pg.Pool hands its options to each Client it makes, and
 * clientLike() makes one with them too, so every client of the pool shares the host memory.
 * Reads the certificate files the URL names.
 */
export function multiHostConfig(
  label: string,
  target: ConnectionTarget,
  options: pg.PoolConfig = {},
): pg.PoolConfig & MultiHostConfig {
  return {
    ...options,
    Client: MultiHostClient as unknown as new () => pg.ClientBase,
    multiHost: { target, label, tls: tlsTries(label, target), memory: new HostMemory(target.hosts) },
  };
}

/** The host memory of a pool made with multiHostConfig(); undefined for any other pool. */
export function hostMemoryOf(pool: pg.Pool): HostMemory | undefined {
  return (pool as unknown as { options: Partial<MultiHostConfig> }).options.multiHost?.memory;
}

/**
 * Which host gives, now, a session the URL of a pool made with multiHostConfig() accepts: one
 * session is opened as the pool opens its own (the remembered host first; forget() it before to
 * try the hosts in the URL's order), read and closed. Undefined for any other pool.
 */
export async function currentHost(pool: pg.Pool): Promise<HostAddress | undefined> {
  const options = (pool as unknown as { options: Partial<MultiHostConfig> }).options;
  if (options.multiHost === undefined) return undefined;
  const client = new MultiHostClient(options as MultiHostConfig);
  client.on('error', () => undefined);
  await client.connect();
  try {
    return client.connectedTo;
  } finally {
    await client.end().catch(() => undefined);
  }
}

/** A connection's events and stream: what a try needs of pg's Connection. */
type Connection = EventEmitter & { stream: Duplex; end(): void };

interface Failure {
  host: HostAddress;
  error: Error;
  /** The server answered (TCP connected): another TLS try on the same host may do. */
  reached: boolean;
  /** The session was made and refused by target_session_attrs: no other try on this host will do. */
  refused?: boolean;
}

/** Own properties of every EventEmitter: they hold a client's listeners and stay across tries. */
const EMITTER_KEYS = new Set(Reflect.ownKeys(new EventEmitter()));

export class MultiHostClient extends pg.Client {
  readonly #settings: MultiHostSettings;
  readonly #shared: pg.ClientConfig;
  #connecting: Promise<void> | undefined;
  #connectedTo: HostAddress | undefined;
  /** While trying hosts: what a try's connection says ('connect', 'end', 'error') is not this client's. */
  #quiet = false;
  #ended = false;

  constructor(config: MultiHostConfig) {
    const shared = sharedConfig(config);
    const settings = config.multiHost;
    super(sessionConfig(shared, settings.target, settings.memory.order()[0]!, settings.tls[0], 0));
    this.#settings = settings;
    this.#shared = shared;
  }

  /** The host of this client's session, once connected. */
  get connectedTo(): HostAddress | undefined {
    return this.#connectedTo;
  }

  override connect(): Promise<pg.Client>;
  override connect(callback: ((err: Error) => void) | ((err: null, c: pg.Client) => void)): void;
  override connect(
    callback?: ((err: Error) => void) | ((err: null, c: pg.Client) => void),
  ): Promise<pg.Client> | void {
    const done =
      this.#connecting === undefined
        ? (this.#connecting = this.#connectToOne())
        : Promise.reject(new Error('Client has already been connected. You cannot reuse a client.'));
    if (!callback) return done.then(() => this);
    const reply = callback as (err: Error | null, client?: pg.Client) => void;
    done.then(
      () => reply(null, this),
      (e: unknown) => reply(e as Error),
    );
  }

  override end(): Promise<void>;
  override end(callback: (err: Error) => void): void;
  override end(callback?: (err: Error) => void): Promise<void> | void {
    this.#ended = true;
    if (this.#connectedTo !== undefined) return callback ? super.end(callback) : super.end();
    // Not connected: a try under way is cut short, and its caller hears that the client ended.
    let done = Promise.resolve();
    if (this.#connecting !== undefined) {
      (this.connection as unknown as Connection).stream.destroy();
      done = this.#connecting.then(
        () => undefined,
        () => undefined,
      );
    }
    if (!callback) return done;
    void done.then(() => (callback as () => void)());
  }

  override emit(event: string | symbol, ...args: unknown[]): boolean {
    if (this.#quiet && (event === 'connect' || event === 'end' || event === 'error')) return false;
    return super.emit(event, ...args);
  }

  async #connectToOne(): Promise<void> {
    const { target, tls, memory } = this.#settings;
    const budget = this.#shared.connectionTimeoutMillis ?? 0;
    const deadline = budget > 0 ? Date.now() + budget : Infinity;
    const failures: Failure[] = [];
    const untried: HostAddress[] = [];
    this.#quiet = true;
    try {
      for (const host of memory.order()) {
        for (const ssl of tls) {
          if (this.#ended) throw new Error('Connection terminated');
          const left = deadline - Date.now();
          if (left <= 0) {
            if (!failures.some((f) => f.host === host)) untried.push(host);
            break;
          }
          const failure = await this.#try(host, ssl, Math.min(left, target.connectTimeoutMs ?? Infinity));
          if (failure === undefined) {
            memory.remember(host);
            this.#connectedTo = host;
            return;
          }
          failures.push(failure);
          if (!failure.reached || failure.refused) break;
        }
      }
      if (this.#ended) throw new Error('Connection terminated');
      throw noSession(this.#settings, failures, untried);
    } finally {
      this.#quiet = false;
      if (this.#connectedTo !== undefined) this.emit('connect');
    }
  }

  /** One session on `host`; undefined when it is made and accepted, else why not. */
  async #try(host: HostAddress, ssl: TlsTry, timeoutMs: number): Promise<Failure | undefined> {
    this.#aim(host, ssl, timeoutMs);
    const connection = this.connection as unknown as Connection;
    let reached = false;
    connection.once('connect', () => (reached = true));
    const reported = new Map<string, string>();
    connection.on('parameterStatus', (m: { parameterName: string; parameterValue: string }) =>
      reported.set(m.parameterName, m.parameterValue),
    );
    try {
      await new Promise<void>((resolve, reject) =>
        super.connect((e: Error | null) => (e ? reject(e) : resolve())),
      );
    } catch (e) {
      drop(connection, false);
      return { host, error: asError(e), reached };
    }
    let refusal: string | undefined;
    try {
      refusal = await sessionRefusal(
        this.#settings.target.targetSessionAttrs,
        reported,
        async (sql) => (await this.query({ text: sql, rowMode: 'array' })).rows[0]?.[0],
      );
    } catch (e) {
      drop(connection, false);
      return { host, error: asError(e), reached: true, refused: true };
    }
    if (refusal === undefined) return undefined;
    drop(connection, true);
    return { host, error: new Error(refusal), reached: true, refused: true };
  }

  /** Makes this client a new, unconnected one for `host`, keeping its listeners. */
  #aim(host: HostAddress, ssl: TlsTry, timeoutMs: number): void {
    const fresh = new pg.Client(sessionConfig(this.#shared, this.#settings.target, host, ssl, timeoutMs));
    const keys = new Set(Reflect.ownKeys(fresh));
    // What the last try left that a new client has not (readyForQuery, its callback, timers).
    for (const key of Reflect.ownKeys(this)) {
      if (!keys.has(key) && !EMITTER_KEYS.has(key)) delete (this as Record<string | symbol, unknown>)[key];
    }
    for (const key of keys) {
      if (EMITTER_KEYS.has(key)) continue;
      Object.defineProperty(this, key, Object.getOwnPropertyDescriptor(fresh, key)!);
    }
  }
}

/** The caller's settings for every session: what is not about which server to reach. */
function sharedConfig(config: MultiHostConfig): pg.ClientConfig {
  const shared: Record<string, unknown> = { ...config };
  for (const key of ['multiHost', 'Client', 'connectionString', 'host', 'port']) delete shared[key];
  return shared as pg.ClientConfig;
}

/** One session's settings: the URL's over the caller's, as node-postgres ranks a connection string. */
function sessionConfig(
  shared: pg.ClientConfig,
  target: ConnectionTarget,
  host: HostAddress,
  ssl: TlsTry,
  timeoutMs: number,
): pg.ClientConfig {
  const config: pg.ClientConfig = {
    ...shared,
    host: host.host,
    port: host.port,
    user: target.user ?? shared.user,
    password: target.password ?? shared.password,
    database: target.database ?? shared.database,
    application_name: target.applicationName ?? shared.application_name,
    fallback_application_name: target.fallbackApplicationName ?? shared.fallback_application_name,
    options: target.options ?? shared.options,
    client_encoding: target.clientEncoding ?? shared.client_encoding,
    keepAlive: target.keepalives ?? shared.keepAlive,
    keepAliveInitialDelayMillis: target.keepalivesIdleMs ?? shared.keepAliveInitialDelayMillis,
    // No limit: 0. A try has at least a millisecond, or node-postgres would read 0 as none.
    connectionTimeoutMillis:
      Number.isFinite(timeoutMs) && timeoutMs > 0 ? Math.max(1, Math.ceil(timeoutMs)) : 0,
  };
  if (ssl !== undefined) config.ssl = ssl;
  return config;
}

/** Closes a try's connection with nothing of it reaching the client: politely if a session was made. */
function drop(connection: Connection, polite: boolean): void {
  connection.removeAllListeners();
  connection.on('error', () => undefined);
  if (polite) connection.end();
  else connection.stream.destroy();
}

function asError(e: unknown): Error {
  return e instanceof Error ? e : new Error(String(e));
}

/**
 * The error when no host gave a session the URL accepts. Its code 08001 (libpq's
 * sqlclient_unable_to_establish_sqlconnection) is what errors.ts reads as the database being
 * unavailable and the statement never sent: ordo retries within connectTimeout, and the server
 * answers 503. One host tried alone keeps its own error, as node-postgres gave it; so do hosts
 * that all answered with the same server error (a wrong password on every one).
 */
function noSession(settings: MultiHostSettings, failures: Failure[], untried: HostAddress[]): Error {
  const last = failures.at(-1);
  const hosts = new Set(failures.map((f) => f.host));
  if (last && hosts.size === 1 && untried.length === 0 && !last.refused) return last.error;
  const codes = new Set(failures.map((f) => serverCode(f.error)));
  const [only] = codes;
  if (codes.size === 1 && only !== undefined && untried.length === 0) return failures[0]!.error;
  const attrs = settings.target.targetSessionAttrs;
  const what =
    attrs === 'read-write'
      ? `no host of ${settings.label} accepted a read-write session`
      : attrs === 'primary'
        ? `no host of ${settings.label} is a primary`
        : `no host of ${settings.label} could be connected to`;
  // A host's last try says the most (prefer: the plain one after TLS was refused).
  const reasons = new Map<HostAddress, string>();
  for (const f of failures) reasons.set(f.host, reason(f.error));
  for (const host of untried) reasons.set(host, 'not tried: connectTimeout ran out');
  const list = [...reasons].map(([h, why]) => `${describeHost(h.host, h.port)} (${why})`).join(', ');
  const error = new Error(`${what}: ${list}`, { cause: new AggregateError(failures.map((f) => f.error)) });
  return Object.assign(error, { code: '08001' });
}

/** The SQLSTATE of an error the server sent; undefined for anything else. */
function serverCode(e: Error): string | undefined {
  const { severity, code } = e as { severity?: unknown; code?: unknown };
  return typeof severity === 'string' && typeof code === 'string' ? code : undefined;
}

/** A network error by its code (ECONNREFUSED); anything else by its message. */
function reason(e: Error): string {
  const code = (e as { code?: unknown }).code;
  if (typeof code === 'string' && serverCode(e) === undefined) return code;
  return e.message;
}
