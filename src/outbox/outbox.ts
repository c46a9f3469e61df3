import type pg from 'pg';
import type { InFlight } from '../db/in-flight.js';
import type { Notifications } from '../db/notifications.js';
import { asQueryable, type Queryable, type Tx } from '../db/queryable.js';
import { durationOption } from '../durations.js';
import { OrdoError } from '../errors.js';
import { invalid, knownKeys, oneOf, plainObject, safeInteger } from '../validate.js';
import { Consumer, type Handler, type SubscriptionEnd } from './consumer.js';
import { toLag, type SubscriptionLag } from './lag.js';
import {
  type Appended,
  matchAppended,
  type MessageInput,
  type OutboxMessage,
  outboxName,
  toColumns,
  toMessage,
} from './messages.js';
import type { OutboxPlans } from './plans.js';

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

const SUBSCRIBE_KEYS = [
  'name',
  'topic',
  'handler',
  'batchSize',
  'from',
  'maxAttempts',
  'onExhausted',
  'lease',
  'pollInterval',
  'retryDelay',
  'maxRetryDelay',
  'onError',
] as const;
const DAY_MS = 86_400_000;

/** The transactional outbox: append in the business transaction, consume without skipping. */
export class Outbox {
  private readonly consumers = new Set<Consumer>();
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
  async append(
    topic: string,
    messages: MessageInput | MessageInput[],
    options: AppendOptions = {},
  ): Promise<Appended[]> {
    knownKeys('append options', plainObject('append options', options), ['tx']);
    const tx = options.tx === undefined ? undefined : asQueryable(options.tx);
    this.ensureOpen(tx !== undefined);
    outboxName('topic', topic);
    const columns = toColumns(messages);
    const { rows } = await this.run(
      this.plans.append,
      [topic, columns.types, columns.data, columns.keys, columns.messageIds, columns.headers],
      tx,
    );
    return matchAppended(columns, rows);
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
    const settings = {
      name,
      topic,
      handler: o.handler as Handler<any>,
      batchSize: o.batchSize === undefined ? 100 : safeInteger('batchSize', o.batchSize, 1, 10_000),
      maxAttempts: o.maxAttempts === undefined ? 10 : safeInteger('maxAttempts', o.maxAttempts, 1, 1_000_000),
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
    await this.run(this.plans.create, [name, topic, from]);
    this.ensureOpen();
    this.listen();
    const consumer = new Consumer(this.pool, this.plans, settings, (ms) =>
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

  /** How far a subscription is behind, and the open transaction holding it back, if any. */
  async lag(name: string): Promise<SubscriptionLag> {
    this.ensureOpen();
    const { rows } = await this.run(this.plans.lag, [outboxName('subscription name', name)]);
    return toLag(rows[0]!);
  }

  /** Every subscription with its lag, by name. */
  async subscriptions(): Promise<SubscriptionLag[]> {
    this.ensureOpen();
    const { rows } = await this.run(this.plans.names, []);
    const lags: SubscriptionLag[] = [];
    for (const row of rows) {
      // A subscription removed between the two reads is simply not listed.
      const lag = await this.lag(row.name).catch((e: OrdoError) => {
        if (e.code === 'subscription_not_found') return undefined;
        throw e;
      });
      if (lag) lags.push(lag);
    }
    return lags;
  }

  /** Messages parked by a subscription after maxAttempts, oldest first, with the reason. */
  async deadLetters(name: string, options: { limit?: number } = {}): Promise<DeadLetter[]> {
    this.ensureOpen();
    knownKeys('deadLetters options', plainObject('deadLetters options', options), ['limit']);
    const limit = options.limit === undefined ? 1000 : safeInteger('limit', options.limit, 1, 100_000);
    const { rows } = await this.run(this.plans.deadLetters, [outboxName('subscription name', name), limit]);
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
    if (rows.length === 0 && !options.ifExists) {
      throw new OrdoError('subscription_not_found', `The subscription '${name}' does not exist`);
    }
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

  private run(text: string, values: unknown[], on: Queryable = this.pool): Promise<{ rows: any[] }> {
    return this.inFlight.query(on, text, values);
  }

  private listen(): void {
    this.unlisten ??= this.notifications.on(this.plans.channel, {
      message: (topic) => {
        for (const c of this.consumers) if (c.topic === topic) c.notify();
      },
      reset: () => {
        for (const c of this.consumers) c.notify();
      },
    });
  }
}
