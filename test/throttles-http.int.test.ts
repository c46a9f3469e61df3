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
    expect(refused.json.message).toMatch(/'api' refused a start \(every\): retry in \d+ ms/);
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
