import type { ChannelModel, ConfirmChannel, Message, Options } from 'amqplib';
import type { Broker } from './brokers.js';
import { optionalPackage } from '../../optional-package.js';
import { brokerUrl, textOption, withoutPassword } from './options.js';
import { type Publisher, Refused } from './publisher.js';
import { describe, invalid, knownKeys } from '../../validate.js';

type Amqplib = typeof import('amqplib');

export interface RabbitmqConfig {
  url: string;
  /** The exchange every message is published to; '' is the default exchange (routing key = queue). */
  exchange: string;
  /** The routing key template, such as `orders.{type}`. */
  routingKey: string;
  /** How long a publish waits for its confirm, and a connection for its handshake (ms). */
  timeoutMs: number;
}

const KEYS = ['url', 'exchange', 'routingKey', 'timeout'] as const;
/** AMQP 0-9-1 carries exchange names and routing keys as short strings: at most 255 bytes. */
const SHORT_STRING = 255;

const load = () => optionalPackage<Amqplib>(() => import('amqplib'), 'amqplib', 'a relay to RabbitMQ');

/**
 * What a connection learned of the broker's max_message_size (it closes the channel on a larger
 * message, naming its limit), kept per relay so that its next connection refuses such a message
 * before sending it instead of losing the channel to it again.
 */
const maxMessageSize = new WeakMap<RabbitmqConfig, number>();

/** One publish awaiting its confirm. */
interface Pending {
  id: string;
  routingKey: string;
  content: Buffer;
  options: Options.Publish;
  sent: boolean;
  /** Set by a basic.return: the broker routed the message to no queue. */
  returned?: string;
  timer: NodeJS.Timeout;
  resolve(): void;
  reject(e: Error): void;
}

/**
 * RabbitMQ (AMQP 0-9-1): each message is published on a confirm channel to the exchange with its
 * rendered routing key, `mandatory` and persistent, its id in the `message_id` property, and counts
 * as delivered on its publisher confirm. A message no queue takes comes back as a basic.return
 * before its confirm and is refused; so is a routing key AMQP cannot carry or a message larger
 * than the broker takes.
 */
