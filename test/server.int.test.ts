// `ordo serve` end to end: the server as a real child process on a real PostgreSQL, spoken to
// with Node's fetch, as any client would.
import { existsSync } from 'node:fs';
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type pg from 'pg';
import type { Agent } from 'undici-types';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ERROR_CODES } from '../src/errors.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { killAll, newAgent, runCli, type ServerProcess, startServer } from './support/server-process.js';

const READER = 'reader-token-0123456789';
const ISSUER = 'issuer-token-0123456789';
const ADMIN = 'admin-token-0123456789';
const TOKENS = `${READER}:read,${ISSUER}:next,${ADMIN}:admin+read+next`;

let db: TestDatabase;
let pool: pg.Pool;
/** No tokens: every route open. */
let server: ServerProcess;
/** ORDO_TOKENS as above. */
let guarded: ServerProcess;
let scratch: string;

beforeAll(async () => {
  db = await freshDatabase();
  pool = db.pool(4);
  scratch = await mkdtemp(join(tmpdir(), 'ordo-server-'));
  // As root, the embedded PostgreSQL runs as `postgres`, which must reach its data directory.
  await chmod(scratch, 0o755);
  [server, guarded] = await Promise.all([
    startServer({ databaseUrl: db.url }),
    startServer({ databaseUrl: db.url, env: { ORDO_TOKENS: TOKENS } }),
  ]);
});

