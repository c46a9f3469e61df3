import type { Broker } from './brokers.js';
import { optionalPackage } from '../../optional-package.js';
import { brokerUrl, textOption, withoutPassword } from './options.js';
import { type Publisher, Refused } from './publisher.js';
import { describe, invalid, knownKeys } from '../../validate.js';

type Transport = typeof import('@nats-io/transport-node');
type JetStream = typeof import('@nats-io/jetstream');

export interface NatsConfig {
  servers: string[];
  /** The subject template, such as `orders.{type}`. */
  subject: string;
  /** How long a publish waits for its PubAck (ms). */
  timeoutMs: number;
}

const KEYS = ['servers', 'subject', 'timeout'] as const;
/** A subject's tokens: no spaces or wildcards, none empty (the template fields may add dots). */
const SUBJECT = /^[^\s.*>]+(\.[^\s.*>]+)*$/;

/** Both clients, as one install. */
const BOTH = '@nats-io/transport-node @nats-io/jetstream';
const load = async () =>
  Promise.all([
    optionalPackage<Transport>(
      () => import('@nats-io/transport-node'),
      '@nats-io/transport-node',
      'a relay to NATS',
      BOTH,
    ),
    optionalPackage<JetStream>(
      () => import('@nats-io/jetstream'),
      '@nats-io/jetstream',
      'a relay to NATS',
      BOTH,
    ),
  ]);

/**
 * NATS JetStream: each message is published to its subject with `Nats-Msg-Id` set to its id, so
 * the stream drops a repeat within its duplicate window, and counts as delivered on its PubAck
 * (one marked duplicate too). A subject no stream takes, or one the server refuses, is refused.
 */
export const nats: Broker<NatsConfig> = {
  name: 'nats',
  templateOption: 'subject',
  window: 256,
  check(o) {
    knownKeys('to.nats', o, KEYS);
    const list = Array.isArray(o.servers) ? o.servers : [o.servers];
    if (list.length === 0)
      throw invalid('to.nats.servers must name at least one server, such as nats://127.0.0.1:4222');
    const servers = list.map((s, i) => brokerUrl(`to.nats.servers[${i}]`, s, ['nats:', 'tls:']).href);
    const subject = textOption('to.nats.subject', o.subject);
    const literal = subject.replace(/\{[a-z]+\}/g, 'x');
    if (!SUBJECT.test(literal)) {
      throw invalid(
        `to.nats.subject must be a NATS subject: tokens separated by dots, without spaces or the wildcards * and > (got ${describe(subject)})`,
      );
    }
    const timeoutMs = o.timeout === undefined ? 5000 : Number(o.timeout);
    if (!Number.isInteger(timeoutMs) || timeoutMs < 1)
      throw invalid(`to.nats.timeout must be a number of milliseconds (got ${describe(o.timeout)})`);
    return { servers, subject, timeoutMs };
  },
  template: (c) => c.subject,
  describe: (c) => `nats ${c.servers.map((s) => withoutPassword(new URL(s))).join(',')} subject ${c.subject}`,
  load,
  async connect(config): Promise<Publisher> {
    const [{ connect, headers }, { jetstream, jetstreamManager }] = await load();
    const nc = await connect({ servers: config.servers, maxReconnectAttempts: -1 });
    const js = jetstream(nc);
    const jsm = await jetstreamManager(nc, { timeout: config.timeoutMs });
    return {
      async publish(m) {
        if (!SUBJECT.test(m.destination)) {
          throw new Refused(`'${m.destination}' is not a NATS subject (from the template ${config.subject})`);
        }
        const h = headers();
        for (const [name, value] of Object.entries(m.headers)) h.set(name, value);
        try {
          await js.publish(m.destination, m.body, { msgID: m.id, headers: h, timeout: config.timeoutMs });
        } catch (e) {
          const name = (e as Error).constructor?.name;
          // The stream refused the message (too large, …): it would answer the same again.
          if (name === 'JetStreamApiError') {
            throw new Refused(`NATS refused ${m.destination}: ${(e as Error).message}`, { cause: e });
          }
          // Nobody answered: no stream takes the subject, or JetStream is not up yet (a server
          // restarting). Only the first is the message's: JetStream says so when asked.
          if (name === 'JetStreamNotEnabled' && (await noStreamTakes(jsm, m.destination))) {
            throw new Refused(`NATS refused ${m.destination}: no stream takes this subject`, { cause: e });
          }
          throw e;
        }
      },
      async close() {
        await nc.close();
      },
    };
  },
};

/** Whether JetStream answers that no stream takes `subject` (false when it does not answer). */
async function noStreamTakes(
  jsm: { streams: { find(subject: string): Promise<string> } },
  subject: string,
): Promise<boolean> {
  try {
    await jsm.streams.find(subject);
    return false;
  } catch (e) {
    return (e as Error).constructor?.name === 'StreamNotFoundError';
  }
}
