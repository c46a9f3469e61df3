// The outbox over HTTP: append to a topic, read a subscription's lag, with token scopes.
import type { FastifyInstance } from 'fastify';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo, type OutboxMessage } from '../src/index.js';
import { parseTokens } from '../src/server/auth.js';
import { buildServer } from '../src/server/app.js';
import { type OwnPostgres, ownPostgres } from './support/own-postgres.js';

const READER = 'reader-token-0123456789';
const ISSUER = 'issuer-token-0123456789';

let server: OwnPostgres;
let ordo: Ordo;
let app: FastifyInstance;

beforeAll(async () => {
  // Outbox reads depend on every open transaction on the server: this file has one of its own.
  server = await ownPostgres();
  ordo = await createOrdo({ databaseUrl: server.url });
  app = await buildServer(ordo, { tokens: parseTokens(`${READER}:read,${ISSUER}:next`) });
});

afterAll(async () => {
  await app?.close();
  await ordo?.close();
  await server?.stop();
});

function call(method: 'GET' | 'POST', url: string, token: string | undefined, payload?: unknown) {
  return app.inject({
    method,
    url,
    headers: token ? { authorization: `Bearer ${token}` } : {},
    ...(payload === undefined ? {} : { payload: payload as object }),
  });
}

async function count(topic: string): Promise<number> {
  const client = new pg.Client({ connectionString: server.url });
  await client.connect();
  try {
    const { rows } = await client.query('SELECT count(*)::int AS n FROM ordo.messages WHERE topic = $1', [
      topic,
    ]);
    return rows[0].n;
  } finally {
    await client.end();
  }
}

describe('POST /v1/topics/:topic/messages', () => {
  it('appends one message, or several in one transaction, and stores a messageId once', async () => {
    const one = await call('POST', '/v1/topics/orders/messages', ISSUER, {
      type: 'OrderPlaced',
      data: { id: 1 },
      messageId: 'o-1',
    });
    expect(one.statusCode).toBe(200);
    const [first] = one.json().messages;
    expect(first).toMatchObject({ messageId: 'o-1', duplicate: false });
    expect(first.position).toBeGreaterThan(0);

    const many = await call('POST', '/v1/topics/orders/messages', ISSUER, {
      messages: [
        { type: 'OrderPlaced', data: { id: 1 }, messageId: 'o-1' },
        { type: 'OrderPaid', data: { id: 1 }, key: '1', headers: { trace: 'abc' } },
      ],
    });
    expect(many.statusCode).toBe(200);
    const [again, paid] = many.json().messages;
    expect(again).toEqual({ messageId: 'o-1', position: null, transactionId: null, duplicate: true });
    expect(paid.duplicate).toBe(false);
    expect(paid.position).toBeGreaterThan(first.position);
    expect(await count('orders')).toBe(2);
  });

  it('refuses bad input with invalid_argument and stores nothing', async () => {
    const bad = [
      { type: '', data: 1 },
      { data: 1 },
      { type: 'T' },
      { type: 'T', data: 1, extra: true },
      { type: 'T', data: 1, headers: 'x' },
      { messages: [] },
      { messages: [{ type: 'T', data: 1 }, { type: 'T' }] },
    ];
    for (const body of bad) {
      const r = await call('POST', '/v1/topics/refused/messages', ISSUER, body);
      expect(r.statusCode, JSON.stringify(body)).toBe(400);
      expect(r.json().code).toBe('invalid_argument');
    }
    const badTopic = await call('POST', '/v1/topics/bad%20topic/messages', ISSUER, { type: 'T', data: 1 });
    expect(badTopic.statusCode).toBe(400);
    expect(badTopic.json().code).toBe('invalid_argument');
    expect(await count('refused')).toBe(0);
  });

  it('needs the next scope', async () => {
    const none = await call('POST', '/v1/topics/guarded/messages', undefined, { type: 'T', data: 1 });
    expect(none.statusCode).toBe(401);
    expect(none.json().code).toBe('unauthorized');
    const reader = await call('POST', '/v1/topics/guarded/messages', READER, { type: 'T', data: 1 });
    expect(reader.statusCode).toBe(403);
    expect(reader.json().code).toBe('forbidden');
    expect(await count('guarded')).toBe(0);
  });
});

describe('GET /v1/subscriptions/:name', () => {
  it('shows the lag, then the open transaction that holds a subscription back', async () => {
    const received: OutboxMessage[] = [];
    const sub = await ordo.outbox.subscribe({
      name: 'http-lag',
      topic: 'lagging',
      pollInterval: '50ms',
      handler: (messages) => void received.push(...messages),
    });
    const blocker = new pg.Client({ connectionString: server.url, application_name: 'forgotten-tx' });
    await blocker.connect();
    try {
      await blocker.query('BEGIN');
      await blocker.query('SELECT pg_current_xact_id()');
      await call('POST', '/v1/topics/lagging/messages', ISSUER, { type: 'T', data: 1 });
      const r = await call('GET', '/v1/subscriptions/http-lag', READER);
      expect(r.statusCode).toBe(200);
      const lag = r.json();
      expect(lag).toMatchObject({ name: 'http-lag', topic: 'lagging', messagesBehind: 1, waiting: 1 });
      expect(lag.blockedBy).toMatchObject({
        pid: (await blocker.query('SELECT pg_backend_pid() AS pid')).rows[0].pid,
        state: 'idle in transaction',
        applicationName: 'forgotten-tx',
      });
      expect(received).toEqual([]);
    } finally {
      await blocker.query('ROLLBACK');
      await blocker.end();
    }
    const deadline = Date.now() + 10_000;
    while (received.length === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    expect(received.map((m) => m.type)).toEqual(['T']);
    // The handler has run; its checkpoint commits just after it returns.
    let after = (await call('GET', '/v1/subscriptions/http-lag', READER)).json();
    while (after.delivered === 0 && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 20));
      after = (await call('GET', '/v1/subscriptions/http-lag', READER)).json();
    }
    expect(after).toMatchObject({ messagesBehind: 0, blockedBy: null, delivered: 1 });
    const list = await call('GET', '/v1/subscriptions', READER);
    expect(list.json().map((s: { name: string }) => s.name)).toContain('http-lag');
    await sub.stop();
  });

  it('answers 404 subscription_not_found for an unknown name, and needs the read scope', async () => {
    const missing = await call('GET', '/v1/subscriptions/nobody', READER);
    expect(missing.statusCode).toBe(404);
    expect(missing.json().code).toBe('subscription_not_found');
    const issuer = await call('GET', '/v1/subscriptions/nobody', ISSUER);
    expect(issuer.statusCode).toBe(403);
  });
});
