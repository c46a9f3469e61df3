import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import { arrayElements } from '../db/arrays.js';
import type { InFlight } from '../db/in-flight.js';
import type { Notifications } from '../db/notifications.js';
import { asQueryable, type Queryable, type Tx } from '../db/queryable.js';
import { durationOption } from '../durations.js';
import { OrdoError } from '../errors.js';
import {
  describe,
  invalid,
  knownKeys,
  MAX_ERROR_LENGTH,
  oneOf,
  plainObject,
  safeInteger,
  text,
} from '../validate.js';
import { type Handler, retryDelay, type SubscriptionEnd } from './consumer.js';
import { toLag, type SubscriptionLag } from './lag.js';
import {
  type Appended,
  appendedOf,
  type Columns,
  type MessageInput,
  type OutboxMessage,
  outboxName,
  toColumns,
  toMessage,
} from './messages.js';
import type { OutboxPlans } from './plans.js';
import { type Relay, type RelayOptions, type RelayStatus, relayStatus, startRelay } from './relays/relay.js';
import { PartitionRunner } from './runner.js';

export interface AppendOptions {
  /** Append inside this transaction: consumers see the messages once it commits. */
  tx?: Tx;
}

export interface SubscribeOptions<T = unknown> {
  /** The subscription: its cursor is kept under this name, shared by every consumer of it. */
  name: string;
  topic: string;
  handler: Handler<T>;
  /** Most messages per handler call (default 100). */
  batchSize?: number;
  /** Where a new subscription starts: the whole topic (default) or messages committed from now on. */
  from?: 'beginning' | 'now';
  /**
   * Splits the subscription into this many partitions by a hash of each message's `key`
   * (1 to 256, default 1; messages without a key share one partition). Each partition is
   * read by one consumer at a time, in order; the instances subscribed share the partitions.
   * Fixed when the subscription is created.
   */
  partitions?: number;
  /** Deliveries of one message before it is given up (default 10). */
  maxAttempts?: number;
  /** What giving up means: park the message in dead_letters and go on (default), or stop. */
  onExhausted?: 'park' | 'stop';
  /** How long the lease lasts without renewal; another consumer may take over after it (default '30s'). */
  lease?: string | number;
  /** Reads this often when no notification comes (default '1s'). */
  pollInterval?: string | number;
  /** First delay after a failure (default '100ms'); it doubles up to maxRetryDelay (default '30s'). */
  retryDelay?: string | number;
  maxRetryDelay?: string | number;
  /** Hears handler failures and database errors; the consumer goes on regardless. */
  onError?: (error: OrdoError) => void;
}

export interface Subscription {
  readonly name: string;
  readonly topic: string;
  /** Ends after the batch in hand; gives the lease up so that another consumer takes over at once. */
  stop(): Promise<SubscriptionEnd>;
  lag(): Promise<SubscriptionLag>;
  /** Resolves when the consumer ends, by stop() or by giving up (onExhausted 'stop'). */
  readonly done: Promise<SubscriptionEnd>;
}

export interface DeadLetter extends OutboxMessage {
  attempts: number;
  error: string | null;
  parkedAt: Date;
}

export const SUBSCRIBE_KEYS = [
  'name',
  'topic',
  'handler',
  'batchSize',
  'from',
  'partitions',
  'maxAttempts',
  'onExhausted',
  'lease',
  'pollInterval',
  'retryDelay',
  'maxRetryDelay',
  'onError',
] as const;
const DAY_MS = 86_400_000;
/** The most partitions a subscription may have (also in create_subscription and the HTTP schemas). */
export const MAX_PARTITIONS = 256;
/** The most messages one batch may hold. */
export const MAX_BATCH = 10_000;
/** The most attempts a subscription, a receive or a nack may allow a message. */
export const MAX_ATTEMPTS = 1_000_000;
/** The longest receipt receive() hands out (partition.version.owner). */
export const MAX_RECEIPT_LENGTH = 3 + 1 + 19 + 1 + 41;

/** maxAttempts of subscribe(), receive() and nack(): failures of one message before it is given up (default 10). */
const maxAttemptsOption = (value: unknown): number =>
  value === undefined ? 10 : safeInteger('maxAttempts', value, 1, MAX_ATTEMPTS);

/** Where seek() moves a subscription: its first message, what commits from now on, or what was appended since a time. */
export type SeekTarget = 'beginning' | 'now' | Date;

