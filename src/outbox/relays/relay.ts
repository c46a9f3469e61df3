import { OrdoError } from '../../errors.js';
import { describe, invalid, knownKeys, plainObject, safeInteger } from '../../validate.js';
import { BatchInterrupted, type HandlerContext, type SubscriptionEnd } from '../consumer.js';
import type { SubscriptionLag } from '../lag.js';
import type { OutboxMessage } from '../messages.js';
import { MAX_BATCH, SUBSCRIBE_KEYS, type SubscribeOptions, type Subscription } from '../outbox.js';
import { BROKERS, type Broker, RELAY_BROKERS, type RelayBroker } from './brokers.js';
import { parseTemplate, type Template, toRelayMessage } from './envelope.js';
import { type Publisher, Refused, Unavailable } from './publisher.js';

/** Where a relay publishes: exactly one broker, with that broker's options. */
export type RelayTarget = { [B in RelayBroker]: { [K in B]: Record<string, unknown> } }[RelayBroker];

export interface RelayOptions extends Omit<SubscribeOptions, 'handler' | 'batchSize'> {
  to: RelayTarget;
  /** Most messages read per batch (default 16 windows, at least 500, at most 10,000). */
  batchSize?: number;
  /** Most unconfirmed publishes per partition (default the broker's: 256, a webhook 1). */
  window?: number;
}

/**
 * 'running': a process holds one of its partitions and nothing failed since its last checkpoint;
 * 'failing': something did (a broker away, a message refused); 'stopped': no process holds one.
 */
export const RELAY_STATES = ['running', 'failing', 'stopped'] as const;
export type RelayStateName = (typeof RELAY_STATES)[number];

/** What `GET /v1/relays` and `ordo status` show of a relay running in this process. */
export interface RelayState {
  name: string;
  topic: string;
  broker: RelayBroker;
  /** Where it publishes, without secrets. */
  target: string;
  /** 'running': its last publish was confirmed (or none yet); 'failing': its last one failed; 'stopped'. */
  state: RelayStateName;
  /** Messages the broker confirmed since this relay started in this process. */
  delivered: number;
  lastDeliveredAt: Date | null;
  lastError: string | null;
  lastErrorAt: Date | null;
}

/** A relay as the database knows it, wherever it runs (`GET /v1/relays`, `ordo status`). */
export interface RelayStatus extends SubscriptionLag {
  broker: RelayBroker;
  target: string;
  state: RelayStateName;
  startedAt: Date;
  /** The last failure its process met: a broker away, a message refused. */
  lastRelayError: string | null;
  lastRelayErrorAt: Date | null;
}

export function relayStatus(row: Record<string, any>, lag: SubscriptionLag): RelayStatus {
  const now = Date.now();
  const held = lag.partitions.some(
    (p) => p.owner !== null && p.leaseUntil !== null && p.leaseUntil.getTime() > now,
  );
  const checkpointed = Math.max(0, ...lag.partitions.map((p) => p.checkpointedAt?.getTime() ?? 0));
  const failedAt: Date | null = row.last_error_at;
  const failing = lag.attempts > 0 || (failedAt !== null && failedAt.getTime() >= checkpointed);
  return {
    ...lag,
    broker: row.broker,
    target: row.target,
    state: !held ? 'stopped' : failing ? 'failing' : 'running',
    startedAt: row.started_at,
    lastRelayError: row.last_error,
    lastRelayErrorAt: failedAt,
  };
}

export interface Relay {
  readonly name: string;
  readonly topic: string;
  readonly broker: RelayBroker;
  state(): RelayState;
  lag(): Promise<SubscriptionLag>;
  /** Finishes the batches in flight (their publishes confirmed or failed), then stops. */
  stop(): Promise<SubscriptionEnd>;
  readonly done: Promise<SubscriptionEnd>;
}

