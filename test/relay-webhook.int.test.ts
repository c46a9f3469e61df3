// A relay to webhooks, against a receiver started here that verifies every request with the
// standardwebhooks package, as a receiver by the Standard Webhooks specification does: every
// committed message is delivered with a valid signature and its stable webhook-id, in commit
// order per key; a 500 or a timeout is retried and holds the key's later messages back; a 429
// is waited out for its Retry-After; a 4xx or 3xx is parked and the others go on; several
// secrets sign side by side; bad configuration is refused at creation.
import { once } from 'node:events';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { Webhook } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo, OrdoError } from '../src/index.js';
import { type OwnPostgres, ownPostgres } from './support/own-postgres.js';
import {
  type Arrival,
  appendLoad,
  checkArrivals,
  expectCloudEvents,
  uniqueName,
} from './support/relay-load.js';
import { until } from './support/until.js';

const SECRET = `whsec_${Buffer.alloc(32, 7).toString('base64')}`;
const OLD_SECRET = `whsec_${Buffer.alloc(24, 9).toString('base64')}`;
const OTHER_SECRET = `whsec_${Buffer.alloc(32, 1).toString('base64')}`;

let server: OwnPostgres;
let ordo: Ordo;

beforeAll(async () => {
  server = await ownPostgres();
  ordo = await createOrdo({ databaseUrl: server.url });
});
afterAll(async () => {
  await ordo?.close();
  await server?.stop();
});

/** One request as the receiver saw it. */
interface Request {
  path: string;
  id: string;
  /** When it arrived (performance.now()). */
  at: number;
  /** Its attempt for this webhook-id, from 1. */
  attempt: number;
  body: string;
  data: { key: string; seq: number; label: string };
  headers: Record<string, string>;
  /** What the receiver answered; 0 when it never did. */
  status: number;
  /** When the receiver answered it (performance.now()). */
  answeredAt?: number;
  /** When the sender gave up a request never answered (performance.now()). */
  abandonedAt?: number;
}

/** What the receiver answers a request: a status (and headers, perhaps after a while), or nothing at all. */
type Answer = number | { status: number; headers?: Record<string, string>; afterMs?: number } | 'never';

interface Receiver {
  url: string;
  requests: Request[];
  /** Requests whose signature did not verify with the receiver's secrets: none, ever. */
  unverified: string[];
  /** The requests answered 2xx, as arrivals for checkArrivals. */
  delivered(): Arrival[];
  close(): Promise<void>;
}

/**
 * A webhook receiver on a free port. Every request must verify with each of `secrets` (a
 * receiver that knows any one of them accepts it); `answer` decides what it is told.
 */
async function receiver(
  secrets: string[],
  answer: (r: Omit<Request, 'status'>) => Answer = () => 200,
): Promise<Receiver> {
  const verifiers = secrets.map((s) => new Webhook(s));
  const requests: Request[] = [];
  const unverified: string[] = [];
  const attempts = new Map<string, number>();
  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const at = performance.now();
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const body = Buffer.concat(chunks).toString('utf8');
    const headers: Record<string, string> = {};
    for (const [k, v] of Object.entries(req.headers)) headers[k] = Array.isArray(v) ? v.join(', ') : v!;
    for (const [i, v] of verifiers.entries()) {
      try {
        v.verify(body, headers);
      } catch (e) {
        unverified.push(`${headers['webhook-id']} with secret ${i}: ${(e as Error).message}`);
        res.writeHead(401).end();
        return;
      }
    }
    const id = headers['webhook-id']!;
    const attempt = (attempts.get(id) ?? 0) + 1;
    attempts.set(id, attempt);
    const seen = { path: req.url!, id, at, attempt, body, data: JSON.parse(body), headers };
    const a = answer(seen);
    const request: Request = { ...seen, status: 0 };
    requests.push(request);
    if (a === 'never') {
      res.on('close', () => (request.abandonedAt = performance.now()));
      return;
    }
    const {
      status,
      headers: extra,
      afterMs,
    } = typeof a === 'number' ? { status: a, headers: {}, afterMs: 0 } : a;
    if (afterMs) await sleep(afterMs);
    request.status = status;
    res.writeHead(status, extra).end(status >= 300 ? `answer ${status}` : 'ok');
    request.answeredAt = performance.now();
  };
  const http = createServer((req, res) => {
    handle(req, res).catch((e: unknown) => {
      unverified.push(`the receiver failed: ${(e as Error).message}`);
      res.writeHead(500).end();
    });
  });
  http.listen(0, '127.0.0.1');
  await once(http, 'listening');
  const { port } = http.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    unverified,
    delivered: () =>
      requests
        .filter((r) => r.status >= 200 && r.status < 300)
        .map((r) => ({ id: r.id, data: r.data, headers: r.headers })),
    async close() {
      http.closeAllConnections();
      http.close();
      await once(http, 'close');
    },
  };
}