export interface ReceiveOptions {
  /** Most messages in the batch (default 100). */
  max?: number;
  /** How long the batch is leased to this caller (default '30s'); ack or nack it before then. */
  visibilityTimeout?: string | number;
  /**
   * A lease that lapses before its batch is acknowledged counts as a failed attempt: after this
   * many (default 10, with the nacks) a message is parked in dead_letters.
   */
  maxAttempts?: number;
}

/** A batch leased to one caller: acknowledge it with its receipt, or hand it back with nack. */
export interface Received<T = unknown> {
  messages: OutboxMessage<T>[];
  /** Null when there was nothing to receive. */
  receipt: string | null;
  /** 1 on the first delivery of the first message, then 2, 3, … */
  attempt: number;
}

export interface NackOptions {
  /** Why it failed, kept as the subscription's last error and in dead_letters. */
  error?: string;
  /** When the batch may be received again; default: a back-off growing with the failures. */
  retryAfter?: string | number;
  /** Failures of one message before it is parked in dead_letters (default 10). */
  maxAttempts?: number;
}

export interface NackResult {
  /** 'split': the batch's messages come one at a time next; 'retry': again later; 'parked': in dead_letters, passed. */
  outcome: 'split' | 'retry' | 'parked';
  attempts: number;
}

const RECEIPT = /^(\d{1,3})\.(\d{1,19})\.(http:[0-9a-f-]{36})$/;

/** The transactional outbox: append in the business transaction, consume without skipping. */
export class Outbox {
  private readonly consumers = new Set<PartitionRunner>();
  /** Messages appended through this client since it started, by topic (for metrics). */
  readonly appended = new Map<string, number>();
  private unlisten: (() => void) | undefined;

  /** @internal */
  constructor(
    private readonly pool: pg.Pool,
    private readonly plans: OutboxPlans,
    private readonly ensureOpen: (withTx?: boolean) => void,
    private readonly inFlight: InFlight,
    private readonly notifications: Notifications,
  ) {}

  /**
   * Appends one message or several in one statement, inside `tx` when given (the messages
   * are then part of that transaction: visible to consumers when it commits, gone if it
   * rolls back). Returns one entry per message, in order.
   */
  append(
    topic: string,
    messages: MessageInput | MessageInput[],
    options: AppendOptions = {},
  ): Promise<Appended[]> {
    let tx: Queryable | undefined;
    let columns: Columns;
    try {
      knownKeys('append options', plainObject('append options', options), ['tx']);
      tx = options.tx === undefined ? undefined : asQueryable(options.tx);
      this.ensureOpen(tx !== undefined);
      outboxName('topic', topic);
      columns = toColumns(messages);
    } catch (e) {
      return Promise.reject(e);
    }
    // No async step around the statement: each one a call waits through costs Node more than
    // building the append (see Sequences.next).
    return this.run(
      this.plans.append,
      [topic, columns.types, columns.data, columns.keys, columns.messageIds, columns.headers],
      tx,
    ).then(({ rows }) => {
      const appended = appendedOf(columns, arrayElements(rows[0].answer));
      const stored = appended.filter((a) => !a.duplicate).length;
      this.appended.set(topic, (this.appended.get(topic) ?? 0) + stored);
      return appended;
    });
  }

