import { randomBytes } from 'node:crypto';
import type { Broker } from './brokers.js';
import { optionalPackage } from '../../optional-package.js';
import type { RelayMessage } from './envelope.js';
import { brokerUrl, textOption, withoutPassword } from './options.js';
import { type Publisher, Refused } from './publisher.js';
import { describe, invalid, knownKeys } from '../../validate.js';

type Client = typeof import('mqtt');

export interface MqttConfig {
  url: string;
  /** The topic template, such as `orders/{key}`. */
  topic: string;
  /** 1: delivered on PUBACK; 2: on PUBCOMP (the broker passes it on exactly once). */
  qos: 1 | 2;
  /** How long a publish waits for its acknowledgement (ms). */
  timeoutMs: number;
}

const KEYS = ['url', 'topic', 'qos', 'timeout'] as const;
/** The longest topic name MQTT encodes (a two-byte length). */
const MAX_TOPIC_BYTES = 65_535;
/** The CloudEvents attributes the envelope sends as `ce-*` headers, named as MQTT carries them. */
const CLOUDEVENTS_PREFIX = 'ce-';

/**
 * Reason codes of a PUBACK or PUBREC (0x80 and above refuse the message) that describe the
 * broker's state rather than the message: unavailable, busy, shutting down, a packet identifier
 * still in use, a rate or a quota exceeded. Sent again after a back-off; any other refusal (not
 * authorized, topic name invalid, payload format invalid, implementation specific such as a size
 * limit, …) would be the same on every attempt.
 */
const TRANSIENT_REASONS = new Set([0x88, 0x89, 0x8b, 0x91, 0x96, 0x97]);

