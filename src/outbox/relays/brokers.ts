import type { Publisher } from './publisher.js';
import { mqtt } from './mqtt.js';
import { nats } from './nats.js';
import { rabbitmq } from './rabbitmq.js';
import { redis } from './redis.js';
import { webhook } from './webhook.js';

/**
 * What a relay needs of a broker: its options checked once (refused with what to change), the
 * template that names each message's destination, a description without secrets, and a
 * connection that publishes with confirmation.
 */
export interface Broker<C> {
  readonly name: RelayBroker;
  /** The option holding the destination template (`subject`, `routingKey`, …). */
  readonly templateOption: string;
  /** Most unconfirmed publishes per partition, unless the relay says otherwise. */
  readonly window: number;
  /** The largest window that keeps a partition's order on this broker (a webhook: 1). */
  readonly maxWindow?: number;
  check(options: Record<string, unknown>): C;
  template(config: C): string;
  describe(config: C): string;
  /** Loads the client library (an optional peer dependency): invalid_argument naming the install when missing. */
  load(): Promise<unknown>;
  connect(config: C): Promise<Publisher>;
}

export type RelayBroker = 'nats' | 'rabbitmq' | 'redis' | 'mqtt' | 'webhook';

export const BROKERS: { readonly [B in RelayBroker]: Broker<any> } = { nats, rabbitmq, redis, mqtt, webhook };

/** The brokers a relay may publish to, as `to` names them. */
export const RELAY_BROKERS = Object.keys(BROKERS) as RelayBroker[];
