// Throttles over HTTP: definitions, acquire (200 with a permit, 429 with Retry-After), the ends
// of permits, every error as { code, message } with its status, and token scopes.
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, ERROR_CODES, type Ordo } from '../src/index.js';
import { parseTokens } from '../src/server/auth.js';
import { buildServer } from '../src/server/app.js';
import { freshDatabase, type TestDatabase } from './support/database.js';

const READER = 'reader-token-0123456789';
const ISSUER = 'issuer-token-0123456789';
const ADMIN = 'admin-token-0123456789';

let db: TestDatabase;
let ordo: Ordo;
let app: FastifyInstance;
let open: FastifyInstance;

beforeAll(async () => {
  db = await freshDatabase();
  ordo = await createOrdo({ databaseUrl: db.url, poolSize: 4 });
  app = await buildServer(ordo, {
    tokens: parseTokens(`${READER}:read,${ISSUER}:next,${ADMIN}:admin+read+next`),
  });
  open = await buildServer(ordo);
});
afterAll(async () => {
  await app?.close();
  await open?.close();
  await ordo?.close();
  await db?.drop();
});

type Method = 'GET' | 'PUT' | 'POST' | 'DELETE';

async function call(method: Method, url: string, token: string | undefined, payload?: unknown) {
  const reply = await app.inject({
    method,
    url,
    headers: token ? { authorization: `Bearer ${token}` } : {},
    ...(payload === undefined ? {} : { payload: payload as object }),
  });
  return { status: reply.statusCode, headers: reply.headers, json: reply.body ? reply.json() : undefined };
}

function expectError(
  reply: { status: number; json: any },
  code: keyof typeof ERROR_CODES,
  message?: RegExp,
): void {
  expect({ status: reply.status, code: reply.json?.code }, JSON.stringify(reply.json)).toEqual({
    status: ERROR_CODES[code],
    code,
  });
  expect(Object.keys(reply.json).sort()).toEqual(['code', 'message']);
  if (message) expect(reply.json.message).toMatch(message);
}

describe('definitions', () => {
  it('PUT, GET, list and DELETE', async () => {
    const put = await call('PUT', '/v1/throttles/FOO', ADMIN, { every: '2s', concurrency: 1, lease: 60_000 });
    expect(put.status).toBe(200);
    expect(put.json).toMatchObject({
      name: 'FOO',
      everyMs: 2000,
      concurrency: 1,
      leaseMs: 60_000,
      limit: null,
    });
    expect(typeof put.json.createdAt).toBe('string');
    expectError(await call('PUT', '/v1/throttles/FOO', ADMIN, { every: '1s' }), 'throttle_exists');
    const kept = await call('PUT', '/v1/throttles/FOO', ADMIN, { every: '1s', ifNotExists: true });
    expect(kept.json.everyMs).toBe(2000);
    expect((await call('GET', '/v1/throttles/FOO', READER)).json).toEqual(put.json);
    expect((await call('GET', '/v1/throttles', READER)).json.map((t: { name: string }) => t.name)).toEqual([
      'FOO',
    ]);
    await call('PUT', '/v1/throttles/temp', ADMIN, { limit: 5, per: '1m' });
    expect((await call('DELETE', '/v1/throttles/temp', ADMIN)).json).toEqual({ removed: true });
    expectError(
      await call('DELETE', '/v1/throttles/temp', ADMIN),
      'throttle_not_found',
      /'temp' does not exist/,
    );
    expect((await call('DELETE', '/v1/throttles/temp?ifExists=true', ADMIN)).json).toEqual({
      removed: false,
    });
    expectError(await call('GET', '/v1/throttles/temp', READER), 'throttle_not_found');
  });

  it('refuses bad definitions with invalid_argument', async () => {
    for (const body of [
      {},
      { limit: 3 },
      { every: '2 s' },
      { every: 0 },
      { every: '1s', burst: 2 },
      { concurrency: 1.5 },
      { concurrency: 0 },
      { every: '1s', ifNotExists: true, overwrite: true },
      { every: '400d' },
    ]) {
      expectError(await call('PUT', '/v1/throttles/bad', ADMIN, body), 'invalid_argument');
    }
    expectError(await call('PUT', '/v1/throttles/9bad', ADMIN, { every: '1s' }), 'invalid_argument');
    expectError(await call('GET', '/v1/throttles/bad', READER), 'throttle_not_found');
  });
});

