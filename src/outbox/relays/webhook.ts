import type { Broker } from './brokers.js';
import { optionalPackage } from '../../optional-package.js';
import { parseTemplate, type RelayMessage } from './envelope.js';
import { textOption } from './options.js';
import { type Publisher, Refused, Unavailable } from './publisher.js';
import { durationOption, formatDuration } from '../../durations.js';
import { describe, invalid, knownKeys, plainObject } from '../../validate.js';

type StandardWebhooks = typeof import('standardwebhooks');

export interface WebhookConfig {
  /**
   * The URL template, such as `https://example.com/hooks/{topic}`: its fields only in the path
   * or the query, so every request goes to the one host the configuration names.
   */
  url: string;
  /** `whsec_` secrets: each signs every request (several while a new one replaces an old one). */
  secrets: string[];
  /** How long one attempt waits for the receiver's answer (ms). */
  timeoutMs: number;
  /** Headers sent with every request, such as an Authorization the receiver asks for. */
  headers: Record<string, string>;
}

const KEYS = ['url', 'secret', 'timeout', 'headers'] as const;
const EXAMPLE_URL = 'https://example.com/hooks/{topic}';
/** The longest wait for an answer: the partition sends nothing else meanwhile. */
const MAX_TIMEOUT_MS = 10 * 60_000;
/**
 * The longest Retry-After honoured: a receiver's mistaken header (a date years ahead) must not
 * silence a relay for longer than this; it asks again then, and may be told to wait again.
 */
const MAX_RETRY_AFTER_MS = 24 * 3_600_000;
/** The most of a receiver's refusal kept in the error (and in the dead letter). */
const MAX_ANSWER_EXCERPT = 200;
/** The most of a response body read before the connection is given up (a 2xx's body is not wanted). */
const MAX_BODY_READ = 64 * 1024;

/** The headers the relay itself sets on every request: a configured header may not replace them. */
const OWN_HEADERS = new Set(['webhook-id', 'webhook-timestamp', 'webhook-signature', 'content-type']);
/**
 * Headers that describe one HTTP connection rather than the message: fetch sets them (and hangs
 * or fails on a content-length or transfer-encoding given by hand). A configured one is refused;
 * a message's own (copied from an incoming request, say) is left out of the relay's request.
 */
const CONNECTION_HEADERS = new Set([
  'host',
  'content-length',
  'transfer-encoding',
  'connection',
  'keep-alive',
  'upgrade',
  'expect',
  'te',
  'trailer',
  'proxy-connection',
]);
/** The Fetch standard's bad ports: fetch never connects to them, so a URL naming one is refused at once. */
const BAD_PORTS = new Set([
  1, 7, 9, 11, 13, 15, 17, 19, 20, 21, 22, 23, 25, 37, 42, 43, 53, 69, 77, 79, 87, 95, 101, 102, 103, 104,
  109, 110, 111, 113, 115, 117, 119, 123, 135, 137, 139, 143, 161, 179, 389, 427, 465, 512, 513, 514, 515,
  526, 530, 531, 532, 540, 548, 554, 556, 563, 587, 601, 636, 989, 990, 993, 995, 1719, 1720, 1723, 2049,
  3659, 4045, 4190, 5060, 5061, 6000, 6566, 6665, 6666, 6667, 6668, 6669, 6679, 6697, 10080,
]);
/** What HTTP carries in a header (fetch refuses anything else). */
const HEADER_RULE =
  "a name of letters, digits and !#$%&'*+-.^_`|~, a value without line breaks or characters beyond U+00FF";