  /**
   * Starts a consumer of subscription `name` (created on first use). One consumer per name is
   * active at a time across all processes; others wait and take over when its lease lapses.
   */
  async subscribe<T = unknown>(options: SubscribeOptions<T>): Promise<Subscription> {
    this.ensureOpen();
    const o = plainObject('subscribe options', options);
    knownKeys('subscribe options', o, SUBSCRIBE_KEYS);
    const name = outboxName('name', o.name);
    const topic = outboxName('topic', o.topic);
    if (typeof o.handler !== 'function') throw invalid('handler must be a function (messages, { tx }) => …');
    if (o.onError !== undefined && typeof o.onError !== 'function')
      throw invalid('onError must be a function');
    const partitions =
      o.partitions === undefined ? 1 : safeInteger('partitions', o.partitions, 1, MAX_PARTITIONS);
    const settings = {
      name,
      topic,
      handler: o.handler as Handler<any>,
      batchSize: o.batchSize === undefined ? 100 : safeInteger('batchSize', o.batchSize, 1, MAX_BATCH),
      maxAttempts: maxAttemptsOption(o.maxAttempts),
      onExhausted:
        o.onExhausted === undefined ? 'park' : oneOf('onExhausted', o.onExhausted, ['park', 'stop']),
      leaseMs: durationOption('lease', o.lease ?? '30s', 300, DAY_MS),
      pollMs: durationOption('pollInterval', o.pollInterval ?? '1s', 1, DAY_MS),
      retryDelayMs: durationOption('retryDelay', o.retryDelay ?? '100ms', 1, DAY_MS),
      maxRetryDelayMs: durationOption('maxRetryDelay', o.maxRetryDelay ?? '30s', 1, DAY_MS),
      onError: o.onError as SubscribeOptions['onError'],
    } as const;
    const from = o.from === undefined ? 'beginning' : oneOf('from', o.from, ['beginning', 'now']);
    if (settings.maxRetryDelayMs < settings.retryDelayMs)
      throw invalid('maxRetryDelay must not be below retryDelay');
    await this.createSubscription({ name, topic, from, partitions });
    this.ensureOpen();
    this.listen();
    const consumer = new PartitionRunner(this.pool, this.plans, settings, partitions, (ms) =>
      this.notifications.pollInterval(ms),
    );
    this.consumers.add(consumer);
    void consumer.done.then(() => this.consumers.delete(consumer));
    return {
      name,
      topic,
      done: consumer.done,
      stop: () => consumer.stop(),
      lag: () => this.lag(name),
    };
  }

  /**
   * Starts a relay: a subscription (`name`, created on first use) whose handler publishes each
   * message to a broker and moves on only once the broker confirmed it. Options as subscribe()'s,
   * with `to: { nats | rabbitmq | redis | mqtt | webhook: { … } }` in place of the handler.
   */
  async relay(options: RelayOptions): Promise<Relay> {
    this.ensureOpen();
    return startRelay(options, {
      subscribe: (o) => this.subscribe(o),
      lag: (name) => this.lag(name),
      started: async (name, broker, target) => {
        await this.run(this.plans.relayStarted, [name, broker, target]);
      },
      failed: async (name, error) => {
        await this.run(this.plans.relayFailed, [name, error]);
      },
    });
  }

  /**
   * Every relay of the database, wherever it runs: where it publishes, how far behind it is,
   * and its last failure. 'running' while a process holds one of its partitions and its last
   * failure is older than its last checkpoint; 'failing' when it is not; 'stopped' when no
   * process holds a partition.
   */
  async relays(): Promise<RelayStatus[]> {
    this.ensureOpen();
    const { rows } = await this.run(this.plans.relays, []);
    const out: RelayStatus[] = [];
    for (const r of rows) {
      const lag = await this.lagIfAny(r.name);
      if (lag) out.push(relayStatus(r, lag));
    }
    return out;
  }

  /**
   * Creates a subscription if it is new (what subscribe() does first; consumers over HTTP need
   * it done for them). The same again is a no-op; another topic or partition count is
   * subscription_conflict.
   */
  async createSubscription(options: {
    name: string;
    topic: string;
    from?: 'beginning' | 'now';
    partitions?: number;
  }): Promise<void> {
    this.ensureOpen();
    const o = plainObject('createSubscription options', options);
    knownKeys('createSubscription options', o, ['name', 'topic', 'from', 'partitions']);
    const name = outboxName('name', o.name);
    const topic = outboxName('topic', o.topic);
    const from = o.from === undefined ? 'beginning' : oneOf('from', o.from, ['beginning', 'now']);
    const partitions =
      o.partitions === undefined ? 1 : safeInteger('partitions', o.partitions, 1, MAX_PARTITIONS);
    await this.run(this.plans.create, [name, topic, from, partitions]);
  }

  /** How far a subscription is behind, and the open transaction holding it back, if any. */
  async lag(name: string): Promise<SubscriptionLag> {
    this.ensureOpen();
    const { rows } = await this.run(this.plans.lag, [outboxName('subscription name', name)]);
    return toLag(name, rows);
  }