/** What makes a topic name unpublishable, or null: wildcards, NUL, a `$` topic, too long. */
function topicProblem(topic: string): string | null {
  if (topic.length === 0) return 'it is empty';
  if (/[+#]/.test(topic)) return 'it holds the wildcard + or #';
  if (topic.includes('\u0000')) return 'it holds NUL';
  if (topic.startsWith('$')) return 'topics starting with $ are the broker’s own';
  if (Buffer.byteLength(topic) > MAX_TOPIC_BYTES) return `it is longer than ${MAX_TOPIC_BYTES} bytes`;
  return null;
}

/**
 * The MQTT 5 properties of a message, by the CloudEvents MQTT binding (binary mode): each
 * attribute a user property under its own name (`id`, `type`, `source`, `specversion`, `time`,
 * `subject`), the data's content type in the Content Type property; the message's own headers (a
 * traceparent among them) pass as user properties unchanged; and the id again as `message-id`,
 * the relay's id field on every broker.
 */
function properties(m: RelayMessage): { userProperties: Record<string, string>; contentType: string } {
  const userProperties: Record<string, string> = {};
  let contentType = 'application/json';
  for (const [name, value] of Object.entries(m.headers)) {
    if (name === 'content-type') contentType = value;
    else if (name.startsWith(CLOUDEVENTS_PREFIX))
      userProperties[name.slice(CLOUDEVENTS_PREFIX.length)] = value;
    else userProperties[name] = value;
  }
  userProperties['message-id'] = m.id;
  return { userProperties, contentType };
}

/** The size of a PUBLISH packet, an upper bound: compared with the broker's Maximum Packet Size. */
function packetSize(topic: string, body: string, props: ReturnType<typeof properties>): number {
  let size = 5 + 2 + Buffer.byteLength(topic) + 2 + 4 + 2; // fixed header, topic, packet id, property length, payload format
  size += 3 + Buffer.byteLength(props.contentType);
  for (const [name, value] of Object.entries(props.userProperties)) {
    size += 5 + Buffer.byteLength(name) + Buffer.byteLength(value);
  }
  return size + Buffer.byteLength(body);
}

const load = () => optionalPackage<Client>(() => import('mqtt'), 'mqtt', 'a relay to MQTT');

/**
 * MQTT 5: each message is published to its topic at QoS 1 or 2 and counts as delivered on its
 * PUBACK (QoS 1) or PUBCOMP (QoS 2); a reason code of 0x80 or above refuses it. A session of its
 * own per connection (a random client id, clean start, nothing kept after): the relay resends
 * what was not acknowledged, with the same ids. Publishes beyond the broker's Receive Maximum
 * (from its CONNACK: Mosquitto's max_inflight_messages) wait in the publisher, in call order,
 * for a slot: a broker may disconnect a client that sends more. A lost connection fails every
 * publish waiting; the relay backs off and connects again.
 */
export const mqtt: Broker<MqttConfig> = {
  name: 'mqtt',
  templateOption: 'topic',
  window: 256,
  check(o) {
    knownKeys('to.mqtt', o, KEYS);
    const url = brokerUrl('to.mqtt.url', o.url, ['mqtt:', 'mqtts:']);
    if ((url.pathname !== '' && url.pathname !== '/') || url.search || url.hash) {
      throw invalid(
        `to.mqtt.url names the broker alone, such as mqtt://127.0.0.1:1883: the topic goes in to.mqtt.topic (got ${describe(withoutPassword(url))})`,
      );
    }
    const topic = textOption('to.mqtt.topic', o.topic);
    const problem = topicProblem(topic.replace(/\{[a-z]+\}/g, 'x'));
    if (problem) {
      throw invalid(
        `to.mqtt.topic must be a topic name to publish to, levels separated by /, without the wildcards + and # or a leading $ (${problem}; got ${describe(topic)})`,
      );
    }
    if (o.qos === 0) {
      throw invalid(
        'to.mqtt.qos must be 1 or 2: at QoS 0 the broker acknowledges nothing, and a relay counts a message as delivered only on the broker’s acknowledgement',
      );
    }
    if (o.qos !== undefined && o.qos !== 1 && o.qos !== 2)
      throw invalid(`to.mqtt.qos must be 1 or 2 (got ${describe(o.qos)})`);
    const timeoutMs = o.timeout === undefined ? 5000 : Number(o.timeout);
    if (!Number.isInteger(timeoutMs) || timeoutMs < 1)
      throw invalid(`to.mqtt.timeout must be a number of milliseconds (got ${describe(o.timeout)})`);
    return { url: url.href, topic, qos: o.qos ?? 1, timeoutMs };
  },
  template: (c) => c.topic,
  describe: (c) => `mqtt ${withoutPassword(new URL(c.url))} topic ${c.topic} qos ${c.qos}`,
  load,
  async connect(config): Promise<Publisher> {
    const { connectAsync, ErrorWithReasonCode } = await load();
    const client = await connectAsync(
      config.url,
      {
        protocolVersion: 5,
        clientId: `ordo${randomBytes(8).toString('hex')}`,
        clean: true,
        // Reconnecting is the relay's: it resends from the first unacknowledged message.
        reconnectPeriod: 0,
        connectTimeout: config.timeoutMs,
        properties: { sessionExpiryInterval: 0 },
      },
      false,
    );
    const maximumQoS = client.serverProperties?.maximumQoS ?? 2;
    if (config.qos > maximumQoS) {
      // The broker would disconnect at the first publish; the relay shows this until it is changed.
      client.end(true);
      throw new Error(
        maximumQoS === 0
          ? 'the MQTT broker takes QoS 0 only, which it never acknowledges: a relay cannot deliver to it'
          : `the MQTT broker takes QoS ${maximumQoS} at most: set to.mqtt.qos to ${maximumQoS}`,
      );
    }
    const receiveMaximum = client.serverProperties?.receiveMaximum ?? 65_535;
    const maximumPacketSize = client.serverProperties?.maximumPacketSize ?? Infinity;

    interface Pending {
      send(): void;
      fail(e: Error): void;
    }
    /** Publishes sent and not yet acknowledged, and those waiting for a slot. */
    const pending = new Set<Pending>();
    const waiting: Pending[] = [];
    let inFlight = 0;
    let gone: Error | undefined;
    let lastError: Error | undefined;

    const lose = (e: Error) => {
      if (gone) return;
      gone = e;
      waiting.length = 0;
      for (const p of pending) p.fail(e);
      pending.clear();
      client.end(true);
    };
    const next = () => {
      while (!gone && inFlight < receiveMaximum && waiting.length > 0) waiting.shift()!.send();
    };
    client.on('error', (e) => {
      lastError = e;
    });
    client.on('disconnect', (packet) => {
      const reason =
        packet.properties?.reasonString ?? `reason code 0x${(packet.reasonCode ?? 0).toString(16)}`;
      lose(new Error(`the MQTT broker disconnected the relay: ${reason}`));
    });
    client.on('close', () => {
      lose(new Error(`the connection to the MQTT broker closed${lastError ? `: ${lastError.message}` : ''}`));
    });

    return {
      publish(m) {
        if (gone) return Promise.reject(gone);
        const problem = topicProblem(m.destination);
        if (problem) {
          return Promise.reject(
            new Refused(
              `'${m.destination}' is not an MQTT topic to publish to: ${problem} (from the template ${config.topic})`,
            ),
          );
        }
        const props = properties(m);
        const size = packetSize(m.destination, m.body, props);
        if (size > maximumPacketSize) {
          return Promise.reject(
            new Refused(
              `the message to ${m.destination} is ${size} bytes, more than the MQTT broker's Maximum Packet Size of ${maximumPacketSize}`,
            ),
          );
        }
        return new Promise<void>((resolve, reject) => {
          let timer: NodeJS.Timeout | undefined;
          const entry: Pending = {
            send() {
              inFlight++;
              timer = setTimeout(
                () =>
                  lose(
                    new Error(
                      `the MQTT broker did not acknowledge a publish to ${m.destination} within ${config.timeoutMs} ms`,
                    ),
                  ),
                config.timeoutMs,
              );
              client.publish(
                m.destination,
                m.body,
                { qos: config.qos, properties: { ...props, payloadFormatIndicator: true } },
                (err) => {
                  clearTimeout(timer);
                  // Failed already, with the connection.
                  if (!pending.delete(entry)) return;
                  inFlight--;
                  if (!err) resolve();
                  else if (err instanceof ErrorWithReasonCode && !TRANSIENT_REASONS.has(err.code)) {
                    reject(
                      new Refused(`the MQTT broker refused ${m.destination}: ${err.message}`, { cause: err }),
                    );
                  } else reject(err);
                  next();
                },
              );
            },
            fail(e) {
              clearTimeout(timer);
              reject(e);
            },
          };
          pending.add(entry);
          if (inFlight < receiveMaximum && waiting.length === 0) entry.send();
          else waiting.push(entry);
        });
      },
      async close() {
        lose(new Error('the relay gave the MQTT connection up'));
      },
    };
  },
};