describe('acquire and the ends of permits', () => {
  it('200 with a permit, then 429 with Retry-After; complete, fail, extend', async () => {
    await ordo.throttles.define({ name: 'api', every: '1500ms', concurrency: 1, lease: '1m' });
    const got = await call('POST', '/v1/throttles/api/acquire', ISSUER, { key: 'tenant-1', holder: 'php-7' });
    expect(got.status).toBe(200);
    expect(got.json).toMatchObject({ granted: true, name: 'api', key: 'tenant-1', holder: 'php-7' });
    expect(new Date(got.json.expiresAt).getTime() - new Date(got.json.acquiredAt).getTime()).toBe(60_000);

    const refused = await call('POST', '/v1/throttles/api/acquire', ISSUER, { key: 'tenant-1' });
    expect(refused.status).toBe(429);
    expect(refused.json).toMatchObject({ code: 'throttled', reason: 'every' });
    expect(refused.json.retryAfterMs).toBeGreaterThan(0);
    expect(refused.json.retryAfterMs).toBeLessThanOrEqual(1500);
    expect(refused.json.message).toMatch(
      /'api' \(key 'tenant-1'\) refused a start \(every\): retry in \d+ ms/,
    );
    expect(refused.json.limit).toEqual({ name: 'api', key: 'tenant-1' });
    // Whole seconds, rounded up.
    expect(refused.headers['retry-after']).toBe(String(Math.ceil(refused.json.retryAfterMs / 1000)));

    // Another key, and no body at all (the key '').
    expect((await call('POST', '/v1/throttles/api/acquire', ISSUER)).status).toBe(200);

    const id = got.json.id as string;
    const extended = await call('POST', `/v1/permits/${id}/extend`, ISSUER);
    expect(extended.status).toBe(200);
    expect(extended.json.id).toBe(id);
    expect(new Date(extended.json.expiresAt).getTime()).toBeGreaterThanOrEqual(
      new Date(got.json.expiresAt).getTime(),
    );
    const failed = await call('POST', `/v1/permits/${id}/fail`, ISSUER, {
      error: 'upstream 503',
      refund: true,
    });
    expect(failed.status).toBe(200);
    expect(failed.json).toMatchObject({ id, outcome: 'failed', refunded: true, key: 'tenant-1' });
    // Refunded: a retry starts at once.
    const retry = await call('POST', '/v1/throttles/api/acquire', ISSUER, { key: 'tenant-1' });
    expect(retry.status).toBe(200);
    const done = await call('POST', `/v1/permits/${retry.json.id}/complete`, ISSUER);
    expect(done.json).toMatchObject({ outcome: 'completed', refunded: false });
    expectError(
      await call('POST', `/v1/permits/${retry.json.id}/complete`, ISSUER),
      'permit_not_found',
      /already ended/,
    );

    const state = await call('GET', '/v1/throttles/api/state?key=tenant-1', READER);
    expect(state.json).toMatchObject({
      name: 'api',
      key: 'tenant-1',
      starts: 2,
      lastOutcome: 'completed',
      lastPermitId: retry.json.id,
      running: [],
    });
  });

  it('a throttle without permits: defined with permits: false, a start with a null expiresAt, nothing to end by id', async () => {
    const put = await call('PUT', '/v1/throttles/plain', ADMIN, { limit: 2, per: '1m', permits: false });
    expect(put.status).toBe(200);
    expect(put.json).toMatchObject({ name: 'plain', permits: false, leaseMs: null, limit: 2 });
    expectError(
      await call('PUT', '/v1/throttles/plain2', ADMIN, { every: '1s', concurrency: 1, permits: false }),
      'invalid_argument',
      /grants no permits \(permits: false\).*not concurrency/,
    );
    expectError(
      await call('PUT', '/v1/throttles/plain2', ADMIN, { every: '1s', permits: 'no' }),
      'invalid_argument',
      /permits/,
    );
    const got = await call('POST', '/v1/throttles/plain/acquire', ISSUER, { key: 'k' });
    expect(got.status).toBe(200);
    expect(got.json).toMatchObject({ granted: true, name: 'plain', key: 'k', expiresAt: null });
    expect(got.json.id).toMatch(/^[0-9a-f-]{36}$/);
    expectError(await call('POST', `/v1/permits/${got.json.id}/complete`, ISSUER), 'permit_not_found');
    expect((await call('POST', '/v1/throttles/plain/acquire', ISSUER, { key: 'k' })).status).toBe(200);
    const refused = await call('POST', '/v1/throttles/plain/acquire', ISSUER, { key: 'k' });
    expect(refused.status).toBe(429);
    expect(refused.json).toMatchObject({ code: 'throttled', reason: 'rate' });
    const state = await call('GET', '/v1/throttles/plain/state?key=k', READER);
    expect(state.json).toMatchObject({ starts: 2, running: [], lastOutcome: null });
  });

  it('an expired permit: 409 permit_expired', async () => {
    await ordo.throttles.define({ name: 'short', concurrency: 1, lease: '50ms' });
    const got = await call('POST', '/v1/throttles/short/acquire', ISSUER);
    await new Promise((resolve) => setTimeout(resolve, 120));
    expectError(
      await call('POST', `/v1/permits/${got.json.id}/complete`, ISSUER),
      'permit_expired',
      /expired at/,
    );
    expectError(await call('POST', `/v1/permits/${got.json.id}/extend`, ISSUER), 'permit_expired');
    const state = await call('GET', '/v1/throttles/short/state', READER);
    expect(state.json).toMatchObject({ lastOutcome: 'expired', lastPermitId: got.json.id });
  });

  it('errors: unknown throttle or permit, bad ids and bodies', async () => {
    expectError(await call('POST', '/v1/throttles/ghost/acquire', ISSUER), 'throttle_not_found');
    expectError(await call('GET', '/v1/throttles/ghost/state', READER), 'throttle_not_found');
    expectError(
      await call('POST', '/v1/permits/7f8c3a39-2f7e-4f27-9a4a-0d3b8f0d1f00/complete', ISSUER),
      'permit_not_found',
    );
    expectError(await call('POST', '/v1/permits/not-a-uuid/complete', ISSUER), 'invalid_argument');
    expectError(
      await call('POST', '/v1/throttles/api/acquire', ISSUER, { key: 'x'.repeat(201) }),
      'invalid_argument',
    );
    expectError(await call('POST', '/v1/throttles/api/acquire', ISSUER, { wait: true }), 'invalid_argument');
    expectError(
      await call('POST', '/v1/throttles/api/acquire', ISSUER, { key: 'a\u0000b' }),
      'invalid_argument',
    );
    expectError(
      await call('POST', '/v1/permits/7f8c3a39-2f7e-4f27-9a4a-0d3b8f0d1f00/fail', ISSUER, { refund: 'yes' }),
      'invalid_argument',
    );
    expectError(await call('GET', '/v1/throttles/api/state?key=a&x=1', READER), 'invalid_argument');
  });
});