  /**
   * Moves a subscription: to its first message ('beginning', a replay), past everything
   * committed ('now'), or to the first message appended at or after a time. Refused with
   * subscription_busy while a consumer holds one of its partitions: stop its consumers first.
   */
  async seek(name: string, options: { to: SeekTarget }): Promise<void> {
    this.ensureOpen();
    outboxName('subscription name', name);
    const o = plainObject('seek options', options);
    knownKeys('seek options', o, ['to']);
    const to = o.to;
    let first: number | null;
    if (to === 'beginning') first = 1;
    else if (to === 'now') first = null;
    else if (to instanceof Date && !Number.isNaN(to.getTime())) {
      const { rows } = await this.run(this.plans.firstSince, [name, to]);
      first = Number(rows[0].first);
    } else throw invalid(`seek needs { to: 'beginning' | 'now' | a Date } (got ${describe(to)})`);
    const { rows } = await this.run(this.plans.seek, [name, first]);
    if (Number(rows[0].moved) === 0) throw subscriptionNotFound(name);
  }

  /**
   * A batch for a consumer that is not a subscribe() handler (over HTTP, in any language): the
   * next messages of the first partition nobody holds, leased to the caller for
   * `visibilityTimeout`. Same order and guarantees as subscribe(): ack() it to move past it;
   * nack() it, or let the lease lapse, and it is delivered again.
   */
  async receive<T = unknown>(name: string, options: ReceiveOptions = {}): Promise<Received<T>> {
    this.ensureOpen();
    outboxName('subscription name', name);
    const o = plainObject('receive options', options);
    knownKeys('receive options', o, ['max', 'visibilityTimeout', 'maxAttempts']);
    const max = o.max === undefined ? 100 : safeInteger('max', o.max, 1, MAX_BATCH);
    const leaseMs = durationOption('visibilityTimeout', o.visibilityTimeout ?? '30s', 300, DAY_MS);
    const maxAttempts = maxAttemptsOption(o.maxAttempts);
    const owner = `http:${randomUUID()}`;
    const { rows } = await this.run(this.plans.receiveAny, [name, owner, max, leaseMs, maxAttempts]);
    if (rows.length === 0) return { messages: [], receipt: null, attempt: 0 };
    const { partition, version, attempt } = rows[0];
    return {
      messages: rows.map((r) => toMessage(r) as OutboxMessage<T>),
      receipt: `${partition}.${version}.${owner}`,
      attempt,
    };
  }

  /** Moves the subscription past a received batch; receipt_expired once its lease has lapsed. */
  async ack(name: string, receipt: string): Promise<{ handled: number }> {
    this.ensureOpen();
    const r = parseReceipt(name, receipt);
    const { rows } = await this.run(this.plans.ack, [name, r.partition, r.owner, r.version, 0, true, true]);
    if (rows[0].handled === null) throw receiptExpired(name);
    return { handled: Number(rows[0].handled) };
  }

  /** Hands a received batch back (see NackResult); receipt_expired once its lease has lapsed. */
  async nack(name: string, receipt: string, options: NackOptions = {}): Promise<NackResult> {
    this.ensureOpen();
    const r = parseReceipt(name, receipt);
    const o = plainObject('nack options', options);
    knownKeys('nack options', o, ['error', 'retryAfter', 'maxAttempts']);
    const error = o.error === undefined ? 'nack' : text('error', o.error, 1, MAX_ERROR_LENGTH);
    const maxAttempts = maxAttemptsOption(o.maxAttempts);
    const delays =
      o.retryAfter === undefined
        ? Array.from({ length: Math.min(maxAttempts, 32) }, (_, i) =>
            Math.round(retryDelay(i + 1, 100, 30_000)),
          )
        : [durationOption('retryAfter', o.retryAfter, 0, DAY_MS)];
    const { rows } = await this.run(this.plans.nackReceipt, [
      name,
      r.partition,
      r.owner,
      r.version,
      error,
      maxAttempts,
      true,
      delays,
      true,
    ]);
    if (rows[0].outcome === null) throw receiptExpired(name);
    return { outcome: rows[0].outcome, attempts: rows[0].attempts };
  }

  /** Every subscription with its lag, by name. */
  async subscriptions(): Promise<SubscriptionLag[]> {
    this.ensureOpen();
    const { rows } = await this.run(this.plans.names, []);
    const lags: SubscriptionLag[] = [];
    for (const row of rows) {
      const lag = await this.lagIfAny(row.name);
      if (lag) lags.push(lag);
    }
    return lags;
  }