const caughtUp = async (relay: { lag(): Promise<{ messagesBehind: number }> }, ms = 15_000) =>
  until('the relay caught up', async () => (await relay.lag()).messagesBehind === 0, ms);

/** Appends messages of one key, in order, in one transaction. */
const appendKey = (topic: string, key: string, labels: string[], headers?: Record<string, string>) =>
  ordo.outbox.append(
    topic,
    labels.map((label, i) => ({ type: 'placed', key, data: { key, seq: i + 1, label }, headers })),
  );

describe('relay to a webhook (Standard Webhooks)', () => {
  it('delivers every committed message once, signed, in commit order per key, with its id and CloudEvents attributes', async () => {
    const rx = await receiver([SECRET]);
    const topic = uniqueName('t');
    const relay = await ordo.outbox.relay({
      name: uniqueName('to_webhook'),
      topic,
      partitions: 4,
      to: { webhook: { url: `${rx.url}/hooks/{topic}/{partition}?type={type}`, secret: SECRET } },
    });
    try {
      const committed = await appendLoad(ordo, topic);
      await caughtUp(relay, 30_000);
      expect(rx.unverified).toEqual([]);
      const got = rx.delivered();
      expect(checkArrivals(got, committed)).toBe(0);
      expect(rx.requests.length).toBe(committed.length);
      for (const a of got) expectCloudEvents(a, topic);
      for (const r of rx.requests) {
        expect(r.path).toMatch(new RegExp(`^/hooks/${topic}/[0-3]\\?type=placed$`));
        expect(r.headers['webhook-signature']).toMatch(/^v1,[A-Za-z0-9+/]+=*$/);
        expect(r.headers['content-type']).toBe('application/json');
        expect(Math.abs(Number(r.headers['webhook-timestamp']) - Date.now() / 1000)).toBeLessThan(60);
      }
      expect(relay.state()).toMatchObject({
        broker: 'webhook',
        state: 'running',
        delivered: committed.length,
        lastError: null,
      });
      expect(relay.state().target).toBe(
        `webhook POST ${rx.url}/hooks/{topic}/{partition}?type={type} signed with 1 secret, timeout 10s`,
      );
    } finally {
      await relay.stop();
      await rx.close();
    }
  });

  it('retries a message the receiver answers 500, holding back the later messages of its key', async () => {
    const topic = uniqueName('t');
    const rx = await receiver([SECRET], (r) => (r.data.label === 'flaky' && r.attempt <= 2 ? 500 : 200));
    await appendKey(topic, 'a', ['first', 'flaky', 'after']);
    await appendKey(topic, 'b', ['other']);
    const relay = await ordo.outbox.relay({
      name: uniqueName('flaky'),
      topic,
      retryDelay: '10ms',
      to: { webhook: { url: `${rx.url}/hooks`, secret: SECRET } },
    });
    try {
      await caughtUp(relay);
      expect(rx.unverified).toEqual([]);
      const flaky = rx.requests.filter((r) => r.data.label === 'flaky');
      expect(flaky.map((r) => r.status)).toEqual([500, 500, 200]);
      expect(new Set(flaky.map((r) => r.id)).size).toBe(1);
      // The key's next message went out only after the retried one was delivered.
      const after = rx.requests.find((r) => r.data.label === 'after')!;
      expect(after.at).toBeGreaterThan(flaky[2]!.at);
      expect(rx.delivered().map((a) => a.data.label)).toEqual(['first', 'flaky', 'after', 'other']);
      expect(await ordo.outbox.deadLetters(relay.name)).toEqual([]);
      expect(relay.state()).toMatchObject({ state: 'running', delivered: 4 });
      expect(relay.state().lastError).toMatch(/webhook POST http:\/\/127\.0\.0\.1:\d+\/hooks answered 500/);
    } finally {
      await relay.stop();
      await rx.close();
    }
  });

  it("waits a 429's or a 503's Retry-After before the next attempt", async () => {
    const topic = uniqueName('t');
    let retryDate = 0;
    let thirdArrived = 0;
    const rx = await receiver([SECRET], (r) => {
      if (r.data.label !== 'patient') return 200;
      // New messages while the relay waits: their notifications must not cut the wait short.
      if (r.attempt === 1) {
        setTimeout(() => void appendKey(topic, 'b', ['meanwhile']), 100);
        return { status: 429, headers: { 'retry-after': '1' } };
      }
      if (r.attempt === 2) {
        // Two seconds ahead, cut to its second: more than one second ahead.
        const date = new Date(Date.now() + 2000).toUTCString();
        retryDate = Date.parse(date);
        return { status: 503, headers: { 'retry-after': date } };
      }
      thirdArrived = Date.now();
      return 200;
    });
    await appendKey(topic, 'a', ['patient']);
    // The back-off alone would try again within milliseconds.
    const relay = await ordo.outbox.relay({
      name: uniqueName('retry_after'),
      topic,
      retryDelay: '10ms',
      maxRetryDelay: '20ms',
      to: { webhook: { url: `${rx.url}/hooks`, secret: SECRET } },
    });
    try {
      await caughtUp(relay);
      const [first, second, third] = rx.requests;
      expect(rx.requests.map((r) => `${r.data.label} ${r.status}`)).toEqual([
        'patient 429',
        'patient 503',
        'patient 200',
        'meanwhile 200',
      ]);
      // Counted from the answer: the relay cannot have read it any sooner.
      expect(second!.at - first!.answeredAt!).toBeGreaterThanOrEqual(995);
      expect(thirdArrived).toBeGreaterThanOrEqual(retryDate - 5);
      expect(third!.at - second!.answeredAt!).toBeGreaterThanOrEqual(900);
      expect(relay.state().lastError).toMatch(
        /answered 503 Service Unavailable: answer 503 \(Retry-After \d/,
      );
      expect(await ordo.outbox.deadLetters(relay.name)).toEqual([]);
    } finally {
      await relay.stop();
      await rx.close();
    }
  });

  it('retries a request the receiver does not answer within the timeout', async () => {
    const topic = uniqueName('t');
    const rx = await receiver([SECRET], (r) => (r.data.label === 'slow' && r.attempt === 1 ? 'never' : 200));
    await appendKey(topic, 'a', ['slow', 'after']);
    const relay = await ordo.outbox.relay({
      name: uniqueName('timeout'),
      topic,
      retryDelay: '10ms',
      to: { webhook: { url: `${rx.url}/hooks`, secret: SECRET, timeout: '200ms' } },
    });
    try {
      await caughtUp(relay);
      const slow = rx.requests.filter((r) => r.data.label === 'slow');
      expect(slow.map((r) => r.status)).toEqual([0, 200]);
      expect(slow[1]!.id).toBe(slow[0]!.id);
      // The first was given up (its connection closed) before the second went out.
      expect(slow[1]!.at).toBeGreaterThanOrEqual(slow[0]!.abandonedAt!);
      expect(rx.delivered().map((a) => a.data.label)).toEqual(['slow', 'after']);
      expect(relay.state().lastError).toMatch(/no answer within 200ms/);
    } finally {
      await relay.stop();
      await rx.close();
    }
  });

  it('stop() sends nothing more once called: the request in flight is answered and acknowledged, the rest waits for the next relay', async () => {
    const topic = uniqueName('t');
    const rx = await receiver([SECRET], () => ({ status: 200, afterMs: 50 }));
    await appendKey(
      topic,
      'a',
      Array.from({ length: 40 }, (_, i) => `m${i + 1}`),
    );
    const options = {
      name: uniqueName('stopped'),
      topic,
      to: { webhook: { url: `${rx.url}/hooks`, secret: SECRET } },
    };
    const relay = await ordo.outbox.relay(options);
    await until('three requests arrived', async () => rx.requests.length >= 3, 15_000);
    await relay.stop();
    const sent = rx.requests.length;
    // The batch holds all 40: stop() did not wait for the rest of it.
    expect(sent).toBeLessThan(40);
    expect(rx.requests.every((r) => r.status === 200)).toBe(true);
    // What was confirmed is acknowledged: nothing of it comes again.
    const lag = await ordo.outbox.lag(options.name);
    expect(lag.delivered).toBe(sent);
    expect(lag.messagesBehind).toBe(40 - sent);
    await sleep(200);
    expect(rx.requests.length).toBe(sent);

    const again = await ordo.outbox.relay(options);
    try {
      await caughtUp(again);
      const committed = Array.from({ length: 40 }, (_, i) => ({ key: 'a', seq: i + 1, label: `m${i + 1}` }));
      expect(checkArrivals(rx.delivered(), committed)).toBe(0);
    } finally {
      await again.stop();
      await rx.close();
    }
  });

  it('parks a message the receiver refuses (4xx, or a 3xx it is not followed to) after maxAttempts; the others are delivered', async () => {
    const topic = uniqueName('t');
    const rx = await receiver([SECRET], (r) => {
      if (r.data.label === 'refused') return 400;
      if (r.data.label === 'moved') return { status: 301, headers: { location: '/elsewhere' } };
      return 200;
    });
    await appendKey(topic, 'a', ['first', 'refused', 'middle', 'moved', 'last']);
    // A header HTTP cannot carry: refused by the relay itself, before any request.
    await appendKey(topic, 'b', ['unsendable'], { 'x-note': 'two\nlines' });
    await appendKey(topic, 'c', ['other']);
    const relayName = uniqueName('refused');
    const relay = await ordo.outbox.relay({
      name: relayName,
      topic,
      maxAttempts: 2,
      retryDelay: '10ms',
      to: { webhook: { url: `${rx.url}/hooks`, secret: SECRET } },
    });
    try {
      await caughtUp(relay);
      expect(rx.unverified).toEqual([]);
      expect(rx.delivered().map((a) => a.data.label)).toEqual(['first', 'middle', 'last', 'other']);
      // Counted attempts are maxAttempts; before them, the refusal within its batch, which then
      // comes on its own to be counted.
      for (const label of ['refused', 'moved']) {
        const sent = rx.requests.filter((r) => r.data.label === label).length;
        expect(sent, label).toBeGreaterThanOrEqual(2);
        expect(sent, label).toBeLessThanOrEqual(3);
      }
      expect(rx.requests.filter((r) => r.path !== '/hooks')).toEqual([]);
      const parked = await ordo.outbox.deadLetters(relayName);
      expect(parked.map((d) => [(d.data as { label: string }).label, d.attempts])).toEqual([
        ['refused', 2],
        ['moved', 2],
        ['unsendable', 2],
      ]);
      expect(parked[0]!.error).toMatch(/answered 400 Bad Request: answer 400/);
      expect(parked[1]!.error).toMatch(
        /answered 301 Moved Permanently to \/elsewhere: redirects are not followed/,
      );
      expect(parked[2]!.error).toMatch(/cannot go over HTTP: its header "x-note" is not an HTTP header/);
    } finally {
      await relay.stop();
      await rx.close();
    }
  });

  it('signs with every secret while one replaces another: a receiver knowing either verifies', async () => {
    const topic = uniqueName('t');
    const rx = await receiver([SECRET]);
    const relay = await ordo.outbox.relay({
      name: uniqueName('rotation'),
      topic,
      to: { webhook: { url: `${rx.url}/hooks/{key}`, secret: [SECRET, OLD_SECRET] } },
    });
    try {
      // A key beyond ASCII, with a '/': encoded in the path and in ce-subject.
      await appendKey(topic, 'clé/1', ['one', 'two']);
      await caughtUp(relay);
      expect(rx.unverified).toEqual([]);
      expect(rx.requests.map((r) => [r.data.label, r.path])).toEqual([
        ['one', '/hooks/cl%C3%A9%2F1'],
        ['two', '/hooks/cl%C3%A9%2F1'],
      ]);
      for (const r of rx.requests) {
        expect(r.headers['webhook-signature']!.split(' ')).toHaveLength(2);
        expect(r.headers['ce-subject']).toBe('cl%C3%A9/1');
        expect(new Webhook(SECRET).verify(r.body, r.headers)).toEqual(r.data);
        expect(new Webhook(OLD_SECRET).verify(r.body, r.headers)).toEqual(r.data);
        expect(() => new Webhook(OTHER_SECRET).verify(r.body, r.headers)).toThrow(/No matching signature/);
      }
      expect(relay.state().target).toMatch(/signed with 2 secrets/);
      expect(relay.state().target).not.toContain(SECRET.slice(6));
    } finally {
      await relay.stop();
      await rx.close();
    }
  });

  it('refuses bad configuration when the relay is created, saying what to change', async () => {
    const topic = uniqueName('t');
    const url = 'https://example.com/hooks/{topic}';
    const refused = async (webhook: unknown, ...expected: (string | RegExp)[]) => {
      const e = await ordo.outbox
        .relay({ name: uniqueName('bad'), topic, to: { webhook: webhook as never } })
        .then(
          () => undefined,
          (err: unknown) => err,
        );
      expect(e, JSON.stringify(webhook)).toBeInstanceOf(OrdoError);
      expect((e as OrdoError).code).toBe('invalid_argument');
      for (const x of expected) expect((e as OrdoError).message).toMatch(x);
      return (e as OrdoError).message;
    };
    await refused({ secret: SECRET }, /to\.webhook\.url must be a non-empty string/);
    await refused({ url: 'ftp://example.com/x', secret: SECRET }, /must start with http:\/\/ or https:\/\//);
    await refused({ url: 'example.com/hooks', secret: SECRET }, /must start with http:\/\/ or https:\/\//);
    await refused(
      { url: 'https://{type}.example.com/hooks', secret: SECRET },
      /template fields only in its path or query, not in the host/,
    );
    await refused({ url: 'https://example.com:{partition}/x', secret: SECRET }, /not in the host/);
    const withCredentials = await refused(
      { url: 'https://user:hunter2@example.com/hooks', secret: SECRET },
      /must not hold credentials: send them as a header/,
    );
    expect(withCredentials).not.toContain('hunter2');
    await refused({ url: 'https://example.com/hooks#top', secret: SECRET }, /#fragment/);
    await refused({ url: 'http://example.com:6000/hooks', secret: SECRET }, /port 6000/);
    await refused(
      { url: 'https://example.com/hooks/{tenant}', secret: SECRET },
      /to\.webhook\.url: \{tenant\} is not a field: use \{topic\}, \{type\}, \{key\}, \{partition\}/,
    );
    await refused({ url }, /to\.webhook\.secret must be whsec_ followed by 24 to 64 random bytes in base64/);
    const plain = await refused({ url, secret: 'hunter2-hunter2' }, /not starting with whsec_/);
    expect(plain).not.toContain('hunter2');
    await refused({ url, secret: 'whsec_not base64!' }, /not base64/);
    await refused({ url, secret: `whsec_${Buffer.alloc(16).toString('base64')}` }, /a secret of 16 bytes/);
    await refused({ url, secret: [] }, /several while rotating/);
    await refused({ url, secret: [SECRET, 'whsec_x'] }, /to\.webhook\.secret\[1\]/);
    await refused({ url, secret: SECRET, timeout: 'soon' }, /to\.webhook\.timeout must be a duration/);
    await refused({ url, secret: SECRET, headers: { 'webhook-id': 'x' } }, /set by the relay/);
    await refused({ url, secret: SECRET, headers: { 'CE-Type': 'x' } }, /set by the relay/);
    await refused({ url, secret: SECRET, headers: { 'content-length': '3' } }, /HTTP connection/);
    await refused({ url, secret: SECRET, headers: { 'bad name': 'x' } }, /must be an HTTP header/);
    await refused({ url, secret: SECRET, headers: { 'x-a': 'a\nb' } }, /must be an HTTP header/);
    await refused({ url, secret: SECRET, headers: { 'x-a': 1 } }, /must be a string/);
    await refused({ url, secret: SECRET, retries: 3 }, /to\.webhook has no option 'retries'/);
    // Nothing was created for a refused relay.
    expect((await ordo.outbox.subscriptions()).filter((s) => s.topic === topic)).toEqual([]);
  });
});
