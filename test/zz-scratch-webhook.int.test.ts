// A relay to webhooks, against a receiver started here that verifies every request with the
// standardwebhooks package, as a receiver by the Standard Webhooks specification does: every
// committed message is delivered with a valid signature and its stable webhook-id, in commit
// order per key; a 500 or a timeout is retried and holds the key's later messages back; a 429
// is waited out for its Retry-After; a 4xx or 3xx is parked and the others go on; several
// secrets sign side by side; bad configuration is refused at creation.
import { once } from 'node:events';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
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
}

/** What the receiver answers a request: a status (and headers), or nothing at all. */
type Answer = number | { status: number; headers?: Record<string, string> } | 'never';

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
    if (a === 'never') return;
    const { status, headers: extra } = typeof a === 'number' ? { status: a, headers: {} } : a;
    request.status = status;
    res.writeHead(status, extra).end(status >= 300 ? `answer ${status}` : 'ok');
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

describe('scratch', () => {
  it('a notification during the Retry-After wait', async () => {
    const topic = uniqueName('t');
    const rx = await receiver([SECRET], (r) => (r.data.label === 'patient' && r.attempt === 1 ? { status: 429, headers: { 'retry-after': '3' } } : 200));
    await appendKey(topic, 'a', ['patient']);
    const relay = await ordo.outbox.relay({ name: uniqueName('ra'), topic, retryDelay: '10ms', to: { webhook: { url: `${rx.url}/hooks`, secret: SECRET } } });
    try {
      await until('first', () => rx.requests.length === 1);
      await new Promise((r) => setTimeout(r, 300));
      await appendKey(topic, 'b', ['later']);
      await caughtUp(relay);
      console.log('GAPS', rx.requests.map((r) => [r.data.label, r.attempt, Math.round(r.at - rx.requests[0]!.at)]));
    } finally { await relay.stop(); await rx.close(); }
  });
});