  /** A subscription's lag; undefined when it was removed since its name was read, and is not listed. */
  private lagIfAny(name: string): Promise<SubscriptionLag | undefined> {
    return this.lag(name).catch((e: unknown) => {
      if (e instanceof OrdoError && e.code === 'subscription_not_found') return undefined;
      throw e;
    });
  }

  /**
   * Messages parked by a subscription after maxAttempts, with the reason: the oldest first, or
   * with `order: 'newest'` the latest parked first (the few a dashboard shows).
   */
  async deadLetters(
    name: string,
    options: { limit?: number; order?: 'oldest' | 'newest' } = {},
  ): Promise<DeadLetter[]> {
    this.ensureOpen();
    knownKeys('deadLetters options', plainObject('deadLetters options', options), ['limit', 'order']);
    const limit = options.limit === undefined ? 1000 : safeInteger('limit', options.limit, 1, 100_000);
    const order = options.order ?? 'oldest';
    if (order !== 'oldest' && order !== 'newest')
      throw invalid(`order must be 'oldest' or 'newest' (got ${describe(order)})`);
    const plan = order === 'newest' ? this.plans.deadLettersNewest : this.plans.deadLetters;
    const { rows } = await this.run(plan, [outboxName('subscription name', name), limit]);
    return rows.map((r) => ({
      ...toMessage(r),
      attempts: r.attempts,
      error: r.error,
      parkedAt: r.parked_at,
    }));
  }

  /**
   * Forgets a subscription and its cursor, so that it no longer holds back prune(). Its
   * running consumer ends at its next read.
   */
  async removeSubscription(name: string, options: { ifExists?: boolean } = {}): Promise<boolean> {
    this.ensureOpen();
    knownKeys('removeSubscription options', plainObject('removeSubscription options', options), ['ifExists']);
    const { rows } = await this.run(this.plans.remove, [outboxName('subscription name', name)]);
    if (rows.length === 0 && !options.ifExists) throw subscriptionNotFound(name);
    return rows.length > 0;
  }

  /**
   * Deletes messages older than `olderThan` that every subscription of their topic has
   * passed; returns how many. Parked messages stay in dead_letters.
   */
  async prune(options: { olderThan: string | number; topic?: string }): Promise<number> {
    this.ensureOpen();
    const o = plainObject('prune options', options);
    knownKeys('prune options', o, ['olderThan', 'topic']);
    if (o.olderThan === undefined) throw invalid("prune needs olderThan, such as '7d'");
    const olderThan = durationOption('olderThan', o.olderThan, 0, 100 * 365 * DAY_MS);
    const topic = o.topic === undefined ? null : outboxName('topic', o.topic);
    const { rows } = await this.run(this.plans.prune, [`${olderThan} milliseconds`, topic]);
    return Number(rows[0].deleted);
  }

  /** Stops every consumer of this client; each gives its lease up. */
  async close(): Promise<void> {
    await Promise.all([...this.consumers].map((c) => c.stop()));
    this.unlisten?.();
  }

  private run(sql: string, values: unknown[], on: Queryable = this.pool): Promise<{ rows: any[] }> {
    return this.inFlight.query(on, sql, values);
  }

  private listen(): void {
    this.unlisten ??= this.notifications.on(this.plans.channel, {
      message: (topic) => {
        for (const c of this.consumers) if (c.topic === topic) c.notify();
      },
      reset: () => {
        for (const c of this.consumers) c.notify();
      },
      // A commit between a consumer's first look and the LISTEN sent no wake-up it could hear.
      listening: () => {
        for (const c of this.consumers) c.notify();
      },
    });
  }
}

const subscriptionNotFound = (name: string) =>
  new OrdoError('subscription_not_found', `The subscription '${name}' does not exist`);

const receiptExpired = (name: string) =>
  new OrdoError(
    'receipt_expired',
    `The receipt of subscription '${name}' is no longer valid: its visibilityTimeout ran out (or it was already acknowledged), and its messages are delivered again; receive them again`,
  );

function parseReceipt(name: string, receipt: unknown): { partition: number; version: string; owner: string } {
  outboxName('subscription name', name);
  const m = typeof receipt === 'string' ? RECEIPT.exec(receipt) : null;
  if (!m) throw invalid(`receipt must be the receipt a receive() returned (got ${describe(receipt)})`);
  return { partition: Number(m[1]), version: m[2]!, owner: m[3]! };
}