/** A secret as the spec serializes it: `whsec_`, then standard base64 with its padding. */
const SECRET = /^whsec_((?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?)$/;
/** The spec's symmetric secret: at least 24 random bytes, at most 64 (512 bits). */
const SECRET_BYTES = [24, 64] as const;
/** The scheme and authority of the template, which no field may be part of. */
const AUTHORITY = /^https?:\/\/[^/?#\\]*/i;

const load = () =>
  optionalPackage<StandardWebhooks>(
    () => import('standardwebhooks'),
    'standardwebhooks',
    'a relay to webhooks',
  );

function checkSecret(what: string, value: unknown): string {
  const example = `whsec_ followed by ${SECRET_BYTES[0]} to ${SECRET_BYTES[1]} random bytes in base64 (such as 'whsec_' + the output of openssl rand -base64 32)`;
  // A secret is never echoed in an error: it may be a real one with a typo.
  if (typeof value !== 'string') throw invalid(`${what} must be ${example} (got ${describe(value)})`);
  const match = SECRET.exec(value);
  if (!match) {
    throw invalid(
      `${what} must be ${example} (got ${value.startsWith('whsec_') ? 'text after whsec_ that is not base64 with its = padding' : `a text of ${value.length} characters not starting with whsec_`})`,
    );
  }
  const bytes = Buffer.from(match[1]!, 'base64').length;
  if (bytes < SECRET_BYTES[0] || bytes > SECRET_BYTES[1]) {
    throw invalid(`${what} must be ${example} (got a secret of ${bytes} bytes)`);
  }
  return value;
}

/**
 * The URL template: http: or https:, its fields only after the host (a message must not choose
 * where it is sent), no credentials (fetch refuses them: send them in headers), no fragment
 * (never sent), no port fetch refuses.
 */
function checkUrl(value: unknown): string {
  const url = textOption('to.webhook.url', value);
  const authority = AUTHORITY.exec(url);
  if (!authority) {
    throw invalid(
      `to.webhook.url must start with http:// or https://, such as ${EXAMPLE_URL} (got ${describe(url)})`,
    );
  }
  if (authority[0].includes('{')) {
    throw invalid(
      `to.webhook.url may have template fields only in its path or query, not in the host, such as ${EXAMPLE_URL} (got ${describe(url)})`,
    );
  }
  let parsed: URL;
  try {
    parsed = new URL(url.replace(/\{[a-z]+\}/g, 'x'));
  } catch {
    throw invalid(`to.webhook.url must be a URL such as ${EXAMPLE_URL} (got ${describe(url)})`);
  }
  if (parsed.username || parsed.password) {
    throw invalid(
      `to.webhook.url must not hold credentials: send them as a header instead, such as headers: { authorization: 'Bearer …' } (got ${shownUrl(url)})`,
    );
  }
  if (parsed.hash || url.includes('#')) {
    throw invalid(`to.webhook.url must not have a #fragment: it is never sent (got ${shownUrl(url)})`);
  }
  if (parsed.port && BAD_PORTS.has(Number(parsed.port))) {
    throw invalid(
      `to.webhook.url names port ${parsed.port}, which fetch never connects to (a port of another protocol): use another port (got ${shownUrl(url)})`,
    );
  }
  return url;
}

function checkHeaders(value: unknown): Record<string, string> {
  if (value === undefined) return {};
  const headers: Record<string, string> = {};
  for (const [name, v] of Object.entries(plainObject('to.webhook.headers', value))) {
    const what = `to.webhook.headers[${JSON.stringify(name)}]`;
    const lower = name.toLowerCase();
    if (OWN_HEADERS.has(lower) || lower.startsWith('ce-')) {
      throw invalid(
        `${what} is set by the relay on every request (webhook-*, ce-*, content-type): remove it`,
      );
    }
    if (CONNECTION_HEADERS.has(lower)) {
      throw invalid(`${what} belongs to the HTTP connection, which fetch manages: remove it`);
    }
    if (typeof v !== 'string') throw invalid(`${what} must be a string (got ${describe(v)})`);
    try {
      new Headers([[name, v]]);
    } catch {
      throw invalid(`${what} must be an HTTP header: ${HEADER_RULE}`);
    }
    headers[lower] = v;
  }
  return headers;
}

/** A URL template as status and errors show it: no credentials, query values hidden unless template fields. */
function shownUrl(template: string): string {
  const query = template.indexOf('?');
  const base = template
    .slice(0, query === -1 ? undefined : query)
    .replace(/^(https?:\/\/)[^@/?#\\]*@/i, '$1');
  if (query === -1) return base;
  const params = template
    .slice(query + 1)
    .split('&')
    .map((p) => {
      const eq = p.indexOf('=');
      if (eq === -1) return p;
      const v = p.slice(eq + 1);
      return `${p.slice(0, eq)}=${/^(\{[a-z]+\})*$/.test(v) ? v : '***'}`;
    });
  return `${base}?${params.join('&')}`;
}

/**
 * A header value as CloudEvents' HTTP binding writes it: space, `"`, `%` and every character
 * beyond printable ASCII percent-encoded as UTF-8. HTTP carries no other characters reliably, so
 * a key or id beyond ASCII reaches the receiver encoded rather than being refused.
 */
const headerValue = (v: string): string =>
  v.replace(/[^\x21\x23\x24\x26-\x7e]/gu, (c) =>
    [...Buffer.from(c)].map((b) => `%${b.toString(16).toUpperCase().padStart(2, '0')}`).join(''),
  );

/** The seconds or HTTP date of a Retry-After, in ms from now; undefined when absent or unreadable. */
function retryAfter(value: string | null): number | undefined {
  if (value === null) return undefined;
  const text = value.trim();
  // Seconds, or an HTTP date, which starts with the day's name (Date.parse reads much else too).
  const ms = /^\d+$/.test(text)
    ? Number(text) * 1000
    : /^[A-Za-z]{3}/.test(text)
      ? Date.parse(text) - Date.now()
      : NaN;
  return Number.isNaN(ms) ? undefined : Math.min(Math.max(0, ms), MAX_RETRY_AFTER_MS);
}

/** Reads at most `limit` bytes of a response's body, then gives the rest up. */
async function readSome(res: Response, limit: number): Promise<string> {
  if (!res.body) return '';
  const reader = res.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  try {
    while (size < limit) {
      const { done, value } = await reader.read();
      if (done) break;
      chunks.push(value);
      size += value.length;
    }
  } finally {
    if (size >= limit) await reader.cancel().catch(() => undefined);
    reader.releaseLock();
  }
  return Buffer.concat(chunks).toString('utf8', 0, Math.min(size, limit));
}

/**
 * Webhooks by the Standard Webhooks specification: each message is POSTed to its URL with its
 * data as the JSON body, `webhook-id` = its stable id, `webhook-timestamp` = this attempt's second,
 * `webhook-signature` = one `v1,` HMAC-SHA256 of `id.timestamp.body` per secret (made by the
 * standardwebhooks package), its CloudEvents attributes and own headers beside them. A 2xx
 * delivers it. A 3xx is refused and not followed (the spec: update the URL instead), as is a
 * 4xx: the receiver refuses this message, which is retried with back-off and parked after
 * maxAttempts. A 429 or 503 waits for its Retry-After; any other 5xx, a timeout or a connection
 * that fails is the receiver's outage, retried after the back-off without counting.
 *
 * The spec asks that an id be chosen by the sender and hold no `.`: ids here are chosen by the
 * application that appends (its messageId) or derived from the topic, whose names may hold a `.`.
 * Splitting `id.timestamp.body` elsewhere would leave a body that starts with digits and a `.`,
 * which is JSON only when the data is a bare number.
 */
export const webhook: Broker<WebhookConfig> = {
  name: 'webhook',
  templateOption: 'url',
  // Requests sent together may arrive, and be handled, in any order (each may take its own
  // connection): one request at a time per partition keeps each key's order; partitions give
  // the parallelism.
  window: 1,
  maxWindow: 1,
  check(o) {
    knownKeys('to.webhook', o, KEYS);
    const url = checkUrl(o.url);
    const list = Array.isArray(o.secret) ? o.secret : [o.secret];
    if (list.length === 0) {
      throw invalid(
        `to.webhook.secret must be a whsec_ secret, or several while rotating: ['whsec_…', 'whsec_…']`,
      );
    }
    const secrets = list.map((s, i) =>
      checkSecret(Array.isArray(o.secret) ? `to.webhook.secret[${i}]` : 'to.webhook.secret', s),
    );
    const timeoutMs = durationOption('to.webhook.timeout', o.timeout ?? '10s', 1, MAX_TIMEOUT_MS);
    return { url, secrets, timeoutMs, headers: checkHeaders(o.headers) };
  },
  template: (c) => c.url,
  describe: (c) =>
    `webhook POST ${shownUrl(c.url)} signed with ${c.secrets.length} secret${c.secrets.length === 1 ? '' : 's'}, timeout ${formatDuration(c.timeoutMs)}`,
  load,
  async connect(config): Promise<Publisher> {
    const { Webhook } = await load();
    const signers = config.secrets.map((s) => new Webhook(s));
    const template = parseTemplate(config.url).template!;
    // Each field is percent-encoded: a key holding `/`, `?` or `#` stays within its segment.
    const urlOf = (m: RelayMessage) =>
      template.render({
        topic: encodeURIComponent(m.topic),
        type: encodeURIComponent(m.type),
        key: encodeURIComponent(m.key ?? ''),
        partition: String(m.partition),
      });
    return {
      async publish(m) {
        const url = urlOf(m);
        const where = `webhook POST ${shownUrl(url)}`;
        const headers = new Headers();
        for (const [name, value] of Object.entries(m.headers)) {
          const lower = name.toLowerCase();
          if (CONNECTION_HEADERS.has(lower)) continue;
          try {
            headers.set(name, lower.startsWith('ce-') ? headerValue(value) : value);
          } catch (e) {
            throw new Refused(
              `message ${m.id} cannot go over HTTP: its header ${JSON.stringify(name)} is not an HTTP header (${HEADER_RULE})`,
              { cause: e },
            );
          }
        }
        for (const [name, value] of Object.entries(config.headers)) headers.set(name, value);
        const id = headerValue(m.id);
        const now = new Date();
        headers.set('webhook-id', id);
        headers.set('webhook-timestamp', String(Math.floor(now.getTime() / 1000)));
        headers.set('webhook-signature', signers.map((s) => s.sign(id, now, m.body)).join(' '));
        headers.set('content-type', 'application/json');
        let res: Response;
        try {
          res = await fetch(url, {
            method: 'POST',
            body: m.body,
            headers,
            redirect: 'manual',
            signal: AbortSignal.timeout(config.timeoutMs),
          });
        } catch (e) {
          const err = e as Error & { cause?: { code?: string; message?: string } };
          if (err.name === 'TimeoutError') {
            throw new Error(`${where}: no answer within ${formatDuration(config.timeoutMs)}`, { cause: e });
          }
          // undici refused to build this request (a header it will not send): the same next time.
          if (err.cause?.code === 'UND_ERR_INVALID_ARG') {
            throw new Refused(`${where}: message ${m.id} cannot go over HTTP: ${err.cause.message}`, {
              cause: e,
            });
          }
          throw new Error(`${where} failed: ${err.cause?.message ?? err.message}`, { cause: e });
        }
        if (res.status >= 200 && res.status < 300) {
          // Delivered on the status; the body is read (or given up) only to free the connection.
          void readSome(res, MAX_BODY_READ).catch(() => undefined);
          return;
        }
        const excerpt = (await readSome(res, MAX_BODY_READ).catch(() => ''))
          .replace(/\s+/g, ' ')
          .trim()
          .slice(0, MAX_ANSWER_EXCERPT);
        let answer = `${where} answered ${res.status}${res.statusText ? ` ${res.statusText}` : ''}`;
        if (res.status >= 300 && res.status < 400) {
          const location = res.headers.get('location');
          answer += location ? ` to ${location}: redirects are not followed, point the url there` : '';
        }
        if (excerpt) answer += `: ${excerpt}`;
        if (res.status === 429 || res.status === 503) {
          const ms = retryAfter(res.headers.get('retry-after'));
          if (ms !== undefined)
            throw new Unavailable(`${answer} (Retry-After ${formatDuration(Math.ceil(ms))})`, ms);
          throw new Error(answer);
        }
        if (res.status >= 500) throw new Error(answer);
        throw new Refused(answer);
      },
      async close() {
        // No connection of the relay's own: each request ends within its timeout on fetch's pool.
      },
    };
  },
};