export const rabbitmq: Broker<RabbitmqConfig> = {
  name: 'rabbitmq',
  templateOption: 'routingKey',
  window: 256,
  check(o) {
    knownKeys('to.rabbitmq', o, KEYS);
    const url = brokerUrl('to.rabbitmq.url', o.url, ['amqp:', 'amqps:']).href;
    if (typeof o.exchange !== 'string' || Buffer.byteLength(o.exchange) > SHORT_STRING) {
      throw invalid(
        `to.rabbitmq.exchange must be the name of an exchange (at most ${SHORT_STRING} bytes), or '' for the default exchange (got ${describe(o.exchange)})`,
      );
    }
    const routingKey = textOption('to.rabbitmq.routingKey', o.routingKey);
    if (Buffer.byteLength(routingKey.replace(/\{[a-z]+\}/g, '')) > SHORT_STRING) {
      throw invalid(`to.rabbitmq.routingKey must render to at most ${SHORT_STRING} bytes`);
    }
    // Longer than NATS's: a persistent message is confirmed once its queues have written it to disk.
    const timeoutMs = o.timeout === undefined ? 10_000 : Number(o.timeout);
    if (!Number.isInteger(timeoutMs) || timeoutMs < 1)
      throw invalid(`to.rabbitmq.timeout must be a number of milliseconds (got ${describe(o.timeout)})`);
    return { url, exchange: o.exchange, routingKey, timeoutMs };
  },
  template: (c) => c.routingKey,
  describe: (c) =>
    `rabbitmq ${withoutPassword(new URL(c.url))} exchange ${c.exchange === '' ? '(default)' : c.exchange} routing key ${c.routingKey}`,
  load,
  async connect(config): Promise<Publisher> {
    const { connect } = await load();
    const where = withoutPassword(new URL(config.url));
    let model: ChannelModel;
    try {
      model = await connect(config.url, {
        timeout: config.timeoutMs,
        clientProperties: { connection_name: `ordo relay to exchange '${config.exchange}'` },
      });
    } catch (e) {
      throw new Error(`cannot connect to RabbitMQ at ${where}: ${(e as Error).message}`, { cause: e });
    }
    let broken: string | undefined;
    let blocked: string | undefined;
    // Without a listener, an 'error' event would throw; the 'close' that follows fails what is in flight.
    model.on('error', (e: Error) => (broken ??= e.message));
    model.on('close', (e?: Error) => {
      if (e) broken ??= e.message;
    });
    model.on('blocked', (reason: string) => (blocked = reason));
    model.on('unblocked', () => (blocked = undefined));
    let channel: ConfirmChannel;
    try {
      // The exchange is checked on a channel of its own, since a failed check closes its channel.
      // A missing exchange is a transient failure, not invalid_argument: a relay refused with
      // invalid_argument at connect would count an attempt against every partition's first message
      // and park it, whereas an exchange is often declared by the consuming service, which may
      // start later; meanwhile the relay retries with back-off and shows this error.
      if (config.exchange !== '') {
        const probe = await model.createChannel();
        probe.on('error', () => undefined);
        try {
          await probe.checkExchange(config.exchange);
        } catch (e) {
          throw new Error(
            (e as { code?: number }).code === 404
              ? `RabbitMQ at ${where} has no exchange '${config.exchange}': declare it, or name another in to.rabbitmq.exchange`
              : `RabbitMQ at ${where} refused the exchange '${config.exchange}': ${(e as Error).message}`,
            { cause: e },
          );
        }
        await probe.close();
      }
      channel = await model.createConfirmChannel();
    } catch (e) {
      await model.close().catch(() => undefined);
      throw e;
    }

    /** Every publish not yet settled, in publish order. */
    const pending = new Set<Pending>();
    /** Publishes held back while the channel asks the relay to wait for 'drain'. */
    const held: Pending[] = [];
    let writable = true;
    /** The channel is closing: no more publishes, and what is unconfirmed fails when it has closed. */
    let closing = false;
    /** Why the channel closed. */
    let closed: string | undefined;

    const tooLarge = (p: Pending, max: number): Refused =>
      new Refused(`RabbitMQ takes messages of at most ${max} bytes; ${p.id} has ${p.content.length}`);
    const lost = (p: Pending, reason: string): Error => {
      const max = maxMessageSize.get(config);
      if (max !== undefined && p.content.length > max) return tooLarge(p, max);
      return new Error(`the RabbitMQ channel closed before confirming ${p.id}: ${reason}`);
    };
    const settle = (p: Pending, failure?: Error): void => {
      if (!pending.delete(p)) return;
      clearTimeout(p.timer);
      if (failure) p.reject(failure);
      else p.resolve();
    };
    const confirmed = (p: Pending, err: unknown): void => {
      if (err === null || err === undefined) {
        settle(p, p.returned === undefined ? undefined : new Refused(p.returned));
      } else if (!closing) {
        // A nack: the queue could not take the message now (a full queue that rejects publishes,
        // a queue without its leader). That says nothing of this message itself, so it is sent
        // again after a back-off rather than counted and parked: parking would empty the outbox
        // into dead letters while a queue is full.
        settle(
          p,
          new Error(`RabbitMQ nacked ${p.id} (exchange '${config.exchange}', routing key '${p.routingKey}')`),
        );
      }
      // Otherwise the channel closed: every unconfirmed publish fails once it has.
    };
    const send = (p: Pending): void => {
      try {
        writable = channel.publish(config.exchange, p.routingKey, p.content, p.options, (err: unknown) =>
          confirmed(p, err),
        );
        p.sent = true;
      } catch (e) {
        settle(p, new Error(`cannot publish ${p.id} to RabbitMQ: ${(e as Error).message}`, { cause: e }));
      }
    };

    channel.on('error', (e: Error) => {
      broken ??= e.message;
      const size = /larger than configured max size (\d+)/.exec(e.message);
      if (size) maxMessageSize.set(config, Number(size[1]));
    });
    // Before amqplib's own 'close' listener fails the unconfirmed callbacks: they must not read as nacks.
    channel.prependListener('close', () => {
      closing = true;
    });
    channel.on('close', () => {
      // A connection closes its channels first and names its reason after: wait for it.
      queueMicrotask(() => {
        closed ??= broken ?? 'closed';
        for (const p of [...pending]) settle(p, lost(p, closed));
        held.length = 0;
      });
    });
    channel.on('drain', () => {
      writable = true;
      while (writable && held.length > 0) {
        const p = held.shift()!;
        // One that timed out while held is not sent.
        if (pending.has(p)) send(p);
      }
    });
    // A basic.return comes before the confirm of its message: the earliest unconfirmed publish
    // with its id and routing key is that message.
    channel.on('return', (r: Message) => {
      for (const p of pending) {
        if (
          p.sent &&
          p.returned === undefined &&
          p.id === r.properties.messageId &&
          p.routingKey === r.fields.routingKey
        ) {
          p.returned = `RabbitMQ returned ${p.id}: no queue is bound to exchange '${config.exchange}' with routing key '${p.routingKey}' (${(r.fields as { replyCode?: number }).replyCode} ${(r.fields as { replyText?: string }).replyText})`;
          break;
        }
      }
    });

    return {
      publish(m) {
        if (closing)
          return Promise.reject(new Error(`the RabbitMQ channel is closed: ${closed ?? broken ?? 'closed'}`));
        if (Buffer.byteLength(m.destination) > SHORT_STRING) {
          return Promise.reject(
            new Refused(
              `the routing key '${m.destination.slice(0, 40)}…' is longer than ${SHORT_STRING} bytes (from the template ${config.routingKey})`,
            ),
          );
        }
        const content = Buffer.from(m.body);
        return new Promise<void>((resolve, reject) => {
          const p: Pending = {
            id: m.id,
            routingKey: m.destination,
            content,
            options: {
              mandatory: true,
              persistent: true,
              messageId: m.id,
              contentType: 'application/json',
              // AMQP timestamps are whole seconds; ce-time carries the milliseconds.
              timestamp: Math.floor(m.createdAt.getTime() / 1000),
              type: m.type,
              headers: m.headers,
            },
            sent: false,
            resolve,
            reject,
            timer: setTimeout(() => {
              settle(
                p,
                new Error(
                  `RabbitMQ did not confirm ${m.id} within ${config.timeoutMs} ms${blocked === undefined ? '' : `: the broker blocked the connection (${blocked})`}`,
                ),
              );
            }, config.timeoutMs),
          };
          pending.add(p);
          const max = maxMessageSize.get(config);
          if (max !== undefined && content.length > max) {
            settle(p, tooLarge(p, max));
          } else if (writable && held.length === 0) {
            send(p);
          } else {
            // Flow control: the channel's write buffer is full; what follows waits for 'drain', in order.
            held.push(p);
          }
        });
      },
      async close() {
        closing = true;
        closed ??= 'the relay closed its connection';
        for (const p of [...pending])
          settle(p, new Error(`the RabbitMQ channel closed before confirming ${p.id}: ${closed}`));
        // A broker that does not answer the close must not hold the relay: the socket is dropped.
        let timer: NodeJS.Timeout | undefined;
        const gone = await Promise.race([
          model.close().then(
            () => true,
            () => true,
          ),
          new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), config.timeoutMs))),
        ]);
        clearTimeout(timer);
        if (!gone) (model.connection as unknown as { stream?: { destroy(): void } }).stream?.destroy();
      },
    };
  },
};