/** subscribe()'s options, with `to` and `window` in place of the handler. */
const relayKeys = (): string[] => [...SUBSCRIBE_KEYS.filter((k) => k !== 'handler'), 'to', 'window'];
/** The most publishes a partition may have unconfirmed. */
export const MAX_WINDOW = 10_000;

/** The broker and its checked options, from `to`; refused with what to change. */
export function relayTarget(to: unknown): { broker: Broker<any>; config: unknown; template: Template } {
  const target = plainObject('to', to);
  const names = Object.keys(target);
  if (names.length !== 1 || !(names[0]! in BROKERS)) {
    throw invalid(
      `to must name exactly one broker: { ${RELAY_BROKERS.join(' | ')}: { … } } (got ${describe(names.join(', ') || to)})`,
    );
  }
  const broker = BROKERS[names[0] as RelayBroker];
  const config = broker.check(plainObject(`to.${broker.name}`, target[broker.name]));
  const text = broker.template(config);
  const { template, problem } = parseTemplate(text);
  if (!template)
    throw invalid(`to.${broker.name}.${broker.templateOption}: ${problem} (got ${describe(text)})`);
  return { broker, config, template };
}

/**
 * A relay: a subscription whose handler is a broker. Each batch of a partition is published in
 * commit order through a window of unconfirmed publishes on the relay's one connection; the
 * handler returns once every message is confirmed, and the subscription's checkpoint moves past
 * the batch. When a publish fails, the checkpoint moves past the confirmed prefix alone and the
 * rest is published again, with the same ids: after a back-off when the broker is away, counted
 * (and parked after maxAttempts) when the broker refused the message itself.
 */
export class RelayRunner implements Relay {
  readonly name: string;
  readonly topic: string;
  readonly broker: RelayBroker;
  private subscription: Subscription | undefined;
  private connecting: Promise<Publisher> | undefined;
  private readonly window: number;
  private readonly stats: RelayState;
  private stopped = false;

  constructor(
    private readonly options: Record<string, unknown>,
    private readonly target: ReturnType<typeof relayTarget>,
    private readonly outbox: RelayHost,
  ) {
    this.name = options.name as string;
    this.topic = options.topic as string;
    this.broker = target.broker.name;
    this.window =
      options.window === undefined
        ? target.broker.window
        : safeInteger('window', options.window, 1, target.broker.maxWindow ?? MAX_WINDOW);
    this.stats = {
      name: this.name,
      topic: this.topic,
      broker: this.broker,
      target: target.broker.describe(target.config),
      state: 'running',
      delivered: 0,
      lastDeliveredAt: null,
      lastError: null,
      lastErrorAt: null,
    };
  }

  get done(): Promise<SubscriptionEnd> {
    return this.subscription!.done;
  }

  async start(): Promise<this> {
    const { to: _to, window: _window, ...rest } = this.options;
    const onError = rest.onError as ((e: OrdoError) => void) | undefined;
    this.subscription = await this.outbox.subscribe({
      ...(rest as Omit<SubscribeOptions, 'handler'>),
      batchSize: rest.batchSize === undefined ? defaultBatchSize(this.window) : (rest.batchSize as number),
      handler: (messages, context) => this.publishBatch(messages, context),
      onError: (e) => {
        this.failing(e);
        void this.outbox.failed(this.name, e.message).catch(() => undefined);
        onError?.(e);
      },
    });
    // A relay nobody could see is not started: it stops, and the caller hears why.
    await this.outbox.started(this.name, this.broker, this.stats.target).catch(async (e: unknown) => {
      await this.subscription!.stop();
      throw e;
    });
    void this.subscription.done.then(() => {
      this.stats.state = 'stopped';
      return this.disconnect();
    });
    return this;
  }

  state(): RelayState {
    return { ...this.stats };
  }

  lag(): Promise<SubscriptionLag> {
    return this.outbox.lag(this.name);
  }

  async stop(): Promise<SubscriptionEnd> {
    this.stopped = true;
    return this.subscription!.stop();
  }