afterAll(async () => {
  await Promise.all([server?.stop().catch(() => undefined), guarded?.stop().catch(() => undefined)]);
  await killAll();
  await db?.drop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

interface Reply {
  status: number;
  contentType: string | null;
  retryAfter: string | null;
  text: string;
  json: any;
}

interface Call {
  /** Sent as JSON with content-type application/json. */
  json?: unknown;
  /** Sent as it is (give contentType too: fetch would otherwise say text/plain). */
  body?: string;
  contentType?: string;
  token?: string;
  headers?: Record<string, string>;
  /** A connection pool of the test's own (newAgent()). */
  dispatcher?: Agent;
}

async function http(base: string, method: string, path: string, call: Call = {}): Promise<Reply> {
  const headers: Record<string, string> = { ...call.headers };
  let body: string | undefined;
  if ('json' in call) {
    body = JSON.stringify(call.json);
    headers['content-type'] = 'application/json';
  } else if (call.body !== undefined) body = call.body;
  if (call.contentType !== undefined) headers['content-type'] = call.contentType;
  if (call.token !== undefined) headers.authorization = `Bearer ${call.token}`;
  const response = await fetch(`${base}${path}`, {
    method,
    headers,
    body,
    signal: AbortSignal.timeout(20_000),
    ...(call.dispatcher ? { dispatcher: call.dispatcher } : {}),
  });
  const text = await response.text();
  let json: any;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return {
    status: response.status,
    contentType: response.headers.get('content-type'),
    retryAfter: response.headers.get('retry-after'),
    text,
    json,
  };
}

const api = (method: string, path: string, call?: Call) => http(server.url, method, path, call);

/** An error answer: the status of its code in ERROR_CODES, and exactly { code, message }. */
function expectError(reply: Reply, code: keyof typeof ERROR_CODES, message?: string | RegExp): void {
  expect(
    { status: reply.status, code: reply.json?.code },
    `${reply.status} ${reply.text.slice(0, 300)}`,
  ).toEqual({ status: ERROR_CODES[code], code });
  expect(reply.contentType).toMatch(/^application\/json/);
  expect(Object.keys(reply.json).sort()).toEqual(['code', 'message']);
  expect(typeof reply.json.message).toBe('string');
  expect(reply.json.message.length).toBeGreaterThan(0);
  if (typeof message === 'string') expect(reply.json.message).toBe(message);
  else if (message) expect(reply.json.message).toMatch(message);
  // Every 503 is transient and says when to come back; nothing else does.
  if (reply.status === 503) expect(reply.retryAfter).toMatch(/^[1-9]\d*$/);
  else if (reply.status !== 429) expect(reply.retryAfter).toBeNull();
}

/** Prometheus text → the value of one sample, or undefined. */
function sample(text: string, name: string, labels: Record<string, string> = {}): number | undefined {
  for (const line of text.split('\n')) {
    const m = /^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const found: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) found[l[1]!] = l[2]!;
    if (Object.entries(labels).every(([k, v]) => found[k] === v)) return Number(m[3]);
  }
  return undefined;
}

async function counters(sequence: string): Promise<{ scope: string; period: string; value: number }[]> {
  const { rows } = await pool.query(
    `SELECT scope, period::text AS period, value::float8 AS value
       FROM ordo.counters WHERE sequence = $1 ORDER BY scope, period`,
    [sequence],
  );
  return rows;
}

async function until(check: () => boolean | Promise<boolean>, ms = 15_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await sleep(20);
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** 1, 2, …, n */
const upTo = (n: number) => Array.from({ length: n }, (_, i) => i + 1);

describe('routes', () => {
  it('PUT defines, GET lists and reads, POST next issues, DELETE removes', async () => {
    const options = { reset: 'year', timeZone: 'Europe/Paris', format: 'INV-{YYYY}-{n:6}' };
    const defined = await api('PUT', '/v1/sequences/invoice', { json: options });
    expect(defined.status).toBe(200);
    expect(defined.json).toMatchObject({
      name: 'invoice',
      kind: 'gapless',
      start: 1,
      increment: 1,
      batch: null,
      timeoutMs: null,
      cycle: false,
      ...options,
      epoch: expect.any(Number),
    });
    expect(new Date(defined.json.createdAt).toISOString()).toBe(defined.json.createdAt);

    // The same again is sequence_exists; ifNotExists keeps the first.
    expectError(await api('PUT', '/v1/sequences/invoice', { json: options }), 'sequence_exists');
    const kept = await api('PUT', '/v1/sequences/invoice', { json: { ifNotExists: true } });
    expect(kept.status).toBe(200);
    expect(kept.json).toEqual(defined.json);

    const one = await api('GET', '/v1/sequences/invoice');
    expect(one.status).toBe(200);
    expect(one.json).toEqual(defined.json);
    const all = await api('GET', '/v1/sequences');
    expect(all.status).toBe(200);
    expect(all.json).toContainEqual(defined.json);

    // 23:30 UTC on 31 December is already the new year in Paris.
    const first = await api('POST', '/v1/sequences/invoice/next', {
      json: { scope: 'acme', at: '2026-12-31T23:30:00Z' },
    });
    expect(first.status).toBe(200);
    expect(first.json).toEqual({
      value: 1,
      values: [1],
      text: 'INV-2027-000001',
      texts: ['INV-2027-000001'],
      period: '2027-01-01',
    });
    const many = await api('POST', '/v1/sequences/invoice/next', {
      json: { scope: 'acme', at: '2027-03-01T10:00:00+01:00', count: 4 },
    });
    expect(many.status).toBe(200);
    expect(many.json).toEqual({
      value: 2,
      values: [2, 3, 4, 5],
      text: 'INV-2027-000002',
      texts: ['INV-2027-000002', 'INV-2027-000003', 'INV-2027-000004', 'INV-2027-000005'],
      period: '2027-01-01',
    });
    // No body at all, and a JSON null, are both "no options": scope '' in the current year.
    const bare = await api('POST', '/v1/sequences/invoice/next');
    expect(bare.status).toBe(200);
    expect(bare.json.values).toEqual([1]);
    const nulled = await api('POST', '/v1/sequences/invoice/next', { json: null });
    expect(nulled.status).toBe(200);
    expect(nulled.json.values).toEqual([2]);
    const year = new Date().getUTCFullYear();
    expect(nulled.json.text).toMatch(new RegExp(`^INV-(${year}|${year + 1})-000002$`));

    // What was answered is what PostgreSQL holds.
    expect(await counters('invoice')).toEqual([
      { scope: '', period: nulled.json.period, value: 2 },
      { scope: 'acme', period: '2027-01-01', value: 5 },
    ]);

    // overwrite replaces the definition, bumps its epoch, and keeps the numbering going.
    const redefined = await api('PUT', '/v1/sequences/invoice', {
      json: { ...options, format: 'NEW-{n}', overwrite: true },
    });
    expect(redefined.status).toBe(200);
    expect(redefined.json).toMatchObject({ format: 'NEW-{n}', createdAt: defined.json.createdAt });
    expect(redefined.json.epoch).not.toBe(defined.json.epoch);
    const after = await api('POST', '/v1/sequences/invoice/next', {
      json: { scope: 'acme', at: '2027-06-01T00:00:00Z' },
    });
    expect(after.json).toMatchObject({ values: [6], texts: ['NEW-6'] });

    const removed = await api('DELETE', '/v1/sequences/invoice');
    expect(removed.status).toBe(200);
    expect(removed.json).toEqual({ removed: true });
    expect(await counters('invoice')).toEqual([]);
    expectError(await api('GET', '/v1/sequences/invoice'), 'sequence_not_found');
    expectError(
      await api('DELETE', '/v1/sequences/invoice'),
      'sequence_not_found',
      "The sequence 'invoice' does not exist",
    );
    const quiet = await api('DELETE', '/v1/sequences/invoice?ifExists=true');
    expect(quiet.status).toBe(200);
    expect(quiet.json).toEqual({ removed: false });
    expect((await api('GET', '/v1/sequences')).json.map((d: { name: string }) => d.name)).not.toContain(
      'invoice',
    );

    // One JSON log line per request.
    await until(() =>
      server
        .logs()
        .some(
          (l) =>
            l.msg === 'request' &&
            l.method === 'DELETE' &&
            l.status === 404 &&
            l.url === '/v1/sequences/invoice',
        ),
    );
    expect(server.logs()).toContainEqual(
      expect.objectContaining({
        msg: 'request',
        method: 'POST',
        url: '/v1/sequences/invoice/next',
        status: 200,
        ms: expect.any(Number),
      }),
    );
  });

  it('count returns exactly that many consecutive values, for both kinds', async () => {
    expect((await api('PUT', '/v1/sequences/stepped', { json: { start: 10, increment: 5 } })).status).toBe(
      200,
    );
    expect(
      (await api('PUT', '/v1/sequences/ranged', { json: { kind: 'batched', batch: 7, start: 100 } })).status,
    ).toBe(200);
    let expected = 10;
    for (const count of [1, 2, 3, 17, 100]) {
      const r = await api('POST', '/v1/sequences/stepped/next', { json: { count } });
      expect(r.status).toBe(200);
      expect(r.json.values).toEqual(Array.from({ length: count }, (_, i) => expected + 5 * i));
      expect(r.json.texts).toEqual(r.json.values.map(String));
      expect(r.json.value).toBe(expected);
      expected += 5 * count;
    }
    const big = await api('POST', '/v1/sequences/stepped/next', { json: { count: 10_000 } });
    expect(big.status).toBe(200);
    expect(big.json.values).toHaveLength(10_000);
    expect(big.json.values.at(-1) - big.json.values[0]).toBe(5 * 9_999);

    // Batched: one node's values increase one by one across its ranges of 7.
    const taken: number[] = [];
    for (const count of [1, 5, 20, 3]) {
      const r = await api('POST', '/v1/sequences/ranged/next', { json: { count } });
      expect(r.status).toBe(200);
      expect(r.json.values).toHaveLength(count);
      expect(r.json.period).toBeNull();
      taken.push(...r.json.values);
    }
    expect(taken).toEqual(Array.from({ length: 29 }, (_, i) => 100 + i));
  });

  it('starts without a warning: no Ajv strict mode line, nothing but its JSON log lines', () => {
    // Both servers have compiled every route's schema: they answered /healthz after listening.
    for (const started of [server, guarded]) {
      const output = started.output();
      expect(output).not.toMatch(/strict mode|allowUnionTypes/);
      expect(output.split('\n').filter((line) => line.trim() !== '' && !line.startsWith('{'))).toEqual([]);
    }
  });

  it('GET /healthz answers 200 { status: ok }', async () => {
    const r = await api('GET', '/healthz');
    expect(r.status).toBe(200);
    expect(r.json).toEqual({ status: 'ok' });
  });

  it('GET /metrics counts requests, values issued, errors by code and range reservations', async () => {
    expect((await api('PUT', '/v1/sequences/metered', { json: {} })).status).toBe(200);
    expect((await api('PUT', '/v1/sequences/ids', { json: { kind: 'batched', batch: 10 } })).status).toBe(
      200,
    );
    const before = (await api('GET', '/metrics')).text;
    const beforeNotFound = sample(before, 'ordo_errors_total', { code: 'sequence_not_found' }) ?? 0;
    const beforeNext =
      sample(before, 'ordo_http_requests_total', {
        route: '/v1/sequences/:name/next',
        method: 'POST',
        status: '200',
      }) ?? 0;

    expect((await api('POST', '/v1/sequences/metered/next')).status).toBe(200);
    expect((await api('POST', '/v1/sequences/metered/next', { json: { count: 4 } })).status).toBe(200);
    expect((await api('POST', '/v1/sequences/ids/next', { json: { count: 25 } })).status).toBe(200);
    expectError(await api('POST', '/v1/sequences/ghost/next'), 'sequence_not_found');
    expectError(await api('GET', '/v1/sequences/ghost'), 'sequence_not_found');

    const metrics = await api('GET', '/metrics');
    expect(metrics.status).toBe(200);
    expect(metrics.contentType).toMatch(/^text\/plain/);
    const text = metrics.text;
    expect(text).toContain('# TYPE ordo_http_requests_total counter');
    expect(
      sample(text, 'ordo_http_requests_total', {
        route: '/v1/sequences/:name/next',
        method: 'POST',
        status: '200',
      }),
    ).toBe(beforeNext + 3);
    expect(
      sample(text, 'ordo_http_requests_total', {
        route: '/v1/sequences/:name',
        method: 'GET',
        status: '404',
      }),
    ).toBeGreaterThanOrEqual(1);
    expect(sample(text, 'ordo_values_issued_total', { sequence: 'metered' })).toBe(5);
    expect(sample(text, 'ordo_values_issued_total', { sequence: 'ids' })).toBe(25);
    expect(sample(text, 'ordo_errors_total', { code: 'sequence_not_found' })).toBe(beforeNotFound + 2);
    // 25 values from ranges of 10: at least three ranges reserved.
    expect(sample(text, 'ordo_range_reservations_total', { sequence: 'ids' })).toBeGreaterThanOrEqual(3);
    expect(sample(text, 'ordo_http_request_duration_seconds_count', { route: '/healthz' })).toBeGreaterThan(
      0,
    );
  });

  it('GET /openapi.json is an OpenAPI 3.1 document listing the /v1 routes', async () => {
    const r = await api('GET', '/openapi.json');
    expect(r.status).toBe(200);
    expect(r.json.openapi).toBe('3.1.0');
    expect(r.json.info).toMatchObject({ title: 'ordo', version: expect.any(String) });
    const paths = r.json.paths as Record<string, Record<string, unknown>>;
    const routes = Object.entries(paths).flatMap(([path, methods]) =>
      Object.keys(methods).map((m) => `${m.toUpperCase()} ${path}`),
    );
    expect(routes.sort()).toEqual(
      [
        'DELETE /v1/sequences/{name}',
        'GET /v1/sequences',
        'GET /v1/sequences/{name}',
        'GET /v1/sequences/{name}/holders',
        'POST /v1/query',
        'POST /v1/sequences/{name}/next',
        'PUT /v1/sequences/{name}',
        'POST /v1/topics/{topic}/messages',
        'GET /v1/relays',
        'GET /v1/subscriptions',
        'GET /v1/subscriptions/{name}',
        'PUT /v1/subscriptions/{name}',
        'POST /v1/subscriptions/{name}/seek',
        'POST /v1/subscriptions/{name}/receive',
        'POST /v1/subscriptions/{name}/ack',
        'POST /v1/subscriptions/{name}/nack',
        'GET /v1/throttles',
        'GET /v1/throttles/{name}',
        'PUT /v1/throttles/{name}',
        'DELETE /v1/throttles/{name}',
        'GET /v1/throttles/{name}/state',
        'GET /v1/throttles/{name}/keys',
        'PUT /v1/throttles/{name}/key-limits',
        'DELETE /v1/throttles/{name}/key-limits',
        'POST /v1/throttles/{name}/pause',
        'POST /v1/throttles/{name}/resume',
        'POST /v1/throttles/{name}/acquire',
        'POST /v1/acquire',
        'POST /v1/permits/{id}/complete',
        'POST /v1/permits/{id}/fail',
        'POST /v1/permits/{id}/extend',
        'GET /v1/dashboard',
      ].sort(),
    );
    const next = paths['/v1/sequences/{name}/next']!.post as any;
    expect(next.requestBody.content['application/json'].schema.properties).toHaveProperty('count');
    expect(Object.keys(next.responses)).toEqual(expect.arrayContaining(['200', '400', '404', '409', '503']));
    // Without tokens, no security requirement is advertised; with tokens, bearer.
    expect(r.json.security ?? []).toEqual([]);
    const secured = await http(guarded.url, 'GET', '/openapi.json', { token: READER });
    expect(secured.json.security).toEqual([{ bearer: [] }]);
    expect(secured.json.components.securitySchemes.bearer).toMatchObject({ type: 'http', scheme: 'bearer' });
  });

  it('GET / is the dashboard page: open (it holds no data), asking for a token where tokens are set', async () => {
    for (const [s, auth] of [
      [server, 'none'],
      [guarded, 'bearer'],
    ] as const) {
      const page = await http(s.url, 'GET', '/');
      expect(page.status).toBe(200);
      expect(page.contentType).toBe('text/html; charset=utf-8');
      expect(page.text).toContain(`<meta name="ordo-auth" content="${auth}">`);
      const script = await http(s.url, 'GET', '/dashboard.js');
      expect(script.status).toBe(200);
      expect(script.contentType).toBe('text/javascript; charset=utf-8');
    }
    const data = await api('GET', '/v1/dashboard');
    expect(data.status).toBe(200);
    expect(Object.keys(data.json).sort()).toEqual([
      'at',
      'nodeId',
      'sequences',
      'subscriptions',
      'throttles',
      'windowMs',
    ]);
  });
});

describe('concurrency', () => {
  it('64 concurrent clients on one gapless sequence get exactly 1..n, count > 1 mixed in', async () => {
    expect((await api('PUT', '/v1/sequences/crowd', { json: {} })).status).toBe(200);
    const answers: number[][] = [];
    const failures: string[] = [];
    await Promise.all(
      Array.from({ length: 64 }, async (_, client) => {
        for (let i = 0; i < 8; i++) {
          const count = [1, 1, 2, 1, 5, 1, 3, 1][(client + i) % 8]!;
          const r = await api('POST', '/v1/sequences/crowd/next', { json: count === 1 ? {} : { count } });
          if (r.status !== 200) failures.push(`${r.status} ${r.text}`);
          else {
            expect(r.json.values).toHaveLength(count);
            answers.push(r.json.values);
          }
        }
      }),
    );
    expect(failures).toEqual([]);
    // Each answer is consecutive, and all answers together are 1..n with nothing twice.
    for (const values of answers) expect(values).toEqual(values.map((_, i) => values[0]! + i));
    const all = answers.flat().sort((a, b) => a - b);
    expect(all).toHaveLength(64 * (1 + 1 + 2 + 1 + 5 + 1 + 3 + 1));
    expect(all).toEqual(upTo(all.length));
    expect(await counters('crowd')).toEqual([{ scope: '', period: expect.any(String), value: all.length }]);
  });
});

describe('POST /v1/query', () => {
  it("answers SurrealDB's examples statement by statement", async () => {
    const ok = await api('POST', '/v1/query', {
      json: { query: "DEFINE SEQUENCE mySeq2 BATCH 1000 START 100 TIMEOUT 5s; sequence::nextval('mySeq2');" },
    });
    expect(ok.status).toBe(200);
    expect(ok.json).toEqual([{ result: null }, { result: 100 }]);
    const again = await api('POST', '/v1/query', { json: { query: "RETURN sequence::nextval('mySeq2')" } });
    expect(again.json).toEqual([{ result: 101 }]);

    const timedOut = await api('POST', '/v1/query', {
      json: { query: "DEFINE SEQUENCE mySeq3 BATCH 1000 START 100 TIMEOUT 0s; sequence::nextval('mySeq3');" },
    });
    expect(timedOut.status).toBe(200);
    expect(timedOut.json).toEqual([
      { result: null },
      { error: 'The query was not executed because it exceeded the timeout: 0ns', code: 'timeout' },
    ]);
    expect((await api('GET', '/v1/sequences/mySeq3')).json).toMatchObject({ kind: 'batched', timeoutMs: 0 });
  });

  it('a parse error is a 400 invalid_argument, and nothing of the text runs', async () => {
    expectError(
      await api('POST', '/v1/query', { json: { query: 'DEFINE SEQUENCE' } }),
      'invalid_argument',
      'Parse error: expected a sequence name, found end of input at 1:16',
    );
    expectError(
      await api('POST', '/v1/query', { json: { query: 'DEFINE SEQUENCE parsedFirst; DEFINE SEQUENCE' } }),
      'invalid_argument',
      /^Parse error: .* at 1:\d+$/,
    );
    expectError(await api('GET', '/v1/sequences/parsedFirst'), 'sequence_not_found');
    expectError(await api('POST', '/v1/query', { json: { query: '' } }), 'invalid_argument');
    expectError(await api('POST', '/v1/query', { json: {} }), 'invalid_argument');
    expectError(
      await api('POST', '/v1/query', { json: { query: 'INFO FOR DB', extra: 1 } }),
      'invalid_argument',
    );
    expectError(await api('POST', '/v1/query', { json: { query: 42 } }), 'invalid_argument');
  });
});

describe('errors: every code the HTTP API answers, with its status and { code, message }', () => {
  const seen = new Set<string>();
  const check = (reply: Reply, code: keyof typeof ERROR_CODES, message?: string | RegExp) => {
    expectError(reply, code, message);
    seen.add(code);
  };

  beforeAll(async () => {
    for (const [name, body] of [
      ['taken', {}],
      ['tiny', { maxValue: 1 }],
      ['stuck', { kind: 'batched', timeout: 0 }],
    ] as const) {
      const r = await api('PUT', `/v1/sequences/${name}`, { json: body });
      expect(r.status, r.text).toBe(200);
    }
  });

  it('invalid_argument 400: wrong types', async () => {
    for (const body of [
      { start: '1' },
      { start: 1.5 },
      { kind: 'linear' },
      { cycle: 'yes' },
      { reset: 'hourly' },
      { format: 5 },
      { timeout: true },
      { ifNotExists: 1 },
      { timeZone: '' },
    ]) {
      check(await api('PUT', '/v1/sequences/typed', { json: body }), 'invalid_argument');
    }
    for (const body of [[], 'count', 5, true, { count: '2' }, { count: 2.5 }, { scope: 7 }, { at: 0 }]) {
      check(await api('POST', '/v1/sequences/taken/next', { json: body }), 'invalid_argument');
    }
    check(await api('PUT', '/v1/sequences/typed', { json: [] }), 'invalid_argument');
    check(await api('DELETE', '/v1/sequences/taken?ifExists=yes'), 'invalid_argument');
    // Which values are allowed, and what was sent.
    check(
      await api('PUT', '/v1/sequences/typed', { json: { reset: 'yearly' } }),
      'invalid_argument',
      'body.reset must be one of "never", "day", "week", "month", "year" (got "yearly")',
    );
    check(
      await api('PUT', '/v1/sequences/typed', { json: { start: '1' } }),
      'invalid_argument',
      'body.start must be integer (got "1")',
    );
    check(
      await api('POST', '/v1/sequences/taken/next', { json: { count: 0 } }),
      'invalid_argument',
      // Values are checked once, by the library, in its words.
      'count must be a whole number from 1 to 10000 (got 0)',
    );
    check(
      await api('POST', '/v1/topics/typed/messages', {
        json: { messages: [{ type: 'a', data: 1 }, { data: 1 }] },
      }),
      'invalid_argument',
      "body.messages.1 needs the property 'type'",
    );
    expect((await api('GET', '/v1/sequences/taken')).status).toBe(200);
  });

  it('invalid_argument 400: unknown properties, in bodies and query strings', async () => {
    // The message names the property and what is known, as the library's own messages do.
    check(
      await api('PUT', '/v1/sequences/typed', { json: { name: 'other' } }),
      'invalid_argument',
      /^body has no property 'name'; known properties: kind, start, increment, .*timeZone, format, batch, timeout, ifNotExists, overwrite$/,
    );
    check(
      await api('PUT', '/v1/sequences/typed', { json: { strat: 1 } }),
      'invalid_argument',
      /^body has no property 'strat'; known properties: kind, start,/,
    );
    check(
      await api('POST', '/v1/sequences/taken/next', { json: { counts: 2 } }),
      'invalid_argument',
      "body has no property 'counts'; known properties: scope, count, at",
    );
    check(
      await api('DELETE', '/v1/sequences/taken?force=true'),
      'invalid_argument',
      "querystring has no property 'force'; known properties: ifExists",
    );
    check(
      await api('PUT', '/v1/throttles/typed', { json: { every: '1m', concurency: 1 } }),
      'invalid_argument',
      /^body has no property 'concurency'; known properties: every, limit, per, concurrency,/,
    );
    expectError(await api('GET', '/v1/sequences/typed'), 'sequence_not_found');
  });

  it('invalid_argument 400: out-of-range numbers and texts', async () => {
    for (const body of [
      { start: 2 ** 53 },
      { start: -(2 ** 53) },
      { increment: 0 },
      { kind: 'batched', batch: 0 },
      { kind: 'batched', batch: 1_000_001 },
      { kind: 'batched', timeout: -1 },
      { kind: 'batched', timeout: '5 fortnights' },
      { format: 'x'.repeat(201) },
      { format: 'no number' },
      { timeZone: 'Mars/Olympus_Mons' },
      { start: 10, maxValue: 5 },
      { kind: 'gapless', batch: 10 },
    ]) {
      check(await api('PUT', '/v1/sequences/ranged_bad', { json: body }), 'invalid_argument');
    }
    // Numbers JSON can write and JavaScript cannot hold (JSON.stringify would not send them).
    for (const body of ['{"start":1e400}', '{"maxValue":9007199254740993}', '{"start":-1e400}']) {
      check(
        await api('PUT', '/v1/sequences/ranged_bad', { body, contentType: 'application/json' }),
        'invalid_argument',
      );
    }
    for (const body of [
      { count: 0 },
      { count: 10_001 },
      { count: -1 },
      { scope: 's'.repeat(201) },
      { at: 'yesterday' },
      { at: '2026-05-01T10:00:00' },
      { at: 'x'.repeat(65) },
    ]) {
      check(await api('POST', '/v1/sequences/taken/next', { json: body }), 'invalid_argument');
    }
    check(
      await api('POST', '/v1/sequences/stuck/next', { json: { scope: 'tenant' } }),
      'invalid_argument',
      "The sequence 'stuck' is batched: it takes no scope and no at",
    );
    expectError(await api('GET', '/v1/sequences/ranged_bad'), 'sequence_not_found');
  });

  it('invalid_argument 400: bad names in the path', async () => {
    for (const name of [
      '1abc',
      'a-b',
      'a.b',
      '%E2%82%AC',
      '%00',
      'x'.repeat(64),
      "a'%3B--",
      '%20',
      'a%2Fb',
    ]) {
      for (const [method, suffix, body] of [
        ['GET', '', undefined],
        ['PUT', '', {}],
        ['DELETE', '', undefined],
        ['POST', '/next', {}],
      ] as const) {
        const call = body === undefined ? {} : { json: body };
        check(
          await api(method, `/v1/sequences/${name}${suffix}`, call),
          'invalid_argument',
          /^params.name must match pattern .* \(got .*\)$/,
        );
      }
    }
    // 63 characters is the longest name.
    const longest = `a${'b'.repeat(62)}`;
    expect((await api('PUT', `/v1/sequences/${longest}`, { json: {} })).status).toBe(200);
  });

  it('invalid_argument 400: malformed JSON, an empty JSON body, a prototype-polluting body', async () => {
    for (const body of ['{"count":', '{count: 1}', "{'count':1}", '{"count":1}}', 'nul', '\u0000']) {
      check(
        await api('POST', '/v1/sequences/taken/next', { body, contentType: 'application/json' }),
        'invalid_argument',
      );
    }
    check(
      await api('POST', '/v1/sequences/taken/next', { body: '', contentType: 'application/json' }),
      'invalid_argument',
    );
    check(
      await api('PUT', '/v1/sequences/polluted', {
        body: '{"__proto__":{"kind":"batched"}}',
        contentType: 'application/json',
      }),
      'invalid_argument',
    );
    expectError(await api('GET', '/v1/sequences/polluted'), 'sequence_not_found');
  });

  it('unauthorized 401 and forbidden 403', async () => {
    check(await http(guarded.url, 'GET', '/v1/sequences'), 'unauthorized');
    check(
      await http(guarded.url, 'GET', '/v1/sequences', { token: 'wrong-token-0123456789' }),
      'unauthorized',
    );
    check(await http(guarded.url, 'POST', '/v1/sequences/x/next', { token: READER, json: {} }), 'forbidden');
  });

  it('not_found 404: no such route or method', async () => {
    check(await api('GET', '/nope'), 'not_found', 'no route GET /nope');
    check(await api('GET', '/v2/sequences'), 'not_found');
    check(await api('POST', '/v1/sequences', { json: {} }), 'not_found');
    check(await api('GET', '/v1/sequences/taken/next'), 'not_found');
    check(await api('PATCH', '/v1/sequences/taken', { json: {} }), 'not_found');
    check(await api('GET', '/v1/sequences/taken/next/more'), 'not_found');
    check(await api('GET', '/v1/query'), 'not_found');
  });

  it('sequence_not_found 404, sequence_exists 409, sequence_exhausted 409', async () => {
    check(
      await api('POST', '/v1/sequences/ghost/next'),
      'sequence_not_found',
      "The sequence 'ghost' does not exist",
    );
    check(await api('GET', '/v1/sequences/ghost'), 'sequence_not_found');
    check(await api('PUT', '/v1/sequences/taken', { json: {} }), 'sequence_exists', /already exists/);
    expect((await api('POST', '/v1/sequences/tiny/next')).json.values).toEqual([1]);
    check(await api('POST', '/v1/sequences/tiny/next'), 'sequence_exhausted', /exhausted/);
    check(await api('POST', '/v1/sequences/tiny/next', { json: { count: 3 } }), 'sequence_exhausted');
    expect(await counters('tiny')).toEqual([{ scope: '', period: expect.any(String), value: 1 }]);
  });

  it('payload_too_large 413: a body over 64 KiB', async () => {
    const huge = JSON.stringify({ scope: 'x'.repeat(64 * 1024) });
    check(
      await api('POST', '/v1/sequences/taken/next', { body: huge, contentType: 'application/json' }),
      'payload_too_large',
    );
    check(
      await api('POST', '/v1/query', {
        body: JSON.stringify({ query: `-- ${'x'.repeat(70_000)}` }),
        contentType: 'application/json',
      }),
      'payload_too_large',
    );
    // Just under the limit is read, then refused by the schema.
    const under = JSON.stringify({ scope: 'x'.repeat(60 * 1024) });
    check(
      await api('POST', '/v1/sequences/taken/next', { body: under, contentType: 'application/json' }),
      'invalid_argument',
    );
  });

  it('unsupported_media_type 415: a body that is not JSON', async () => {
    for (const contentType of [
      'application/xml',
      'application/x-www-form-urlencoded',
      'multipart/form-data; boundary=x',
      'application/octet-stream',
      'text/json',
      // JSON declared in another encoding: refused rather than read as UTF-8.
      'application/json; charset=utf-16',
      'application/json; charset="latin1"',
    ]) {
      check(
        await api('POST', '/v1/sequences/taken/next', { body: '{"count":1}', contentType }),
        'unsupported_media_type',
      );
      check(await api('PUT', '/v1/sequences/media', { body: '{}', contentType }), 'unsupported_media_type');
    }
    expectError(await api('GET', '/v1/sequences/media'), 'sequence_not_found');
    check(
      await api('PUT', '/v1/sequences/media', {
        body: '{}',
        contentType: 'application/json; charset=utf-16',
      }),
      'unsupported_media_type',
      'bodies must be UTF-8 JSON (got charset=utf-16)',
    );
    expect(
      (
        await api('PUT', '/v1/sequences/media', {
          body: '{}',
          contentType: 'application/json; charset=UTF-8',
        })
      ).status,
    ).toBe(200);
  });

  it('timeout 503: a batched sequence with timeout 0', async () => {
    check(
      await api('POST', '/v1/sequences/stuck/next'),
      'timeout',
      'The query was not executed because it exceeded the timeout: 0ns',
    );
    check(await api('POST', '/v1/sequences/stuck/next', { json: { count: 2 } }), 'timeout');
  });

  it('covered every code above', () => {
    expect([...seen].sort()).toEqual(
      [
        'invalid_argument',
        'unauthorized',
        'forbidden',
        'not_found',
        'sequence_not_found',
        'sequence_exists',
        'sequence_exhausted',
        'payload_too_large',
        'unsupported_media_type',
        'timeout',
      ].sort(),
    );
  });
});

describe('known bugs (when one of these fails, its bug is fixed: make it a plain it)', () => {
  // curl -X POST localhost:7070/v1/sequences/x/next -H 'content-type: text/plain' -d '{}'
  // → 400 invalid_argument "body must be object,null" (Fastify's built-in text/plain parser)
  it('a text/plain body is 415 unsupported_media_type, as any other body that is not JSON', async () => {
    expectError(
      await api('POST', '/v1/sequences/taken/next', { body: '{}', contentType: 'text/plain' }),
      'unsupported_media_type',
    );
  });

  // curl -X PUT localhost:7070/v1/sequences/x -H 'content-type: application/json' -d '{"timeZone":"\u0000"}'
  // → 500 database_error "invalid byte sequence for encoding "UTF8": 0x00"
  it('a NUL character in timeZone is invalid_argument, not a 500', async () => {
    expectError(
      await api('PUT', '/v1/sequences/nul_zone', { json: { timeZone: 'UTC\u0000' } }),
      'invalid_argument',
    );
  });

  // curl -X PUT localhost:7070/v1/sequences/x -H 'content-type: application/json' -d '{"format":"{n}\u0000"}'
  it('a NUL character in format is invalid_argument, not a 500', async () => {
    expectError(
      await api('PUT', '/v1/sequences/nul_format', { json: { format: '{n}\u0000' } }),
      'invalid_argument',
    );
  });

  // curl localhost:7070/v1/sequences/%zz
  // → 400 {"error":"Bad Request","code":"FST_ERR_BAD_URL",…,"statusCode":400}
  it('a malformed percent-encoding in the path is answered { code, message } with an ordo code', async () => {
    const r = await api('GET', '/v1/sequences/%zz');
    expect(r.status).toBe(400);
    expectError(r, 'invalid_argument');
  });

  // curl localhost:7070/v1/sequences/$(printf 'a%.0s' {1..101})
  // → 414 {"error":"Bad Request","code":"FST_ERR_MAX_PARAM_LENGTH","message":"'/v1/sequences/aaa…' …"}
  it('a path name over 100 characters is 400 invalid_argument like any other bad name', async () => {
    expectError(await api('GET', `/v1/sequences/${'a'.repeat(101)}`), 'invalid_argument');
  });
});

describe('tokens', () => {
  const routes = [
    { scope: 'read', method: 'GET', path: '/v1/sequences' },
    { scope: 'read', method: 'GET', path: '/v1/sequences/shared' },
    { scope: 'read', method: 'GET', path: '/metrics' },
    { scope: 'read', method: 'GET', path: '/openapi.json' },
    { scope: 'read', method: 'GET', path: '/v1/dashboard' },
    { scope: 'next', method: 'POST', path: '/v1/sequences/shared/next', json: { count: 2 } },
    { scope: 'admin', method: 'PUT', path: '/v1/sequences/shared', json: { ifNotExists: true } },
    { scope: 'admin', method: 'POST', path: '/v1/query', json: { query: 'INFO FOR DB' } },
    { scope: 'admin', method: 'DELETE', path: '/v1/sequences/gone?ifExists=true' },
  ] as const;
  const call = (r: (typeof routes)[number], token?: string): Call => ({
    ...('json' in r ? { json: r.json } : {}),
    ...(token === undefined ? {} : { token }),
  });

  it('ORDO_TOKENS: 401 without a valid token, 403 without the scope, /healthz open', async () => {
    const admin = await http(guarded.url, 'PUT', '/v1/sequences/shared', { token: ADMIN, json: {} });
    expect(admin.status, admin.text).toBe(200);

    for (const r of routes) {
      const anonymous = await http(guarded.url, r.method, r.path, call(r));
      expectError(anonymous, 'unauthorized');
      for (const bad of [`${READER}x`, 'reader-token', 'x'.repeat(300)]) {
        expectError(await http(guarded.url, r.method, r.path, call(r, bad)), 'unauthorized');
      }
      expectError(
        await http(guarded.url, r.method, r.path, {
          ...call(r),
          headers: { authorization: `Basic ${ADMIN}` },
        }),
        'unauthorized',
      );
      for (const [token, scopes] of [
        [READER, ['read']],
        [ISSUER, ['next']],
        [ADMIN, ['admin', 'read', 'next']],
      ] as const) {
        const reply = await http(guarded.url, r.method, r.path, call(r, token));
        if ((scopes as readonly string[]).includes(r.scope)) {
          expect(reply.status, `${token} ${r.method} ${r.path}: ${reply.text}`).toBe(200);
        } else {
          expectError(reply, 'forbidden', `this token lacks the '${r.scope}' scope`);
        }
      }
    }

    expect((await http(guarded.url, 'GET', '/healthz')).status).toBe(200);
    expect((await http(guarded.url, 'GET', '/healthz', { token: 'nonsense' })).status).toBe(200);
    // The scheme is case-insensitive.
    const lower = await http(guarded.url, 'GET', '/v1/sequences', {
      headers: { authorization: `bearer ${READER}` },
    });
    expect(lower.status).toBe(200);
    // Tokens are checked before bodies are read: an anonymous bad or huge body is still 401.
    expectError(
      await http(guarded.url, 'POST', '/v1/sequences/shared/next', {
        body: '{"count":',
        contentType: 'application/json',
      }),
      'unauthorized',
    );
    expectError(
      await http(guarded.url, 'PUT', '/v1/sequences/shared', {
        body: JSON.stringify({ format: 'x'.repeat(70_000) }),
        contentType: 'application/json',
      }),
      'unauthorized',
    );
    // What the next token took is what the admin sees.
    const status = await pool.query(
      `SELECT value::int AS value FROM ordo.counters WHERE sequence = 'shared'`,
    );
    expect(status.rows).toEqual([{ value: 4 }]);
  });

  it('--tokens-file: one token a line, comments allowed; it replaces ORDO_TOKENS', async () => {
    const file = join(scratch, 'tokens');
    await writeFile(
      file,
      `# ordo tokens\n\nfile-admin-token-0123456789:admin+read\n  file-next-token-0123456789:next  \n`,
    );
    const fromFile = await startServer({
      databaseUrl: db.url,
      args: ['--tokens-file', file],
      env: { ORDO_TOKENS: TOKENS },
    });
    try {
      expectError(await http(fromFile.url, 'GET', '/v1/sequences'), 'unauthorized');
      expectError(await http(fromFile.url, 'GET', '/v1/sequences', { token: ADMIN }), 'unauthorized');
      const listed = await http(fromFile.url, 'GET', '/v1/sequences', {
        token: 'file-admin-token-0123456789',
      });
      expect(listed.status).toBe(200);
      expectError(
        await http(fromFile.url, 'POST', '/v1/sequences/shared/next', {
          token: 'file-admin-token-0123456789',
        }),
        'forbidden',
      );
      const next = await http(fromFile.url, 'POST', '/v1/sequences/shared/next', {
        token: 'file-next-token-0123456789',
      });
      expect(next.status).toBe(200);
      expect(next.json.values).toEqual([5]);
      expectError(
        await http(fromFile.url, 'GET', '/v1/sequences', { token: 'file-next-token-0123456789' }),
        'forbidden',
      );
      expect((await http(fromFile.url, 'GET', '/healthz')).status).toBe(200);
    } finally {
      expect(await fromFile.stop()).toBe(0);
    }
  });

  it('refuses bad token lists at start with status 2 and one line', async () => {
    const env = { DATABASE_URL: db.url };
    const runs = await Promise.all([
      runCli(['serve', '--port', '0'], { env: { ...env, ORDO_TOKENS: 'short:read' } }),
      runCli(['serve', '--port', '0'], { env: { ...env, ORDO_TOKENS: 'long-enough-token-0123:write' } }),
      runCli(['serve', '--port', '0', '--tokens-file', join(scratch, 'missing')], { env }),
    ]);
    for (const r of runs) {
      expect(r.code, r.err).toBe(2);
      expect(r.err.trim().split('\n')).toHaveLength(1);
      expect(r.err).toMatch(/^ordo: /);
    }
    expect(runs[1]!.err).toContain("unknown token scope 'write'");
    expect(runs[2]!.err).toContain('cannot read the tokens file');
  });
});

describe('listening beyond loopback', () => {
  it('--host 0.0.0.0 without tokens exits 2 with one line; with --insecure or tokens it starts', async () => {
    const refused = await runCli(['serve', '--port', '0', '--host', '0.0.0.0', '--database-url', db.url]);
    expect(refused.code).toBe(2);
    expect(refused.err.trim()).toBe(
      'ordo: refusing to listen on 0.0.0.0 without tokens: set ORDO_TOKENS or --tokens-file, or pass --insecure',
    );
    expect(refused.out).toBe('');

    const [insecure, withTokens] = await Promise.all([
      startServer({ databaseUrl: db.url, args: ['--host', '0.0.0.0', '--insecure'] }),
      startServer({ databaseUrl: db.url, args: ['--host', '0.0.0.0'], env: { ORDO_TOKENS: TOKENS } }),
    ]);
    expect(insecure.logs()).toContainEqual(
      expect.objectContaining({ msg: 'ordo is listening', url: `http://0.0.0.0:${insecure.port}` }),
    );
    // Listening everywhere with every route open is said, loudly; with tokens it is not.
    expect(insecure.logs()).toContainEqual(
      expect.objectContaining({
        level: 40,
        msg: expect.stringContaining('/v1/query included, is open to anyone'),
      }),
    );
    expect(withTokens.logs().filter((l) => l.level === 40)).toEqual([]);
    // A token put in a query string never reaches the access log.
    await http(insecure.url, 'GET', '/v1/sequences?access_token=secret-in-query');
    await sleep(100);
    expect(insecure.output()).not.toContain('secret-in-query');
    expect(insecure.logs()).toContainEqual(expect.objectContaining({ msg: 'request', url: '/v1/sequences' }));
    expectError(await http(withTokens.url, 'GET', '/v1/sequences'), 'unauthorized');
    expect((await http(withTokens.url, 'GET', '/v1/sequences', { token: READER })).status).toBe(200);
    expect((await http(insecure.url, 'GET', '/v1/sequences')).status).toBe(200);
    const [a, b] = await Promise.all([insecure.stop(), withTokens.stop()]);
    expect(a).toBe(0);
    expect(b).toBe(0);
  });
});

describe('graceful shutdown', () => {
  it('SIGTERM under load: exit 0, every answered number committed, no gaps, refusals are 503 or connection errors', async () => {
    const draining = await startServer({ databaseUrl: db.url });
    expect((await http(draining.url, 'PUT', '/v1/sequences/drain', { json: {} })).status).toBe(200);
    // The clients' own pool, closed when they are done: idle keep-alive connections kept open
    // would hold the server up (see the known bug below).
    const agent = newAgent();

    const answered: number[] = [];
    const refusals: string[] = [];
    const unexpected: string[] = [];
    let signalled = false;
    const client = async (n: number) => {
      for (let i = 0; ; i++) {
        const json = (n + i) % 4 === 0 ? { count: 3 } : {};
        try {
          const r = await http(draining.url, 'POST', '/v1/sequences/drain/next', { json, dispatcher: agent });
          if (r.status === 200) {
            answered.push(...r.json.values);
            continue;
          }
          (signalled && r.status === 503 ? refusals : unexpected).push(`${r.status} ${r.text}`);
        } catch (e) {
          const cause = (e as { cause?: { code?: string } }).cause?.code ?? String(e);
          (signalled ? refusals : unexpected).push(`connection: ${cause}`);
        }
        return;
      }
    };
    const load = Promise.all(Array.from({ length: 32 }, (_, n) => client(n)));
    await until(() => answered.length >= 400 || unexpected.length > 0);
    signalled = true;
    draining.child.kill('SIGTERM');
    await load;
    await agent.close();
    const code = await draining.wait(15_000);

    expect(unexpected).toEqual([]);
    expect(code).toBe(0);
    expect(refusals).toHaveLength(32);
    for (const r of refusals) expect(r).toMatch(/^(503 |connection: )/);
    expect(draining.logs()).toContainEqual(
      expect.objectContaining({ signal: 'SIGTERM', msg: 'stopping: finishing requests in flight' }),
    );
    // Nothing twice, no gaps, and the committed counter is the last number answered.
    const sorted = [...answered].sort((a, b) => a - b);
    expect(sorted.length).toBeGreaterThanOrEqual(400);
    expect(sorted).toEqual(upTo(sorted.length));
    expect(await counters('drain')).toEqual([
      { scope: '', period: expect.any(String), value: sorted.length },
    ]);
  });

  /** What one shutdown with a request in flight showed, for the tests below. */
  const seen = { ran: false, exitedWhileIdle: false };

  it('a request in flight at SIGTERM is answered and committed; new connections are refused at once', async () => {
    const stopping = await startServer({ databaseUrl: db.url });
    expect((await http(stopping.url, 'PUT', '/v1/sequences/held', { json: {} })).status).toBe(200);
    const agent = newAgent({ connections: 1 });
    const tx = await pool.connect();
    try {
      // Our transaction takes 1 and keeps the row locked: the server's call waits behind it.
      await tx.query('BEGIN');
      expect((await tx.query(`SELECT ordo.nextval('held')::int AS v`)).rows).toEqual([{ v: 1 }]);
      const inFlight = http(stopping.url, 'POST', '/v1/sequences/held/next', { dispatcher: agent });
      await until(async () => {
        const { rows } = await pool.query(
          `SELECT count(*)::int AS n FROM pg_stat_activity
            WHERE datname = current_database() AND wait_event_type = 'Lock'`,
        );
        return rows[0].n > 0;
      });
      stopping.child.kill('SIGTERM');
      await until(() => stopping.logs().some((l) => l.signal === 'SIGTERM'));
      // A new connection (a pool of its own: the global one may hold a socket the server just closed).
      const fresh = newAgent();
      const refused = await fetch(`${stopping.url}/healthz`, { dispatcher: fresh }).then(
        (r) => `status ${r.status}`,
        (e: { cause?: { code?: string } }) => e.cause?.code,
      );
      await fresh.destroy();
      expect(refused).toBe('ECONNREFUSED');
      expect(stopping.child.exitCode).toBeNull();
      await tx.query('COMMIT');
      const answer = await inFlight;
      expect(answer.status, answer.text).toBe(200);
      expect(answer.json.values).toEqual([2]);
      expect(await counters('held')).toEqual([{ scope: '', period: expect.any(String), value: 2 }]);

      // The answered connection is idle now, and kept open by this client.
      seen.exitedWhileIdle = await Promise.race([
        stopping.exited.then(() => true),
        sleep(5_000).then(() => false),
      ]);
      expect(await stopping.wait(15_000)).toBe(0);
      expect(await counters('held')).toEqual([{ scope: '', period: expect.any(String), value: 2 }]);
      seen.ran = true;
    } finally {
      tx.release();
      await agent.destroy();
    }
  });

  // A client that keeps its connection alive (undici, browsers, proxies) must not hold the server
  // up after SIGTERM: answers sent while closing carry Connection: close.
  it('exits promptly after SIGTERM even while a client keeps an answered connection open', (ctx) => {
    if (!seen.ran) ctx.skip('needs the test above');
    expect(seen.exitedWhileIdle).toBe(true);
  });
});

describe('ordo serve --workers', () => {
  /** The workers' pids, read from the primary's children (Linux). */
  async function workerPids(primary: ServerProcess): Promise<number[]> {
    const text = await readFile(`/proc/${primary.pid}/task/${primary.pid}/children`, 'utf8');
    return text.trim().split(/\s+/).filter(Boolean).map(Number);
  }

  /** `n` requests at once on connections of their own, which the primary hands to its workers in turn. */
  async function spread(base: string, n: number, path: string, call: Call = {}): Promise<Reply[]> {
    const agent = newAgent();
    try {
      return await Promise.all(
        Array.from({ length: n }, () => http(base, 'POST', path, { ...call, dispatcher: agent })),
      );
    } finally {
      await agent.close();
    }
  }

  it('serves from its workers on one port: batched values unique, gapless ones 1..n, tokens checked, one listening line', async () => {
    const served = await startServer({
      databaseUrl: db.url,
      args: ['--workers', '2'],
      env: { ORDO_TOKENS: TOKENS },
    });
    try {
      expect(served.logs().filter((l) => l.msg === 'ordo is listening')).toEqual([
        expect.objectContaining({ pid: served.pid, workers: 2, url: expect.any(String) }),
      ]);
      const workers = await workerPids(served);
      expect(workers).toHaveLength(2);
      const admin = { token: ADMIN };
      expect(
        (
          await http(served.url, 'PUT', '/v1/sequences/w_ids', {
            ...admin,
            json: { kind: 'batched', batch: 10 },
          })
        ).status,
      ).toBe(200);
      expect((await http(served.url, 'PUT', '/v1/sequences/w_inv', { ...admin, json: {} })).status).toBe(200);

      const batched = await spread(served.url, 40, '/v1/sequences/w_ids/next', { token: ISSUER, json: {} });
      const gapless = await spread(served.url, 40, '/v1/sequences/w_inv/next', { token: ISSUER, json: {} });
      for (const r of [...batched, ...gapless]) expect(r.status, r.text).toBe(200);
      const ids = batched.map((r) => r.json.value as number);
      expect(new Set(ids).size).toBe(40);
      expect(gapless.map((r) => r.json.value as number).sort((a, b) => a - b)).toEqual(upTo(40));
      expect(await counters('w_inv')).toEqual([{ scope: '', period: expect.any(String), value: 40 }]);

      // Both workers answered, each with its own ranges; the primary answers nothing itself.
      await until(
        () =>
          served.logs().filter((l) => l.msg === 'request' && l.url === '/v1/sequences/w_ids/next').length ===
          40,
      );
      const answeredBy = new Set(
        served
          .logs()
          .filter((l) => l.msg === 'request' && l.url === '/v1/sequences/w_ids/next')
          .map((l) => l.pid),
      );
      expect([...answeredBy].sort()).toEqual([...workers].sort());

      // Every worker checks tokens as one server does.
      for (const r of await spread(served.url, 4, '/v1/sequences/w_ids/next', { json: {} }))
        expectError(r, 'unauthorized');
      for (const r of await spread(served.url, 4, '/v1/sequences/w_ids/next', { token: READER, json: {} }))
        expectError(r, 'forbidden');
    } finally {
      expect(await served.stop()).toBe(0);
    }
  });

  it('/metrics sums what every worker counted, and what is read from the database once', async () => {
    const served = await startServer({ databaseUrl: db.url, args: ['--workers', '2'] });
    const holder = await pool.connect();
    try {
      expect(
        (await http(served.url, 'PUT', '/v1/sequences/w_metered', { json: { kind: 'batched', batch: 5 } }))
          .status,
      ).toBe(200);
      expect((await http(served.url, 'PUT', '/v1/sequences/w_held', { json: {} })).status).toBe(200);
      const route = { route: '/v1/sequences/:name/next', method: 'POST', status: '200' };
      const before = sample((await api('GET', '/metrics')).text, 'ordo_http_requests_total', route) ?? 0;
      const replies = await spread(served.url, 30, '/v1/sequences/w_metered/next', { json: { count: 2 } });
      for (const r of replies) expect(r.status, r.text).toBe(200);
      // A gapless counter held by an open transaction: read from the database once, not once per worker.
      await holder.query(`SELECT ordo.nextval('w_held')`);
      await holder.query('BEGIN');
      await holder.query(`SELECT ordo.nextval('w_held')`);

      const text = (await http(served.url, 'GET', '/metrics')).text;
      expect(text).toContain('# TYPE ordo_http_requests_total counter');
      expect(sample(text, 'ordo_http_requests_total', route)).toBe(30);
      expect(sample(text, 'ordo_http_request_duration_seconds_count', route)).toBe(30);
      expect(sample(text, 'ordo_http_request_duration_seconds_bucket', { ...route, le: '+Inf' })).toBe(30);
      expect(sample(text, 'ordo_values_issued_total', { sequence: 'w_metered' })).toBe(60);
      // 60 values from ranges of 5, taken by two nodes: at least twelve ranges reserved in all.
      expect(sample(text, 'ordo_range_reservations_total', { sequence: 'w_metered' })).toBeGreaterThanOrEqual(
        12,
      );
      expect(sample(text, 'ordo_gapless_counters_held', { sequence: 'w_held' })).toBe(1);
      // The one-process server beside it counted none of these.
      expect(sample((await api('GET', '/metrics')).text, 'ordo_http_requests_total', route) ?? 0).toBe(
        before,
      );
    } finally {
      await holder.query('ROLLBACK');
      holder.release();
      expect(await served.stop()).toBe(0);
    }
  });

  it('SIGTERM: every worker answers its requests in flight and exits, then the primary exits 0', async () => {
    const served = await startServer({ databaseUrl: db.url, args: ['--workers', '2'] });
    const workers = await workerPids(served);
    expect((await http(served.url, 'PUT', '/v1/sequences/w_drain', { json: {} })).status).toBe(200);
    const tx = await pool.connect();
    try {
      // Our transaction holds the counter: requests wait behind it, in both workers.
      await tx.query('BEGIN');
      await tx.query(`SELECT ordo.nextval('w_drain')`);
      const inFlight = spread(served.url, 8, '/v1/sequences/w_drain/next');
      await until(async () => {
        const { rows } = await pool.query(
          `SELECT count(*)::int AS n FROM pg_stat_activity
            WHERE datname = current_database() AND wait_event_type = 'Lock'`,
        );
        return rows[0].n >= 2;
      });
      served.child.kill('SIGTERM');
      await until(() => served.logs().some((l) => l.msg === 'stopping: finishing requests in flight'));
      await tx.query('COMMIT');
      const answers = await inFlight;
      for (const a of answers) expect(a.status, a.text).toBe(200);
      expect(answers.map((a) => a.json.value as number).sort((a, b) => a - b)).toEqual(upTo(9).slice(1));
      expect(await served.wait(15_000)).toBe(0);
      for (const pid of workers) expect(alive(pid)).toBe(false);
    } finally {
      tx.release();
    }
  });

  it('a worker that dies stops the others, and the primary exits 1 for its supervisor to start it again', async () => {
    const served = await startServer({ databaseUrl: db.url, args: ['--workers', '2'] });
    const [victim, other] = await workerPids(served);
    process.kill(victim!, 'SIGKILL');
    expect(await served.wait(15_000)).toBe(1);
    expect(served.logs()).toContainEqual(
      expect.objectContaining({
        level: 50,
        msg: 'a worker exited: stopping the others',
        worker: victim,
        signal: 'SIGKILL',
      }),
    );
    expect(alive(other!)).toBe(false);
  });
});

describe('CLI', () => {
  const COMMANDS = ['serve', 'sql', 'next', 'status', 'migrate', 'bench'] as const;

  it('--help on every command exits 0 and prints that command’s usage', async () => {
    const env = { DATABASE_URL: db.url };
    const runs = await Promise.all([
      ...COMMANDS.filter((c) => c !== 'next').map((command) => runCli([command, '--help'], { env })),
      runCli(['next', '-h'], { env }),
    ]);
    runs.splice(2, 0, runs.pop()!); // next, in its place
    for (const [i, command] of COMMANDS.entries()) {
      for (const r of [runs[i]!]) {
        expect(r.code, r.err).toBe(0);
        expect(r.err).toBe('');
        const lines = r.out.split('\n');
        expect(lines[0]).toMatch(new RegExp(`^ordo ${command}\\b`));
        expect(r.out).toContain('--database-url URL');
        expect(r.out).toContain('-h, --help');
        // Only this command's usage, not the overview.
        for (const other of COMMANDS.filter((c) => c !== command)) {
          expect(lines.filter((l) => l.startsWith(`ordo ${other}`))).toEqual([]);
        }
      }
    }
    expect(runs[0]!.out).toContain('--tokens-file FILE');
    expect(runs[0]!.out).toContain('--insecure');
    expect(runs[0]!.out).toContain('--workers N');
    expect(runs[2]!.out).toContain('--count');
  });

  it('unknown flags and bad values exit 2 with one line on stderr', async () => {
    const env = { DATABASE_URL: db.url };
    const cases: [string[], string | RegExp][] = [
      [['next', 'x', '--colour'], /^ordo: Unknown option '--colour'/],
      [['serve', '--port', '99999'], "ordo: --port must be a whole number from 0 to 65535 (got '99999')"],
      [['serve', '--port', 'abc'], "ordo: --port must be a whole number from 0 to 65535 (got 'abc')"],
      [['next', 'x', '--count', 'abc'], "ordo: --count must be a whole number (got 'abc')"],
      [['next', 'x', '--count'], "ordo: Option '--count <value>' argument missing"],
      [['next'], 'ordo: ordo next takes one argument: the sequence name'],
      [['serve', '--insecure=yes'], /^ordo: Option '--insecure' does not take an argument/],
      [['serve', '--workers', '0'], "ordo: --workers must be a whole number from 1 to 64 (got '0')"],
      [['frobnicate'], "ordo: unknown command 'frobnicate' (try ordo --help)"],
    ];
    // Nine CLIs start at once on a small machine: the bound is for a hang, not for a slow start.
    const runs = await Promise.all(cases.map(([args]) => runCli(args, { env, timeoutMs: 40_000 })));
    for (const [i, [args, expected]] of cases.entries()) {
      const r = runs[i]!;
      expect({ args, code: r.code }).toEqual({ args, code: 2 });
      expect(r.err.trimEnd().split('\n'), args.join(' ')).toHaveLength(1);
      if (typeof expected === 'string') expect(r.err.trimEnd()).toBe(expected);
      else expect(r.err).toMatch(expected);
      expect(r.out).toBe('');
    }
  });

  // ordo serve --port -1 → node:util parseArgs' three-line "argument is ambiguous" message
  it('a value that starts with a dash exits 2 with one line too', async () => {
    const r = await runCli(['serve', '--port', '-1'], { env: { DATABASE_URL: db.url }, timeoutMs: 15_000 });
    expect(r.code).toBe(2);
    expect(r.err.trimEnd().split('\n')).toHaveLength(1);
  });
});

describe('embedded PostgreSQL, no database URL anywhere', () => {
  it('serves from a fresh data directory, stops PostgreSQL on SIGTERM, continues on restart', async () => {
    const root = await mkdtemp(join(scratch, 'fresh-'));
    await chmod(root, 0o755);
    const dataDir = join(root, '.ordo');
    const pidFile = join(dataDir, 'pg', 'postmaster.pid');
    // startServer removes DATABASE_URL and ORDO_DATABASE_URL from the child's environment.
    const first = await startServer({ args: ['--data-dir', dataDir], timeoutMs: 60_000 });
    const postmaster = Number((await readFile(pidFile, 'utf8')).split('\n')[0]);
    expect(alive(postmaster)).toBe(true);
    expect((await http(first.url, 'PUT', '/v1/sequences/kept', { json: {} })).status).toBe(200);
    expect((await http(first.url, 'POST', '/v1/sequences/kept/next')).json.values).toEqual([1]);
    expect(await first.stop('SIGTERM')).toBe(0);
    await until(() => !alive(postmaster), 10_000);
    expect(existsSync(pidFile)).toBe(false);

    const second = await startServer({ args: ['--data-dir', dataDir], timeoutMs: 60_000 });
    const again = Number((await readFile(pidFile, 'utf8')).split('\n')[0]);
    try {
      expect((await http(second.url, 'POST', '/v1/sequences/kept/next')).json.values).toEqual([2]);
      expect((await http(second.url, 'GET', '/v1/sequences/kept')).json).toMatchObject({ name: 'kept' });
    } finally {
      expect(await second.stop('SIGINT')).toBe(0);
    }
    await until(() => !alive(again), 10_000);
    expect(existsSync(pidFile)).toBe(false);
  });
});
