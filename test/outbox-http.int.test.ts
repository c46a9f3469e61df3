// The outbox over HTTP: append to a topic, read a subscription's lag, consume it from any
// language with receive / ack / nack (leases that lapse, retries, dead letters), seek, with
// token scopes.
import type { FastifyInstance } from 'fastify';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, MAX_ATTEMPTS, type Ordo, type OrdoError, type OutboxMessage } from '../src/index.js';
import { parseTokens } from '../src/server/auth.js';
import { buildServer } from '../src/server/app.js';
import { type OwnPostgres, ownPostgres } from './support/own-postgres.js';
import { sample, sampleSum } from './support/prometheus.js';

const READER = 'reader-token-0123456789';
const ISSUER = 'issuer-token-0123456789';
const ADMIN = 'admin-token-0123456789xx';

let server: OwnPostgres;
let ordo: Ordo;
let app: FastifyInstance;

beforeAll(async () => {
  // A server of its own: the lag test names open transactions, which are cluster-wide.
  server = await ownPostgres();
  ordo = await createOrdo({ databaseUrl: server.url });
  app = await buildServer(ordo, {
    tokens: parseTokens(`${READER}:read,${ISSUER}:next,${ADMIN}:admin+next+read`),
  });
});

afterAll(async () => {
  await app?.close();
  await ordo?.close();
  await server?.stop();
});