  /**
   * One batch: published in order, `window` at a time unconfirmed; returns once all are
   * confirmed. Once the relay stops, nothing more is published: what is in flight is confirmed,
   * and that prefix acknowledged.
   */
  private async publishBatch(
    messages: OutboxMessage[],
    { partition, signal }: HandlerContext,
  ): Promise<void> {
    let publisher: Publisher;
    try {
      publisher = await this.connection();
    } catch (e) {
      throw new BatchInterrupted(0, !(e instanceof OrdoError && e.code === 'invalid_argument'), e);
    }
    const confirms: Promise<void>[] = [];
    let handled = 0;
    try {
      for (const m of messages) {
        if (signal.aborted) break;
        if (confirms.length - handled >= this.window) {
          await confirms[handled];
          handled++;
        }
        const sent = publisher.publish(toRelayMessage(m, partition, this.target.template));
        // Awaited in order below; a failure after an earlier one must not go unheard.
        sent.catch(() => undefined);
        confirms.push(sent);
      }
      for (; handled < confirms.length; handled++) await confirms[handled];
      if (handled < messages.length)
        throw new BatchInterrupted(handled, true, new Error('the relay stopped'));
    } catch (e) {
      if (e instanceof BatchInterrupted) {
        this.delivered(handled);
        throw e;
      }
      this.delivered(handled);
      const refused = e instanceof Refused;
      // The connection may be broken: the rest goes out on a new one.
      if (!refused) void this.disconnect();
      throw new BatchInterrupted(handled, !refused, e, e instanceof Unavailable ? e.retryAfterMs : 0);
    }
    this.delivered(handled);
  }

  private delivered(n: number): void {
    if (n === 0) return;
    this.stats.delivered += n;
    this.stats.lastDeliveredAt = new Date();
    this.stats.state = 'running';
  }

  private failing(e: OrdoError): void {
    this.stats.state = this.stopped ? 'stopped' : 'failing';
    this.stats.lastError = e.message;
    this.stats.lastErrorAt = new Date();
  }

  private connection(): Promise<Publisher> {
    if (!this.connecting) {
      const connecting = this.target.broker.connect(this.target.config);
      this.connecting = connecting;
      // A failed connection is tried again at the next batch, after the consumer's back-off.
      connecting.catch(() => {
        if (this.connecting === connecting) this.connecting = undefined;
      });
    }
    return this.connecting;
  }

  private async disconnect(): Promise<void> {
    const connecting = this.connecting;
    this.connecting = undefined;
    const publisher = await connecting?.catch(() => undefined);
    await publisher?.close().catch(() => undefined);
  }
}

/** What a relay needs of the outbox it runs in. */
/**
 * A partition's window empties at the end of every batch (the next is read once the last is
 * acknowledged), so a batch is many windows long: that pause is paid once per 16 windows.
 */
function defaultBatchSize(window: number): number {
  return Math.min(MAX_BATCH, Math.max(500, window * 16));
}

export interface RelayHost {
  subscribe(options: SubscribeOptions): Promise<Subscription>;
  lag(name: string): Promise<SubscriptionLag>;
  /** Records where the relay publishes, for every process to see. */
  started(name: string, broker: RelayBroker, target: string): Promise<void>;
  /** Records the relay's last failure. */
  failed(name: string, error: string): Promise<void>;
}

/** Checks a relay's options (all of them, before anything is created) and starts it. */
export async function startRelay(options: unknown, outbox: RelayHost): Promise<Relay> {
  const o = plainObject('relay options', options);
  knownKeys('relay options', o, relayKeys());
  if (o.to === undefined) throw invalid(`a relay needs to: { ${RELAY_BROKERS.join(' | ')}: { … } }`);
  const target = relayTarget(o.to);
  const runner = new RelayRunner(o, target, outbox);
  // The client library is loaded now: a missing one is refused here, not at the first message.
  await target.broker.load();
  return runner.start();
}