describe('several limits, waiting in line, key limits and pauses', () => {
  const waitFor = async (what: string, check: () => Promise<boolean>, ms = 5000) => {
    const deadline = Date.now() + ms;
    while (!(await check())) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 20));
    }
  };
  const waiting = async (name: string, key = '') => (await ordo.throttles.state(name, key)).waiting;

  it('POST /v1/acquire: one permit for every item, or 429 naming the limit; bad bodies are 400', async () => {
    await call('PUT', '/v1/throttles/global', ADMIN, { concurrency: 2 });
    await call('PUT', '/v1/throttles/tenant', ADMIN, { concurrency: 1 });
    const items = (key: string) => [{ name: 'global' }, { name: 'tenant', key }];
    const a = await call('POST', '/v1/acquire', ISSUER, { items: items('a'), holder: 'w-a' });
    expect(a.status).toBe(200);
    expect(a.json.items).toEqual([
      { name: 'global', key: '', cost: 1 },
      { name: 'tenant', key: 'a', cost: 1 },
    ]);
    const again = await call('POST', '/v1/acquire', ISSUER, { items: items('a') });
    expect(again.status).toBe(429);
    expect(again.json).toMatchObject({ reason: 'concurrency', limit: { name: 'tenant', key: 'a' } });
    expect((await call('POST', '/v1/acquire', ISSUER, { items: items('b') })).status).toBe(200);
    const full = await call('POST', '/v1/acquire', ISSUER, { items: items('c') });
    expect(full.json).toMatchObject({ reason: 'concurrency', limit: { name: 'global', key: '' } });
    // The refusal took nothing: completing a's permit frees both of its items at once.
    expect((await call('POST', `/v1/permits/${a.json.id}/complete`, ISSUER)).status).toBe(200);
    expect((await call('POST', '/v1/acquire', ISSUER, { items: items('c') })).status).toBe(200);

    expectError(await call('POST', '/v1/acquire', ISSUER, { items: [] }), 'invalid_argument');
    const many = Array.from({ length: 17 }, (_, i) => ({ name: 'tenant', key: `k${i}` }));
    expectError(await call('POST', '/v1/acquire', ISSUER, { items: many }), 'invalid_argument');
    expectError(
      await call('POST', '/v1/acquire', ISSUER, { items: [{ name: 'tenant' }, { name: 'tenant' }] }),
      'invalid_argument',
      /twice/,
    );
    expectError(
      await call('POST', '/v1/acquire', ISSUER, { items: [{ name: 'tenant', cost: 2 }] }),
      'invalid_argument',
      /can never be granted/,
    );
    expectError(
      await call('POST', '/v1/acquire', ISSUER, { items: [{ name: 'nope' }] }),
      'throttle_not_found',
    );
    expectError(
      await call('POST', '/v1/throttles/tenant/acquire', ISSUER, { wait: 60_001 }),
      'invalid_argument',
    );
  });

  it('wait: a long poll in line, answered when the permit ahead ends', async () => {
    await call('PUT', '/v1/throttles/solo', ADMIN, { concurrency: 1 });
    const held = await call('POST', '/v1/throttles/solo/acquire', ISSUER, {});
    expect(held.status).toBe(200);
    const waiter = call('POST', '/v1/throttles/solo/acquire', ISSUER, { wait: '10s', holder: 'patient' });
    await waitFor('the waiter in line', async () => (await waiting('solo')) === 1);
    // Others do not jump the line: a plain acquire is refused while someone waits.
    const plain = await call('POST', '/v1/throttles/solo/acquire', ISSUER, {});
    expect(plain.json).toMatchObject({ reason: 'concurrency' });
    await call('POST', `/v1/permits/${held.json.id}/complete`, ISSUER);
    const got = await waiter;
    expect(got.status).toBe(200);
    expect(got.json.holder).toBe('patient');
    expect(await waiting('solo')).toBe(0);
    await call('POST', `/v1/permits/${got.json.id}/complete`, ISSUER);
    // A wait that runs out answers 429 with the last reason.
    const blocker = await call('POST', '/v1/throttles/solo/acquire', ISSUER, {});
    const late = await call('POST', '/v1/throttles/solo/acquire', ISSUER, { wait: 300 });
    expect(late.status).toBe(429);
    expect(late.json.reason).toBe('concurrency');
    expect(await waiting('solo')).toBe(0);
    await call('POST', `/v1/permits/${blocker.json.id}/complete`, ISSUER);
  });

  it('a caller that goes away leaves the line, and nothing it was granted stays held', async () => {
    await call('PUT', '/v1/throttles/gone', ADMIN, { concurrency: 1 });
    const url = await open.listen({ port: 0, host: '127.0.0.1' });
    const held = await call('POST', '/v1/throttles/gone/acquire', ISSUER, {});
    const abort = new AbortController();
    const request = fetch(`${url}/v1/throttles/gone/acquire`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ wait: '20s' }),
      signal: abort.signal,
    }).catch((e: unknown) => e);
    await waitFor('the waiter in line', async () => (await waiting('gone')) === 1);
    abort.abort();
    expect(await request).toBeInstanceOf(Error);
    await waitFor('the line to empty', async () => (await waiting('gone')) === 0, 3000);
    await call('POST', `/v1/permits/${held.json.id}/complete`, ISSUER);
    const next = await call('POST', '/v1/throttles/gone/acquire', ISSUER, {});
    expect(next.status).toBe(200);
    expect((await ordo.throttles.running('gone')).map((p) => p.id)).toEqual([next.json.id]);
  });

  it('key limits: PUT and DELETE /v1/throttles/:name/key-limits, listed in state and keys', async () => {
    await call('PUT', '/v1/throttles/tiers', ADMIN, { concurrency: 1, limit: 100, per: '1s' });
    const set = await call('PUT', '/v1/throttles/tiers/key-limits', ADMIN, { key: 'vip', concurrency: 3 });
    expect(set.json).toEqual({ everyMs: null, limit: 100, perMs: 1000, concurrency: 3 });
    const grants = [];
    for (let i = 0; i < 4; i++)
      grants.push((await call('POST', '/v1/throttles/tiers/acquire', ISSUER, { key: 'vip' })).status);
    expect(grants).toEqual([200, 200, 200, 429]);
    expect((await call('POST', '/v1/throttles/tiers/acquire', ISSUER, { key: 'basic' })).status).toBe(200);
    expect((await call('POST', '/v1/throttles/tiers/acquire', ISSUER, { key: 'basic' })).status).toBe(429);
    const state = await call('GET', '/v1/throttles/tiers/state?key=vip', READER);
    expect(state.json.ownLimits).toEqual({ everyMs: null, limit: null, perMs: null, concurrency: 3 });
    expect(state.json.running).toHaveLength(3);
    const keys = await call('GET', '/v1/throttles/tiers/keys', READER);
    expect(keys.json.map((k: { key: string }) => k.key).sort()).toEqual(['basic', 'vip']);
    // ?limit= arrives as text (the server coerces nothing): digits are taken, the range is the library's.
    const one = await call('GET', '/v1/throttles/tiers/keys?limit=1', READER);
    expect(one.status, JSON.stringify(one.json)).toBe(200);
    expect(one.json).toHaveLength(1);
    expect((await call('GET', '/v1/throttles/tiers/keys?limit=5', READER)).json).toHaveLength(2);
    for (const [limit, message] of [
      ['0', /limit must be a whole number from 1 to 10000 \(got 0\)/],
      ['10001', /limit must be a whole number from 1 to 10000/],
      ['2.5', /querystring\.limit must match pattern/],
      ['-1', /querystring\.limit must match pattern/],
      ['five', /querystring\.limit must match pattern/],
      ['', /querystring\.limit must match pattern/],
    ] as const)
      expectError(
        await call('GET', `/v1/throttles/tiers/keys?limit=${limit}`, READER),
        'invalid_argument',
        message,
      );
    const removed = await call('DELETE', '/v1/throttles/tiers/key-limits?key=vip', ADMIN);
    expect(removed.json.concurrency).toBe(1);
    expect(
      (await call('GET', '/v1/throttles/tiers/state?key=vip', READER)).json.ownLimits.concurrency,
    ).toBeNull();
    expectError(
      await call('PUT', '/v1/throttles/tiers/key-limits', ADMIN, { key: 'x', concurrency: 0 }),
      'invalid_argument',
    );
    expectError(
      await call('PUT', '/v1/throttles/tiers/key-limits', ADMIN, { concurrency: 2 }),
      'invalid_argument',
    );
    expectError(
      await call('PUT', '/v1/throttles/nope/key-limits', ADMIN, { key: 'x', concurrency: 2 }),
      'throttle_not_found',
    );
    expectError(
      await call('PUT', '/v1/throttles/tiers/key-limits', ISSUER, { key: 'x', concurrency: 2 }),
      'forbidden',
    );
  });

  it('pauses: POST pause and resume; fail with retryAfter holds the key (429 paused with Retry-After)', async () => {
    await call('PUT', '/v1/throttles/upstream', ADMIN, { concurrency: 5 });
    expect((await call('POST', '/v1/throttles/upstream/pause', ADMIN, { until: '1h' })).json).toEqual({
      paused: true,
    });
    const paused = await call('POST', '/v1/throttles/upstream/acquire', ISSUER, { key: 'any' });
    expect(paused.status).toBe(429);
    expect(paused.json.reason).toBe('paused');
    expect(Number(paused.headers['retry-after'])).toBeGreaterThan(3500);
    expect((await call('POST', '/v1/throttles/upstream/resume', ADMIN, {})).json).toEqual({ paused: false });
    const p = await call('POST', '/v1/throttles/upstream/acquire', ISSUER, { key: 'shop-1' });
    expect(p.status).toBe(200);
    const failed = await call('POST', `/v1/permits/${p.json.id}/fail`, ISSUER, {
      error: '429 from upstream',
      retryAfter: '30s',
    });
    expect(failed.json.outcome).toBe('failed');
    const held = await call('POST', '/v1/throttles/upstream/acquire', ISSUER, { key: 'shop-1' });
    expect(held.json).toMatchObject({ reason: 'paused', limit: { name: 'upstream', key: 'shop-1' } });
    expect(Number(held.headers['retry-after'])).toBeGreaterThanOrEqual(29);
    expect((await call('POST', '/v1/throttles/upstream/acquire', ISSUER, { key: 'shop-2' })).status).toBe(
      200,
    );
    const state = await call('GET', '/v1/throttles/upstream/state?key=shop-1', READER);
    expect(new Date(state.json.pausedUntil).getTime()).toBeGreaterThan(Date.now() + 25_000);
    await call('POST', '/v1/throttles/upstream/resume', ADMIN, { key: 'shop-1' });
    expect((await call('POST', '/v1/throttles/upstream/acquire', ISSUER, { key: 'shop-1' })).status).toBe(
      200,
    );
    expectError(await call('POST', '/v1/throttles/upstream/pause', ADMIN, {}), 'invalid_argument');
    expectError(
      await call('POST', '/v1/throttles/upstream/pause', ADMIN, { until: 'soon' }),
      'invalid_argument',
    );
    expectError(await call('POST', '/v1/throttles/nope/pause', ADMIN, { until: '1s' }), 'throttle_not_found');
  });
});