function call(method: 'GET' | 'POST' | 'PUT', url: string, token: string | undefined, payload?: unknown) {
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
  it('shows the lag, and the open transaction that appended: it holds back its own message only', async () => {
    const received: OutboxMessage[] = [];
    const sub = await ordo.outbox.subscribe({
      name: 'http-lag',
      topic: 'lagging',
      pollInterval: '50ms',
      handler: (messages) => void received.push(...messages),
    });
    const blocker = new pg.Client({ connectionString: server.url, application_name: 'forgotten-tx' });
    await blocker.connect();
    const deadline = Date.now() + 10_000;
    try {
      await blocker.query('BEGIN');
      await blocker.query(`SELECT ordo.append('lagging', 'Held', '1')`);
      await call('POST', '/v1/topics/lagging/messages', ISSUER, { type: 'T', data: 1 });
      while (received.length === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      const r = await call('GET', '/v1/subscriptions/http-lag', READER);
      expect(r.statusCode).toBe(200);
      const lag = r.json();
      expect(lag).toMatchObject({ name: 'http-lag', topic: 'lagging', waiting: 1 });
      expect(lag.partitions).toHaveLength(1);
      expect(lag.blockedBy).toMatchObject({
        pid: (await blocker.query('SELECT pg_backend_pid() AS pid')).rows[0].pid,
        state: 'idle in transaction',
        applicationName: 'forgotten-tx',
      });
      expect(received.map((m) => m.type)).toEqual(['T']);
    } finally {
      await blocker.query('ROLLBACK');
      await blocker.end();
    }
    let after = (await call('GET', '/v1/subscriptions/http-lag', READER)).json();
    while (after.delivered === 0 && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 20));
      after = (await call('GET', '/v1/subscriptions/http-lag', READER)).json();
    }
    expect(after).toMatchObject({ messagesBehind: 0, blockedBy: null, waiting: 0, delivered: 1 });
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

describe('consumers over HTTP: receive, ack, nack', () => {
  const labels = (r: { json(): { messages: { data: { n: number } }[] } }) =>
    r.json().messages.map((m) => m.data.n);
  const append = (topic: string, ns: number[], key?: string) =>
    call('POST', `/v1/topics/${topic}/messages`, ISSUER, {
      messages: ns.map((n) => ({ type: 'n', data: { n }, key: key ?? null })),
    });

  it('receive leases a batch; ack moves past it; a lapsed lease refuses the receipt and the batch comes again', async () => {
    const created = await call('PUT', '/v1/subscriptions/http-consumer', ADMIN, { topic: 'work' });
    expect(created.statusCode).toBe(200);
    expect((await call('PUT', '/v1/subscriptions/http-consumer', ISSUER, { topic: 'work' })).statusCode).toBe(
      403,
    );
    await append('work', [1, 2, 3, 4, 5]);

    const first = await call('POST', '/v1/subscriptions/http-consumer/receive', ISSUER, {
      max: 2,
      visibilityTimeout: '300ms',
    });
    expect(first.statusCode).toBe(200);
    expect(labels(first)).toEqual([1, 2]);
    expect(first.json().attempt).toBe(1);
    // The only partition is leased: nothing for another caller meanwhile.
    const busy = await call('POST', '/v1/subscriptions/http-consumer/receive', ISSUER, {});
    expect(busy.json()).toEqual({ messages: [], receipt: null, attempt: 0 });
    await new Promise((r) => setTimeout(r, 450));
    const late = await call('POST', '/v1/subscriptions/http-consumer/ack', ISSUER, {
      receipt: first.json().receipt,
    });
    expect(late.statusCode).toBe(409);
    expect(late.json().code).toBe('receipt_expired');
    expect(late.json().message).toContain('visibilityTimeout');

    // A lapsed lease is a failed batch, as a nack is: its messages come again, one at a time.
    const again = await call('POST', '/v1/subscriptions/http-consumer/receive', ISSUER, { max: 2 });
    expect(labels(again)).toEqual([1]);
    const acked = await call('POST', '/v1/subscriptions/http-consumer/ack', ISSUER, {
      receipt: again.json().receipt,
    });
    expect(acked.json()).toEqual({ handled: 1 });
    // A receipt acknowledged once is spent.
    const twice = await call('POST', '/v1/subscriptions/http-consumer/ack', ISSUER, {
      receipt: again.json().receipt,
    });
    expect(twice.json().code).toBe('receipt_expired');
    const second = await call('POST', '/v1/subscriptions/http-consumer/receive', ISSUER, { max: 10 });
    expect(labels(second)).toEqual([2]);
    await call('POST', '/v1/subscriptions/http-consumer/ack', ISSUER, { receipt: second.json().receipt });
    const rest = await call('POST', '/v1/subscriptions/http-consumer/receive', ISSUER, { max: 10 });
    expect(labels(rest)).toEqual([3, 4, 5]);
    await call('POST', '/v1/subscriptions/http-consumer/ack', ISSUER, { receipt: rest.json().receipt });
    expect((await call('GET', '/v1/subscriptions/http-consumer', READER)).json()).toMatchObject({
      messagesBehind: 0,
      delivered: 5,
    });
  });

  it('nack: a batch is split, its failing message retried after retryAfter, then parked after maxAttempts', async () => {
    await call('PUT', '/v1/subscriptions/http-nack', ADMIN, { topic: 'nacked' });
    await append('nacked', [1, 2, 3]);
    const receive = () => call('POST', '/v1/subscriptions/http-nack/receive', ISSUER, { max: 10 });
    const nack = (receipt: string, body: object = {}) =>
      call('POST', '/v1/subscriptions/http-nack/nack', ISSUER, { receipt, ...body });

    const batch = await receive();
    expect(labels(batch)).toEqual([1, 2, 3]);
    expect((await nack(batch.json().receipt, { error: 'which one?' })).json()).toEqual({
      outcome: 'split',
      attempts: 0,
    });
    // One at a time now.
    const one = await receive();
    expect(labels(one)).toEqual([1]);
    await call('POST', '/v1/subscriptions/http-nack/ack', ISSUER, { receipt: one.json().receipt });
    let two = await receive();
    expect(labels(two)).toEqual([2]);
    expect(
      (await nack(two.json().receipt, { retryAfter: '400ms', maxAttempts: 2, error: 'boom' })).json(),
    ).toEqual({
      outcome: 'retry',
      attempts: 1,
    });
    // Not before retryAfter.
    expect(labels(await receive())).toEqual([]);
    await new Promise((r) => setTimeout(r, 500));
    two = await receive();
    expect(labels(two)).toEqual([2]);
    expect(two.json().attempt).toBe(2);
    expect((await nack(two.json().receipt, { maxAttempts: 2, error: 'boom again' })).json()).toEqual({
      outcome: 'parked',
      attempts: 2,
    });
    const three = await receive();
    expect(labels(three)).toEqual([3]);
    await call('POST', '/v1/subscriptions/http-nack/ack', ISSUER, { receipt: three.json().receipt });
    const dead = await ordo.outbox.deadLetters('http-nack');
    expect(dead.map((d) => [d.data, d.attempts, d.error])).toEqual([[{ n: 2 }, 2, 'boom again']]);
    expect((await ordo.outbox.lag('http-nack')).delivered).toBe(2);
  });

  it('partitions: callers receive different partitions at once, each in key order', async () => {
    await call('PUT', '/v1/subscriptions/http-parts', ADMIN, { topic: 'parted', partitions: 4 });
    for (let i = 0; i < 40; i++) await append('parted', [i], `k${i % 8}`);
    const seen = new Map<string, number[]>();
    for (let round = 0; round < 20; round++) {
      const batches = await Promise.all(
        [0, 1, 2, 3].map(() => call('POST', '/v1/subscriptions/http-parts/receive', ISSUER, { max: 3 })),
      );
      const receipts = batches.map((b) => b.json().receipt).filter((r): r is string => r !== null);
      expect(new Set(receipts.map((r) => r.split('.')[0])).size).toBe(receipts.length);
      for (const b of batches)
        for (const m of b.json().messages as { key: string; data: { n: number } }[])
          seen.set(m.key, [...(seen.get(m.key) ?? []), m.data.n]);
      await Promise.all(
        receipts.map((receipt) => call('POST', '/v1/subscriptions/http-parts/ack', ISSUER, { receipt })),
      );
      if (receipts.length === 0) break;
    }
    for (let k = 0; k < 8; k++) {
      expect(seen.get(`k${k}`)).toEqual(Array.from({ length: 5 }, (_, i) => k + 8 * i));
    }
  });

  it('bad receipts, bodies and names: 400 invalid_argument; unknown subscription 404; seek while held 409', async () => {
    await call('PUT', '/v1/subscriptions/http-bad', ADMIN, { topic: 'bad' });
    for (const receipt of ['nope', '1.2.http:zz', '999999.1.http:00000000-0000-0000-0000-000000000000']) {
      const r = await call('POST', '/v1/subscriptions/http-bad/ack', ISSUER, { receipt });
      expect([r.statusCode, r.json().code], receipt).toEqual([400, 'invalid_argument']);
    }
    const wrongMax = await call('POST', '/v1/subscriptions/http-bad/receive', ISSUER, { max: 0 });
    expect([wrongMax.statusCode, wrongMax.json().code]).toEqual([400, 'invalid_argument']);
    const unknown = await call('POST', '/v1/subscriptions/nobody/receive', ISSUER, {});
    expect([unknown.statusCode, unknown.json().code]).toEqual([404, 'subscription_not_found']);
    const reader = await call('POST', '/v1/subscriptions/http-bad/receive', READER, {});
    expect(reader.statusCode).toBe(403);
    const conflict = await call('PUT', '/v1/subscriptions/http-bad', ADMIN, { topic: 'bad', partitions: 2 });
    expect([conflict.statusCode, conflict.json().code]).toEqual([409, 'subscription_conflict']);

    await append('bad', [1]);
    const held = await call('POST', '/v1/subscriptions/http-bad/receive', ISSUER, {
      visibilityTimeout: '10s',
    });
    expect(held.json().receipt).not.toBeNull();
    const seek = await call('POST', '/v1/subscriptions/http-bad/seek', ADMIN, { to: 'beginning' });
    expect([seek.statusCode, seek.json().code]).toEqual([409, 'subscription_busy']);
    await call('POST', '/v1/subscriptions/http-bad/ack', ISSUER, { receipt: held.json().receipt });
    const replay = await call('POST', '/v1/subscriptions/http-bad/seek', ADMIN, { to: 'beginning' });
    expect(replay.statusCode).toBe(200);
    expect(labels(await call('POST', '/v1/subscriptions/http-bad/receive', ISSUER, {}))).toEqual([1]);
  });
});

describe('GET /metrics: the outbox after a known workload', () => {
  it('appended by topic; delivered, redelivered, lag and dead letters by subscription and partition', async () => {
    await call('PUT', '/v1/subscriptions/metered', ADMIN, { topic: 'metered', partitions: 2 });
    const appended = await call('POST', '/v1/topics/metered/messages', ISSUER, {
      messages: ['a', 'b', 'c', 'd'].map((k) => ({ type: 'm', key: k, data: k })),
    });
    expect(appended.statusCode).toBe(200);
    // One message parked (maxAttempts 1), one delivered again after a nack, the rest acknowledged.
    let parked = false;
    let retried = false;
    for (let i = 0; i < 20; i++) {
      const r = (await call('POST', '/v1/subscriptions/metered/receive', ISSUER, { max: 1 })).json();
      if (r.receipt === null) break;
      if (!parked) {
        parked = true;
        await call('POST', '/v1/subscriptions/metered/nack', ISSUER, { receipt: r.receipt, maxAttempts: 1 });
      } else if (!retried) {
        retried = true;
        await call('POST', '/v1/subscriptions/metered/nack', ISSUER, { receipt: r.receipt, retryAfter: 0 });
      } else await call('POST', '/v1/subscriptions/metered/ack', ISSUER, { receipt: r.receipt });
    }
    const text = (await call('GET', '/metrics', READER)).body;
    const metered = { subscription: 'metered' };
    expect(sample(text, 'ordo_outbox_appended_total', { topic: 'metered' })).toBe(4);
    expect(sampleSum(text, 'ordo_outbox_delivered_total', metered)).toBe(3);
    expect(sampleSum(text, 'ordo_outbox_redelivered_total', metered)).toBe(1);
    expect(sampleSum(text, 'ordo_outbox_lag_messages', metered)).toBe(0);
    expect(sample(text, 'ordo_outbox_dead_lettered_total', metered)).toBe(1);
    expect(sample(text, 'ordo_outbox_open_appenders', metered)).toBe(0);
    expect(text).toContain('ordo_outbox_delivered_total{subscription="metered",partition="1"}');
  });
});

describe('consumers over HTTP: leases that lapse, concurrency, and what lag shows', () => {
  const labels = (r: { json(): { messages: { data: { n: number } }[] } }) =>
    r.json().messages.map((m) => m.data.n);
  const append = (topic: string, ns: number[], key?: string) =>
    call('POST', `/v1/topics/${topic}/messages`, ISSUER, {
      messages: ns.map((n) => ({ type: 'n', data: { n }, key: key ?? null })),
    });
  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

  async function sql(text: string, values: unknown[] = []): Promise<pg.QueryResult> {
    const client = new pg.Client({ connectionString: server.url });
    await client.connect();
    try {
      return await client.query(text, values);
    } finally {
      await client.end();
    }
  }

  /** A key whose messages fall in partition `p` of `parts`. */
  async function keyOf(p: number, parts: number): Promise<string> {
    const { rows } = await sql(
      `SELECT k FROM generate_series(0, 999) AS i, LATERAL (SELECT 'k' || i AS k) x
        WHERE ordo.partition_of(k, $2) = $1 LIMIT 1`,
      [p, parts],
    );
    return rows[0].k;
  }

  it('nack of a receipt whose lease lapsed is refused with receipt_expired, as ack is; the batch comes again', async () => {
    await call('PUT', '/v1/subscriptions/http-late-nack', ADMIN, { topic: 'late-nack' });
    await append('late-nack', [1, 2]);
    const first = await call('POST', '/v1/subscriptions/http-late-nack/receive', ISSUER, {
      visibilityTimeout: '300ms',
    });
    expect(labels(first)).toEqual([1, 2]);
    await sleep(450);
    const late = await call('POST', '/v1/subscriptions/http-late-nack/nack', ISSUER, {
      receipt: first.json().receipt,
      retryAfter: '1h',
    });
    expect([late.statusCode, late.json().code]).toEqual([409, 'receipt_expired']);
    // The refused nack changed nothing: no retryAfter of an hour; the lapse itself is the
    // failure, and the messages come again at once, one at a time.
    for (const n of [1, 2]) {
      const again = await call('POST', '/v1/subscriptions/http-late-nack/receive', ISSUER, {});
      expect(labels(again)).toEqual([n]);
      const acked = await call('POST', '/v1/subscriptions/http-late-nack/ack', ISSUER, {
        receipt: again.json().receipt,
      });
      expect(acked.json()).toEqual({ handled: 1 });
    }
  });

  it('a message whose lease lapses every time (it kills its consumer) is parked after maxAttempts (10) deliveries', async () => {
    await call('PUT', '/v1/subscriptions/http-poison', ADMIN, { topic: 'poison' });
    await append('poison', [1, 2]);
    const attempts: number[] = [];
    for (let i = 0; i < 10; i++) {
      const r = await call('POST', '/v1/subscriptions/http-poison/receive', ISSUER, {
        max: 1,
        visibilityTimeout: '300ms',
      });
      expect(labels(r)).toEqual([1]);
      attempts.push(r.json().attempt);
      // The consumer dies: no ack, no nack; the lease lapses.
      await sleep(320);
    }
    expect(attempts).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    const next = await call('POST', '/v1/subscriptions/http-poison/receive', ISSUER, { max: 1 });
    expect([labels(next), next.json().attempt]).toEqual([[2], 1]);
    await call('POST', '/v1/subscriptions/http-poison/ack', ISSUER, { receipt: next.json().receipt });
    const dead = await ordo.outbox.deadLetters('http-poison');
    expect(dead.map((d) => [d.data, d.attempts])).toEqual([[{ n: 1 }, 10]]);
    expect(dead[0]!.error).toContain('lapsed');
    // What lag shows over HTTP: redelivered and deadLettered too, and redelivered per partition.
    const lag = (await call('GET', '/v1/subscriptions/http-poison', READER)).json();
    expect(lag).toMatchObject({ messagesBehind: 0, delivered: 1, redelivered: 9, deadLettered: 1 });
    expect(lag.partitions).toMatchObject([{ partition: 0, redelivered: 9, delivered: 1 }]);
  });

  it('a batch of several whose lease lapses comes one message at a time next', async () => {
    await call('PUT', '/v1/subscriptions/http-lapsed-batch', ADMIN, { topic: 'lapsed-batch' });
    await append('lapsed-batch', [1, 2, 3]);
    const first = await call('POST', '/v1/subscriptions/http-lapsed-batch/receive', ISSUER, {
      visibilityTimeout: '300ms',
    });
    expect(labels(first)).toEqual([1, 2, 3]);
    await sleep(400);
    const got: number[][] = [];
    for (let i = 0; i < 5; i++) {
      const r = await call('POST', '/v1/subscriptions/http-lapsed-batch/receive', ISSUER, {});
      if (r.json().receipt === null) break;
      got.push(labels(r));
      await call('POST', '/v1/subscriptions/http-lapsed-batch/ack', ISSUER, { receipt: r.json().receipt });
    }
    expect(got).toEqual([[1], [2], [3]]);
    expect(await ordo.outbox.deadLetters('http-lapsed-batch')).toEqual([]);
  });

  it('receive takes maxAttempts: a message whose lease lapses every time is parked after that many deliveries', async () => {
    await call('PUT', '/v1/subscriptions/http-poison-2', ADMIN, { topic: 'poison-2' });
    await append('poison-2', [1, 2]);
    const receive = (body: object) => call('POST', '/v1/subscriptions/http-poison-2/receive', ISSUER, body);
    const attempts: number[] = [];
    for (let i = 0; i < 2; i++) {
      const r = await receive({ max: 1, visibilityTimeout: '300ms', maxAttempts: 2 });
      expect([r.statusCode, labels(r)]).toEqual([200, [1]]);
      attempts.push(r.json().attempt);
      await sleep(320);
    }
    expect(attempts).toEqual([1, 2]);
    // The receive that finds the second lapse parks the message and goes on to the next.
    const next = await receive({ max: 1, maxAttempts: 2 });
    expect([labels(next), next.json().attempt]).toEqual([[2], 1]);
    await call('POST', '/v1/subscriptions/http-poison-2/ack', ISSUER, { receipt: next.json().receipt });
    const dead = await ordo.outbox.deadLetters('http-poison-2');
    expect(dead.map((d) => [d.data, d.attempts])).toEqual([[{ n: 1 }, 2]]);
    expect(dead[0]!.error).toContain('lapsed');
  });

  it('receive refuses a maxAttempts that is not a whole number from 1 to MAX_ATTEMPTS: 400 invalid_argument naming it', async () => {
    await call('PUT', '/v1/subscriptions/http-attempts', ADMIN, { topic: 'attempts' });
    const receive = (maxAttempts: unknown) =>
      call('POST', '/v1/subscriptions/http-attempts/receive', ISSUER, { maxAttempts });
    for (const bad of [0, -1, MAX_ATTEMPTS + 1, 1.5, '3', null, [2]]) {
      const r = await receive(bad);
      expect([r.statusCode, r.json().code], JSON.stringify(bad)).toEqual([400, 'invalid_argument']);
      expect(r.json().message).toContain('maxAttempts');
    }
    for (const good of [1, MAX_ATTEMPTS]) {
      const r = await receive(good);
      expect([r.statusCode, r.json()]).toEqual([200, { messages: [], receipt: null, attempt: 0 }]);
    }
    // The library's receive() checks the same range.
    for (const bad of [0, MAX_ATTEMPTS + 1]) {
      const e = await ordo.outbox.receive('http-attempts', { maxAttempts: bad }).catch((e: OrdoError) => e);
      expect((e as OrdoError).code).toBe('invalid_argument');
    }
    expect((await ordo.outbox.receive('http-attempts', { maxAttempts: MAX_ATTEMPTS })).receipt).toBeNull();
  });

  it('concurrent receives and acks on 4 partitions while messages trickle in: no 5xx, every message once, each key in order', async () => {
    // Partitions are often empty: a caller looks at several in one call, in an order that the
    // checkpoints of the others keep changing.
    await call('PUT', '/v1/subscriptions/http-busy', ADMIN, { topic: 'busy', partitions: 4 });
    const keys = [await keyOf(0, 4), await keyOf(1, 4), await keyOf(2, 4), await keyOf(3, 4)];
    const COUNT = 200;
    let appending = true;
    const writer = (async () => {
      for (let i = 0; i < COUNT; i++) {
        const r = await call('POST', '/v1/topics/busy/messages', ISSUER, {
          type: 'n',
          key: keys[(i * 7 + (i >> 3)) % 4],
          data: { n: i },
        });
        expect(r.statusCode).toBe(200);
      }
      appending = false;
    })();
    const statuses: number[] = [];
    const seen = new Map<string, number[]>();
    let total = 0;
    const deadline = Date.now() + 30_000;
    const worker = async () => {
      while ((appending || total < COUNT) && Date.now() < deadline) {
        const r = await call('POST', '/v1/subscriptions/http-busy/receive', ISSUER, { max: 3 });
        statuses.push(r.statusCode);
        if (r.statusCode !== 200) continue;
        const { messages, receipt } = r.json();
        if (receipt === null) {
          await sleep(2);
          continue;
        }
        const acked = await call('POST', '/v1/subscriptions/http-busy/ack', ISSUER, { receipt });
        statuses.push(acked.statusCode);
        if (acked.statusCode !== 200) continue;
        for (const m of messages as { key: string; data: { n: number } }[]) {
          seen.set(m.key, [...(seen.get(m.key) ?? []), m.data.n]);
          total++;
        }
      }
    };
    await Promise.all([writer, ...Array.from({ length: 12 }, worker)]);
    expect(statuses.filter((s) => s !== 200)).toEqual([]);
    for (const key of keys) {
      const sent = Array.from({ length: COUNT }, (_, i) => i).filter(
        (i) => keys[(i * 7 + (i >> 3)) % 4] === key,
      );
      expect(seen.get(key), key).toEqual(sent);
    }
    expect(total).toBe(COUNT);
    expect((await ordo.outbox.lag('http-busy')).messagesBehind).toBe(0);
  });

  it('a round begun by receive has a bound; a poll with nothing to receive writes nothing; a partition locked elsewhere is passed over, not waited for', async () => {
    await call('PUT', '/v1/subscriptions/http-idle', ADMIN, { topic: 'idle-polls', partitions: 2 });
    const [k0, k1] = [await keyOf(0, 2), await keyOf(1, 2)];
    await append('idle-polls', [1], k0);
    await append('idle-polls', [2], k1);
    const state = async () =>
      (
        await sql(
          `SELECT partition, xmin::text, version, target_position IS NOT NULL AS in_round, target_bound::text AS bound
             FROM ordo.subscription_partitions WHERE subscription = 'http-idle' ORDER BY partition`,
        )
      ).rows;

    // Partition 0 is locked by another transaction (as a concurrent caller would hold it).
    const holder = new pg.Client({ connectionString: server.url });
    await holder.connect();
    let r;
    try {
      await holder.query('BEGIN');
      await holder.query(
        `SELECT 1 FROM ordo.subscription_partitions WHERE subscription = 'http-idle' AND partition = 0 FOR UPDATE`,
      );
      const started = Date.now();
      r = await call('POST', '/v1/subscriptions/http-idle/receive', ISSUER, {});
      expect(Date.now() - started).toBeLessThan(2_000);
      expect([r.json().receipt.split('.')[0], labels(r)]).toEqual(['1', [2]]);
    } finally {
      await holder.query('ROLLBACK');
      await holder.end();
    }
    // The round it began: its bound is a transaction id, not null (which would scan every id
    // from the snapshot's xmax to the end of the topic at the next round).
    const inRound = await state();
    expect(inRound[1]).toMatchObject({ in_round: true });
    expect(inRound[1].bound).not.toBeNull();
    await call('POST', '/v1/subscriptions/http-idle/ack', ISSUER, { receipt: r.json().receipt });
    const zero = await call('POST', '/v1/subscriptions/http-idle/receive', ISSUER, {});
    expect(labels(zero)).toEqual([1]);
    await call('POST', '/v1/subscriptions/http-idle/ack', ISSUER, { receipt: zero.json().receipt });

    const before = await state();
    for (let i = 0; i < 3; i++) {
      const idle = await call('POST', '/v1/subscriptions/http-idle/receive', ISSUER, {});
      expect(idle.json()).toEqual({ messages: [], receipt: null, attempt: 0 });
    }
    expect(await state()).toEqual(before);
  });

  it('receive_any refuses a bad max or max_attempts (SQL callers)', async () => {
    for (const [max, attempts] of [
      [0, 10],
      [1, 0],
    ]) {
      const e = await sql(`SELECT * FROM ordo.receive_any('http-idle', 'sql:me', $1, 1000, $2)`, [
        max,
        attempts,
      ]).catch((e: { code?: string }) => e);
      expect((e as { code?: string }).code).toBe('OX003');
    }
  });

  it('a deadlock with another transaction is a 503 with Retry-After (transient: the statement was rolled back), not a 500', async () => {
    const other = new pg.Client({ connectionString: server.url, application_name: 'deadlocker' });
    await other.connect();
    try {
      await other.query('BEGIN');
      await other.query(`SELECT ordo.append('deadlock', 'm', '1', NULL, 'b')`);
      // The request inserts messageId a, then waits for b (the other's, not yet committed).
      const request = call('POST', '/v1/topics/deadlock/messages', ISSUER, {
        messages: [
          { type: 'm', data: 1, messageId: 'a' },
          { type: 'm', data: 2, messageId: 'b' },
        ],
      });
      // (Read outside the other's transaction: pg_stat_activity stays as first read in one.)
      const deadline = Date.now() + 10_000;
      for (;;) {
        const { rows } = await sql(
          `SELECT count(*)::int AS n FROM pg_stat_activity
            WHERE wait_event_type = 'Lock' AND application_name <> 'deadlocker' AND query LIKE '%append_answer%'`,
        );
        if (rows[0].n > 0) break;
        if (Date.now() > deadline) throw new Error('the request never waited');
        await sleep(10);
      }
      // The other now waits for the request's a: a cycle, broken after deadlock_timeout (1 s)
      // by the first of the two to look, the request.
      const waiting = other.query(`SELECT ordo.append('deadlock', 'm', '2', NULL, 'a')`);
      const r = await request;
      expect([r.statusCode, r.json().code]).toEqual([503, 'database_unavailable']);
      expect(r.json().message).toContain('deadlock');
      expect(r.headers['retry-after']).toBe('1');
      await waiting;
    } finally {
      await other.query('ROLLBACK');
      await other.end();
    }
    expect(await count('deadlock')).toBe(0);
  });

  it('lag counts a late message (its transaction was open when the round was read) once it commits, and stops counting at 10,000', async () => {
    await call('PUT', '/v1/subscriptions/http-late-lag', ADMIN, { topic: 'late-lag' });
    const lagOf = async (name: string) => (await call('GET', `/v1/subscriptions/${name}`, READER)).json();
    const drainAll = async (name: string) => {
      const got: number[] = [];
      for (;;) {
        const r = await call('POST', `/v1/subscriptions/${name}/receive`, ISSUER, {});
        if (r.json().receipt === null) return got;
        got.push(...labels(r));
        await call('POST', `/v1/subscriptions/${name}/ack`, ISSUER, { receipt: r.json().receipt });
      }
    };
    const writer = new pg.Client({ connectionString: server.url });
    await writer.connect();
    try {
      await writer.query('BEGIN');
      await writer.query(`SELECT ordo.append('late-lag', 'n', '{"n": 1}')`);
      await append('late-lag', [2, 3]);
      expect(await drainAll('http-late-lag')).toEqual([2, 3]);
      expect(await lagOf('http-late-lag')).toMatchObject({ messagesBehind: 0, waiting: 1 });
      await writer.query('COMMIT');
    } finally {
      await writer.end();
    }
    // Below the position delivered, of a transaction the last round saw running.
    expect(await lagOf('http-late-lag')).toMatchObject({ messagesBehind: 1, waiting: 0 });
    expect(await drainAll('http-late-lag')).toEqual([1]);
    expect(await lagOf('http-late-lag')).toMatchObject({ messagesBehind: 0, delivered: 3 });

    // A backlog past the cap: counted up to 10,000, not read to its end.
    await call('PUT', '/v1/subscriptions/http-capped', ADMIN, { topic: 'capped', partitions: 2 });
    await sql(`SELECT count(*) FROM ordo.append_many('capped', array_fill('m'::text, ARRAY[20500]),
      array_fill('1'::jsonb, ARRAY[20500]), array_fill(NULL::text, ARRAY[20500]),
      array_fill(NULL::text, ARRAY[20500]), array_fill('{}'::jsonb, ARRAY[20500]))`);
    const capped = await lagOf('http-capped');
    // No key: every message in one partition.
    expect(capped.partitions.map((p: { messagesBehind: number }) => p.messagesBehind).sort()).toEqual([
      0, 10_000,
    ]);
    expect(capped.messagesBehind).toBe(10_000);
    expect(capped.oldestAgeMs).toBeGreaterThanOrEqual(0);
  });

  it('a subscription removed while its lag is read is subscription_not_found (404), never a 500', async () => {
    // What the last statement of subscription_lag sees when the subscription is removed after
    // its first: a subscription without partitions.
    await sql(`INSERT INTO ordo.subscriptions (name, topic) VALUES ('half-removed', 'gone')`);
    try {
      const one = await call('GET', '/v1/subscriptions/half-removed', READER);
      expect([one.statusCode, one.json().code]).toEqual([404, 'subscription_not_found']);
      const all = await call('GET', '/v1/subscriptions', READER);
      expect(all.statusCode).toBe(200);
      expect(all.json().map((s: { name: string }) => s.name)).not.toContain('half-removed');
    } finally {
      await sql(`DELETE FROM ordo.subscriptions WHERE name = 'half-removed'`);
    }
    // And removed for real while lags are read.
    for (let i = 0; i < 20; i++) {
      await ordo.outbox.createSubscription({ name: `flicker-${i}`, topic: 'flicker', partitions: 4 });
      const [lag] = await Promise.all([
        call('GET', `/v1/subscriptions/flicker-${i}`, READER),
        ordo.outbox.removeSubscription(`flicker-${i}`),
      ]);
      expect([200, 404], lag.body).toContain(lag.statusCode);
    }
  });
});
