import type { Broker } from './brokers.js';
import { optionalPackage } from '../../optional-package.js';
import { brokerUrl, textOption, withoutPassword } from './options.js';
import { type Publisher, Refused } from './publisher.js';
import { describe, invalid, knownKeys, safeInteger } from '../../validate.js';

type Client = typeof import('redis');

export interface RedisConfig {
  url: string;
  /** The stream key template, such as `orders` or `orders:{type}`. */
  stream: string;
  /** Trims each stream to about this many entries (`MAXLEN ~ n`) as entries are added; none when absent. */
  maxLen: number | null;
  /** How long a publish waits for its XADD reply (ms). */
  timeoutMs: number;
}

const KEYS = ['url', 'stream', 'maxLen', 'timeout'] as const;
/** A database number after the host, or nothing. */
const DATABASE = /^\/?(\d+)?$/;

/**
 * Replies that describe the server's state, not the message: a loading, busy, read-only
 * (failover), out-of-memory or misconfigured server, or a key that lives on another node. Sent
 * again after a back-off. Any other error reply (WRONGTYPE: the key holds something else than a
 * stream; NOPERM: the user may not write that key; ERR …) would be the same on every attempt.
 */
const TRANSIENT_REPLIES = new Set([
  'LOADING',
  'BUSY',
  'MISCONF',
  'READONLY',
  'OOM',
  'TRYAGAIN',
  'CLUSTERDOWN',
  'MASTERDOWN',
  'NOREPLICAS',
  'NOAUTH',
  'MOVED',
  'ASK',
]);

const load = () => optionalPackage<Client>(() => import('redis'), 'redis', 'a relay to Redis');

/** `promise`, or a failure saying what did not come within `ms`: a server that stopped answering. */
async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`Redis did not answer ${what} within ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Redis Streams: each message is one entry added with `XADD <stream> * …` (the entry id is the
 * server's), and counts as delivered on the XADD reply. The entry's fields, for a consumer to
 * read with XREAD, XREADGROUP or XRANGE:
 *
 * - `id`: the message's stable id, the same on every attempt (a consumer deduplicates on it: a
 *   stream takes a repeat as a new entry);
 * - `type`: the message type;
 * - `key`: the message key, absent when the message has none (an empty key stays distinct);
 * - `data`: the message's data as JSON text;
 * - `headers`: one JSON object of the message's own headers (a traceparent among them) and the
 *   CloudEvents attributes (`ce-id`, `ce-type`, …, `content-type`), every value a string; one
 *   field rather than one per header, so that no header name can shadow the fields above.
 *
 * Commands sent on one connection run in the order sent, so the entries of a partition follow its
 * commit order. A reply error that names the message (WRONGTYPE, …) is refused; a connection lost
 * or a reply that does not come is the server's, retried after a back-off.
 */
export const redis: Broker<RedisConfig> = {
  name: 'redis',
  templateOption: 'stream',
  window: 256,
  check(o) {
    knownKeys('to.redis', o, KEYS);
    const url = brokerUrl('to.redis.url', o.url, ['redis:', 'rediss:']);
    if (!DATABASE.test(url.pathname) || url.search || url.hash) {
      throw invalid(
        `to.redis.url may name a database number after the host, such as redis://127.0.0.1:6379/0, and nothing else (got ${describe(withoutPassword(url))})`,
      );
    }
    const stream = textOption('to.redis.stream', o.stream);
    const maxLen =
      o.maxLen === undefined || o.maxLen === null ? null : safeInteger('to.redis.maxLen', o.maxLen, 1);
    const timeoutMs = o.timeout === undefined ? 5000 : Number(o.timeout);
    if (!Number.isInteger(timeoutMs) || timeoutMs < 1)
      throw invalid(`to.redis.timeout must be a number of milliseconds (got ${describe(o.timeout)})`);
    return { url: url.href, stream, maxLen, timeoutMs };
  },
  template: (c) => c.stream,
  describe: (c) =>
    `redis ${withoutPassword(new URL(c.url))} stream ${c.stream}${c.maxLen === null ? '' : ` maxLen ~${c.maxLen}`}`,
  load,
  async connect(config): Promise<Publisher> {
    const { createClient, ErrorReply } = await load();
    const client = createClient({
      url: config.url,
      // A command sent while the connection is down fails at once rather than waiting in the
      // client for a reconnection: the relay backs off and publishes again on a new connection.
      disableOfflineQueue: true,
      socket: { reconnectStrategy: false, connectTimeout: config.timeoutMs },
    });
    // A lost connection fails the commands awaiting replies; its cause is kept for the next publish.
    let lastError: Error | undefined;
    client.on('error', (e: Error) => {
      lastError = e;
    });
    try {
      // The connection's first commands wait for their replies too: a frozen server answers none.
      await within(client.connect(), config.timeoutMs, 'on connecting');
    } catch (e) {
      if (client.isOpen) client.destroy();
      throw e;
    }
    const trim =
      config.maxLen === null
        ? undefined
        : { TRIM: { strategy: 'MAXLEN' as const, strategyModifier: '~' as const, threshold: config.maxLen } };
    return {
      async publish(m) {
        if (!client.isReady) {
          throw new Error(`the connection to Redis is lost${lastError ? `: ${lastError.message}` : ''}`);
        }
        const fields: Record<string, string> = { id: m.id, type: m.type };
        if (m.key !== null) fields.key = m.key;
        fields.data = m.body;
        fields.headers = JSON.stringify(m.headers);
        try {
          await within(
            client.xAdd(m.destination, '*', fields, trim),
            config.timeoutMs,
            `the XADD to ${m.destination}`,
          );
        } catch (e) {
          if (e instanceof ErrorReply && !TRANSIENT_REPLIES.has(e.message.split(' ', 1)[0]!)) {
            throw new Refused(`Redis refused the XADD to ${m.destination}: ${e.message}`, { cause: e });
          }
          throw e;
        }
      },
      async close() {
        // Replies still awaited fail now: close() would wait for them, from a server that may be gone.
        if (client.isOpen) client.destroy();
      },
    };
  },
};