describe('token scopes', () => {
  it('read for GET, next for acquire and the permit routes, admin for PUT and DELETE', async () => {
    await ordo.throttles.define({ name: 'scoped', concurrency: 10 });
    expectError(await call('GET', '/v1/throttles', undefined), 'unauthorized');
    expectError(await call('POST', '/v1/throttles/scoped/acquire', READER), 'forbidden', /'next' scope/);
    expectError(
      await call('PUT', '/v1/throttles/scoped', ISSUER, { every: '1s' }),
      'forbidden',
      /'admin' scope/,
    );
    expectError(await call('DELETE', '/v1/throttles/scoped', READER), 'forbidden');
    expectError(await call('GET', '/v1/throttles/scoped', ISSUER), 'forbidden', /'read' scope/);
    const got = await call('POST', '/v1/throttles/scoped/acquire', ISSUER);
    expect(got.status).toBe(200);
    expectError(await call('POST', `/v1/permits/${got.json.id}/complete`, READER), 'forbidden');
    expect((await call('POST', `/v1/permits/${got.json.id}/complete`, ISSUER)).status).toBe(200);
    // Without tokens every route is open.
    expect((await open.inject({ method: 'GET', url: '/v1/throttles/scoped' })).statusCode).toBe(200);
  });

  it('the routes are in the OpenAPI document', async () => {
    const doc = (await call('GET', '/openapi.json', READER)).json;
    for (const path of [
      '/v1/throttles',
      '/v1/throttles/{name}',
      '/v1/throttles/{name}/state',
      '/v1/throttles/{name}/acquire',
      '/v1/permits/{id}/complete',
      '/v1/permits/{id}/fail',
      '/v1/permits/{id}/extend',
    ]) {
      expect(Object.keys(doc.paths)).toContain(path);
    }
    expect(Object.keys(doc.paths['/v1/throttles/{name}/acquire'].post.responses)).toContain('429');
  });
});
