// Arbitrary requests against one `ordo serve` (a child process on a real PostgreSQL): whatever a
// client sends, the answer is never a 5xx, and every 4xx is JSON { code, message } with a code
// of ERROR_CODES and that code's status.
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ERROR_CODES } from '../src/errors.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { killAll, type ServerProcess, startServer } from './support/server-process.js';

let db: TestDatabase;
let server: ServerProcess;

/** Sequences the fuzzer finds in place (it may remove or redefine them, as any client may). */
const SEEDED: [string, Record<string, unknown>][] = [
  ['a', {}],
  ['b', { kind: 'batched', batch: 100 }],
  ['c', { maxValue: 3 }],
  ['d', { reset: 'day', timeZone: 'Pacific/Kiritimati', format: '{scope}-{YYYY}{MM}{DD}-{n:4}' }],
];

beforeAll(async () => {
  db = await freshDatabase();
  server = await startServer({ databaseUrl: db.url });
  for (const [name, body] of SEEDED) {
    const r = await send({
      method: 'PUT',
      path: `/v1/sequences/${name}`,
      contentType: 'application/json',
      body: JSON.stringify(body),
    });
    expect(r.status, r.text).toBe(200);
  }
});

afterAll(async () => {
  const code = await server?.stop().catch(() => undefined);
  await killAll();
  await db?.drop();
  expect(code).toBe(0);
});

interface FuzzRequest {
  method: 'GET' | 'PUT' | 'POST' | 'DELETE';
  path: string;
  contentType?: string | undefined;
  body?: string | Uint8Array | undefined;
}

interface Answer {
  status: number;
  contentType: string | null;
  text: string;
}

async function send(request: FuzzRequest): Promise<Answer> {
  const headers: Record<string, string> = {};
  if (request.contentType !== undefined) headers['content-type'] = request.contentType;
  const response = await fetch(`${server.url}${request.path}`, {
    method: request.method,
    headers,
    body: request.method === 'GET' ? undefined : request.body,
    signal: AbortSignal.timeout(15_000),
  });
  return {
    status: response.status,
    contentType: response.headers.get('content-type'),
    text: await response.text(),
  };
}

// ---------------------------------------------------------------------------------------------
// Generators

const NAMES = SEEDED.map(([name]) => name);
const printable = (max: number) => fc.stringMatching(new RegExp(`^[\\x20-\\x7e]{0,${max}}$`));

/** A path segment: real names, identifiers, dot segments, escapes good and bad, any text. */
const segment: fc.Arbitrary<string> = fc.oneof(
  { weight: 4, arbitrary: fc.constantFrom(...NAMES, 'ghost', '_', 'A_9', 'x'.repeat(63)) },
  { weight: 2, arbitrary: fc.stringMatching(/^[A-Za-z_][A-Za-z0-9_]{0,70}$/) },
  {
    weight: 2,
    arbitrary: fc.constantFrom(
      '',
      '.',
      '..',
      '%2e%2e',
      '%2F',
      '%00',
      '%zz',
      '%',
      '%E2%82%AC',
      '%C0%AF',
      '~',
      'next',
    ),
  },
  { weight: 2, arbitrary: fc.string({ maxLength: 30 }).map(encodeURIComponent) },
  { weight: 2, arbitrary: fc.string({ unit: 'grapheme', maxLength: 20 }).map(encodeURIComponent) },
  { weight: 1, arbitrary: fc.string({ unit: 'binary', maxLength: 20 }).map(encodeURIComponent) },
  { weight: 1, arbitrary: printable(30) },
  { weight: 1, arbitrary: fc.integer({ min: 64, max: 2_000 }).map((n) => 'n'.repeat(n)) },
);

const query: fc.Arbitrary<string> = fc.oneof(
  { weight: 4, arbitrary: fc.constant('') },
  {
    weight: 2,
    arbitrary: fc.constantFrom(
      '?ifExists=true',
      '?ifExists=false',
      '?ifExists=yes',
      '?ifExists',
      '?ifExists=true&ifExists=true',
      '?ifExists[]=true',
      '?',
      '?x=1',
      '?__proto__[x]=1',
    ),
  },
  {
    weight: 1,
    arbitrary: fc
      .tuple(fc.string({ maxLength: 10 }), fc.string({ maxLength: 10 }))
      .map(([k, v]) => `?${encodeURIComponent(k)}=${encodeURIComponent(v)}`),
  },
);

const path: fc.Arbitrary<string> = fc
  .oneof(
    {
      weight: 2,
      arbitrary: fc.constantFrom('/v1/sequences', '/v1/query', '/healthz', '/metrics', '/openapi.json', '/'),
    },
    { weight: 4, arbitrary: segment.map((n) => `/v1/sequences/${n}`) },
    { weight: 4, arbitrary: segment.map((n) => `/v1/sequences/${n}/next`) },
    { weight: 1, arbitrary: fc.tuple(segment, segment).map(([n, s]) => `/v1/sequences/${n}/${s}`) },
    { weight: 1, arbitrary: fc.array(segment, { maxLength: 4 }).map((s) => `/${s.join('/')}`) },
    { weight: 1, arbitrary: segment.map((s) => `/v1/${s}`) },
  )
  .chain((p) => query.map((q) => `${p}${q}`));

/** Numbers that sit on, just past, or far from every limit; and everything that is not a number. */
const extremeNumber = fc.oneof(
  fc.constantFrom(
    0,
    -0,
    1,
    -1,
    2,
    1.5,
    0.1,
    2 ** 31,
    2 ** 53 - 1,
    2 ** 53,
    -(2 ** 53 - 1),
    -(2 ** 53),
    1e308,
    -1e308,
    5e-324,
    10_000,
    10_001,
    1_000_000,
    1_000_001,
  ),
  fc.integer(),
  fc.double({ noNaN: true }),
);
const anyValue: fc.Arbitrary<unknown> = fc.oneof(
  extremeNumber,
  fc.string({ maxLength: 20 }),
  fc.boolean(),
  fc.constant(null),
  fc.array(fc.integer(), { maxLength: 3 }),
  fc.dictionary(fc.string({ maxLength: 5 }), fc.integer(), { maxKeys: 2 }),
);
const textValue = fc.oneof(
  fc.constantFrom(
    '',
    ' ',
    '\u0000',
    'a\u0000b',
    'Europe/Paris\u0000',
    '{n}\u0000',
    '\ud800',
    '😀',
    'x'.repeat(201),
    'x'.repeat(64),
    'x'.repeat(65),
  ),
  fc.string({ maxLength: 40 }),
  // Few characters, the awkward ones: NUL, lone surrogates, braces of format tokens.
  fc.string({
    unit: fc.constantFrom(
      '\u0000',
      '\ud800',
      '\udc00',
      '\u2028',
      'a',
      '{',
      '}',
      'n',
      ':',
      '6',
      '😀',
      '/',
      ' ',
    ),
    maxLength: 12,
  }),
  fc.string({ maxLength: 12 }).map((t) => `{n}${t}`),
  fc.string({ unit: 'grapheme', maxLength: 20 }),
  fc.string({ unit: 'binary', maxLength: 20 }),
);
const mostly = <T>(plausible: fc.Arbitrary<T>, wrong: fc.Arbitrary<unknown> = anyValue) =>
  fc.oneof({ weight: 3, arbitrary: plausible as fc.Arbitrary<unknown> }, { weight: 1, arbitrary: wrong });

/**
 * Timeouts that never make a reservation time out (the property is "no 5xx", and a batched
 * sequence with timeout 0 is *meant* to answer 503): none below a minute, no duration text
 * with a digit but those listed.
 */
const harmlessTimeout = fc.oneof(
  fc.integer({ min: 60_000, max: 31_536_000_001 }),
  fc.constantFrom('1h', '5m', '10m', '1d', '1w', '1y', '2y', null, -1, 1.5, true, [], {}, ''),
  fc.string({ maxLength: 10 }).filter((s) => !/\d/.test(s)),
);

/** The properties of PUT /v1/sequences/:name, plausible or wrong. */
const anyDefineBody = fc.record(
  {
    kind: mostly(fc.constantFrom('gapless', 'batched'), textValue),
    start: mostly(fc.oneof(fc.integer({ min: -1_000, max: 1_000 }), extremeNumber)),
    increment: mostly(fc.oneof(fc.integer({ min: 1, max: 1_000 }), extremeNumber)),
    minValue: mostly(fc.oneof(fc.integer({ min: -1_000, max: 1_000 }), extremeNumber)),
    maxValue: mostly(fc.oneof(fc.integer({ min: -1_000, max: 1_000_000 }), extremeNumber)),
    cycle: mostly(fc.boolean()),
    reset: mostly(fc.constantFrom('never', 'day', 'week', 'month', 'year'), textValue),
    timeZone: mostly(
      fc.constantFrom('UTC', 'Europe/Paris', 'Asia/Kathmandu', 'EST', 'UTC+3', 'Mars/Base'),
      textValue,
    ),
    format: mostly(
      fc.constantFrom(
        '{n}',
        'INV-{YYYY}-{n:6}',
        '{IYYY}-W{WW}-{n:20}',
        '{scope}/{n:1}',
        '{n:21}',
        '{x}{n}',
        '{YY}',
      ),
      fc.oneof(
        textValue,
        textValue.map((t) => `${t}{n}`),
        // Tokens inside tokens and stray braces: a format renders in one pass, its length bounded.
        fc
          .array(
            fc.constantFrom(
              '{',
              '}',
              '{n',
              '{n:',
              ':',
              '{YYYY}',
              '{MM}',
              '{DD}',
              '{YY}',
              '{n}',
              '{n:6}',
              '{scope}',
              'x',
            ),
            {
              maxLength: 10,
            },
          )
          .map((pieces) => pieces.join('')),
      ),
    ),
    // Small ranges with a large count make thousands of round trips: slow, not wrong.
    batch: mostly(
      fc.integer({ min: 100, max: 1_000_000 }),
      fc.constantFrom(0, -1, 1_000_001, 1.5, '10', null, 2 ** 53),
    ),
    timeout: harmlessTimeout,
    ifNotExists: mostly(fc.boolean()),
    overwrite: mostly(fc.boolean()),
  },
  { requiredKeys: [] },
);

/** The properties of POST /v1/sequences/:name/next. */
const anyNextBody = fc.record(
  {
    scope: mostly(fc.oneof(fc.constantFrom('', 'acme'), textValue), anyValue),
    count: mostly(
      fc.oneof(fc.integer({ min: 1, max: 20 }), fc.constantFrom(10_000, 10_001, 0, -1)),
      anyValue,
    ),
    at: mostly(
      fc.oneof(
        fc.constantFrom(
          '2026-05-01T10:00:00Z',
          '2026-12-31T23:30:00+01:00',
          '2026-05-01',
          '0001-01-01T00:00:00Z',
          '1901-01-01T00:00:00Z',
          '9999-12-31T23:59:59Z',
          '9999-12-31T23:59:59-14:00',
          '2026-02-30',
          '2026-01-01T24:00:00Z',
          'infinity',
          'now',
          'epoch',
          '2026-05-01T10:00:00',
        ),
        fc.date({ noInvalidDate: true }).map((d) => d.toISOString()),
      ),
      anyValue,
    ),
  },
  { requiredKeys: [] },
);

const DEFINE_KEYS = [
  'kind',
  'start',
  'increment',
  'minValue',
  'maxValue',
  'cycle',
  'reset',
  'timeZone',
  'format',
  'batch',
  'timeout',
  'ifNotExists',
  'overwrite',
] as const;

const TEXT_KEYS = new Set(['kind', 'reset', 'timeZone', 'format', 'scope', 'at', 'name']);

/** A body with at most one property replaced by something else (or added). */
const mutated = (valid: fc.Arbitrary<Record<string, unknown>>, keys: readonly string[]) =>
  fc
    .tuple(
      valid,
      fc.option(
        fc
          .constantFrom(...keys, 'name', 'extra')
          .chain((k) =>
            fc.tuple(
              fc.constant(k),
              k === 'timeout'
                ? harmlessTimeout
                : TEXT_KEYS.has(k)
                  ? fc.oneof({ weight: 3, arbitrary: textValue }, { weight: 1, arbitrary: anyValue })
                  : fc.oneof(extremeNumber, anyValue, textValue),
            ),
          ),
        { freq: 2 },
      ),
    )
    .map(([b, m]) => (m ? { ...b, [m[0]]: m[1] } : b));

const mode = fc.constantFrom({}, {}, { ifNotExists: true }, { overwrite: true });
const validGaplessBody = fc
  .tuple(
    fc.record(
      {
        kind: fc.constant('gapless'),
        start: fc.integer({ min: -1_000, max: 1_000 }),
        increment: fc.integer({ min: 1, max: 100 }),
        minValue: fc.integer({ min: -2_000, max: -1_000 }),
        maxValue: fc.oneof(fc.integer({ min: 1_000, max: 1_000_000 }), fc.constant(2 ** 53 - 1)),
        cycle: fc.boolean(),
        reset: fc.constantFrom('never', 'day', 'week', 'month', 'year'),
        timeZone: fc.constantFrom('UTC', 'Europe/Paris', 'Asia/Kathmandu', 'America/St_Johns', 'EST'),
        format: fc.constantFrom(
          '{n}',
          'INV-{YYYY}-{n:6}',
          '{IYYY}-W{WW}-{n:20}',
          '{scope}/{YY}{MM}{DD}/{n:1}',
        ),
      },
      { requiredKeys: ['kind'] },
    ),
    mode,
  )
  .map(([b, m]) => ({ ...b, ...m }));
const validBatchedBody = fc
  .tuple(
    fc.record(
      {
        kind: fc.constant('batched'),
        start: fc.integer({ min: -1_000, max: 1_000 }),
        increment: fc.integer({ min: 1, max: 100 }),
        batch: fc.integer({ min: 100, max: 1_000_000 }),
        timeout: fc.oneof(
          fc.integer({ min: 60_000, max: 31_536_000_000 }),
          fc.constantFrom('1h', '5m', null),
        ),
      },
      { requiredKeys: ['kind'] },
    ),
    mode,
  )
  .map(([b, m]) => ({ ...b, ...m }));
const validDefineBody = fc.oneof(validGaplessBody, validBatchedBody);
const defineBody = fc.oneof(
  { weight: 2, arbitrary: mutated(validDefineBody, DEFINE_KEYS) },
  { weight: 1, arbitrary: anyDefineBody },
);

const validNextBody = fc.record(
  {
    scope: fc.constantFrom('', 'acme', 'globex', 'é'),
    count: fc.integer({ min: 1, max: 20 }),
    at: fc.constantFrom('2026-05-01T10:00:00Z', '2026-12-31T23:30:00+01:00', '2027-01-01'),
  },
  { requiredKeys: [] },
);
const nextBody = fc.oneof(
  { weight: 2, arbitrary: mutated(validNextBody, ['scope', 'count', 'at']) },
  { weight: 1, arbitrary: anyNextBody },
);

const DURATIONS = ['1h', '5m', '1d', '30s', '1w', '1y'];
const fragment = fc.oneof(
  fc.constantFrom(
    'DEFINE SEQUENCE',
    'DEFINE SEQUENCE OVERWRITE',
    'DEFINE SEQUENCE IF NOT EXISTS',
    'ALTER SEQUENCE',
    'REMOVE SEQUENCE',
    'REMOVE SEQUENCE IF EXISTS',
    'INFO FOR DB',
    'RETURN',
    ';',
    'GAPLESS',
    'CYCLE',
    'RESET DAILY',
    'RESET YEARLY',
    'DROP TIMEOUT',
    "TIMEZONE 'Europe/Paris'",
    "TIMEZONE 'nowhere'",
    "FORMAT 'Q-{n:3}'",
    "FORMAT '{x}'",
    '--',
    '/*',
    '*/',
    '#',
    "'",
    '(',
    ')',
  ),
  fc.constantFrom(...NAMES, 'q1', 'ghost').map((n) => `${n}`),
  fc.constantFrom(...NAMES, 'q1', 'ghost', "'", '').map((n) => `sequence::nextval('${n}')`),
  fc.constantFrom(100, 1000, 1_000_000, 0, -1, 1_000_001, '99999999999999999999999').map((n) => `BATCH ${n}`),
  extremeNumber.map((n) => `START ${n}`),
  extremeNumber.map((n) => `MAXVALUE ${n}`),
  extremeNumber.map((n) => `INCREMENT ${n}`),
  fc.constantFrom(...DURATIONS, 'forever', '1x', '').map((d) => `TIMEOUT ${d}`),
  fc.string({ maxLength: 10 }),
);
const statements = fc.oneof(
  fc.array(fragment, { minLength: 1, maxLength: 12 }).map((f) => f.join(' ')),
  fc.string({ maxLength: 100 }),
);
const queryBody = fc.oneof(
  { weight: 4, arbitrary: fc.record({ query: statements }) },
  { weight: 1, arbitrary: fc.record({ query: anyValue }, { requiredKeys: [] }) },
  { weight: 1, arbitrary: fc.record({ query: statements, extra: anyValue }) },
);

/** Bodies: JSON values, objects with the real property names, garbage, and too much. */
const body: fc.Arbitrary<string | Uint8Array | undefined> = fc.oneof(
  { weight: 2, arbitrary: fc.constant(undefined) },
  { weight: 3, arbitrary: fc.jsonValue({ maxDepth: 3 }).map((v) => JSON.stringify(v)) },
  { weight: 4, arbitrary: defineBody.map((v) => JSON.stringify(v)) },
  { weight: 4, arbitrary: nextBody.map((v) => JSON.stringify(v)) },
  { weight: 3, arbitrary: queryBody.map((v) => JSON.stringify(v)) },
  {
    weight: 2,
    arbitrary: fc.oneof(
      fc.string({ maxLength: 50 }),
      fc.constantFrom(
        '',
        '{',
        '{"count":',
        'null',
        'nul',
        '[]',
        '{"__proto__":{"a":1}}',
        '{"constructor":{"prototype":{}}}',
        '1e999',
        '"\\ud800"',
        '\ufeff{}',
      ),
      fc.jsonValue({ maxDepth: 2 }).map((v) => `${JSON.stringify(v)}}`),
    ),
  },
  { weight: 1, arbitrary: fc.uint8Array({ maxLength: 64 }) },
  {
    weight: 1,
    arbitrary: fc.constantFrom(JSON.stringify({ scope: 'x'.repeat(70_000) }), ' '.repeat(65 * 1024)),
  },
);

const contentType: fc.Arbitrary<string | undefined> = fc.oneof(
  { weight: 8, arbitrary: fc.constant('application/json') },
  { weight: 1, arbitrary: fc.constant(undefined) },
  {
    weight: 3,
    arbitrary: fc.constantFrom(
      'application/json; charset=utf-8',
      'APPLICATION/JSON',
      'application/json; charset=utf-16',
      'application/json;',
      'text/plain',
      'text/plain; charset=utf-8',
      'application/xml',
      'application/x-www-form-urlencoded',
      'multipart/form-data; boundary=x',
      'application/octet-stream',
      'application/vnd.api+json',
      'application/jsonx',
      '*/*',
      ';;;',
      'application/json, text/plain',
    ),
  },
  { weight: 1, arbitrary: printable(40) },
);

/** Anything at all: any method on any path, with any body and content-type. */
const wild: fc.Arbitrary<FuzzRequest> = fc.record({
  method: fc.constantFrom('GET', 'PUT', 'POST', 'DELETE'),
  path,
  contentType,
  body,
});

/** A real route, mostly with a real name and the body that route reads, each part possibly wrong. */
const name = fc.oneof(
  { weight: 5, arbitrary: fc.constantFrom(...NAMES, 'fresh1', 'fresh2') },
  { weight: 1, arbitrary: segment },
);
const json = <T>(a: fc.Arbitrary<T>) => a.map((v) => JSON.stringify(v));
const mostlyJson = fc.oneof(
  { weight: 4, arbitrary: fc.constant('application/json') },
  { weight: 1, arbitrary: contentType },
);
const aimed: fc.Arbitrary<FuzzRequest> = fc.oneof(
  fc.record({
    method: fc.constant('PUT' as const),
    path: name.map((n) => `/v1/sequences/${n}`),
    contentType: mostlyJson,
    body: fc.oneof({ weight: 5, arbitrary: json(defineBody) }, { weight: 1, arbitrary: body }),
  }),
  fc.record({
    method: fc.constant('POST' as const),
    path: name.map((n) => `/v1/sequences/${n}/next`),
    contentType: mostlyJson,
    body: fc.oneof(
      { weight: 5, arbitrary: json(nextBody) },
      { weight: 1, arbitrary: fc.constant(undefined) },
      { weight: 1, arbitrary: body },
    ),
  }),
  fc.record({
    method: fc.constant('POST' as const),
    path: fc.constant('/v1/query'),
    contentType: mostlyJson,
    body: fc.oneof({ weight: 5, arbitrary: json(queryBody) }, { weight: 1, arbitrary: body }),
  }),
  fc.record({
    method: fc.constant('GET' as const),
    path: fc.oneof(
      name.map((n) => `/v1/sequences/${n}`),
      fc.constantFrom('/v1/sequences', '/metrics', '/openapi.json', '/healthz'),
    ),
  }),
  fc.record({
    method: fc.constant('DELETE' as const),
    path: fc.tuple(name, query).map(([n, q]) => `/v1/sequences/${n}${q}`),
    contentType: fc.option(contentType, { nil: undefined }),
    body: fc.option(body, { nil: undefined }),
  }),
);

/** A good body but for one text field, which gets awkward text (NUL, lone surrogates, braces, …). */
const awkward: fc.Arbitrary<FuzzRequest> = fc.oneof(
  fc
    .tuple(
      name,
      validDefineBody,
      fc.constantFrom('timeZone', 'format', 'reset', 'kind'),
      textValue,
      fc.nat(2),
    )
    .map(([n, b, key, text, at]) => ({
      method: 'PUT' as const,
      path: `/v1/sequences/${n}`,
      contentType: 'application/json',
      body: JSON.stringify({
        ...b,
        [key]: key === 'format' ? [text, `${text}{n}`, `{n:3}${text}`][at] : text,
      }),
    })),
  fc.tuple(name, validNextBody, fc.constantFrom('scope', 'at'), textValue).map(([n, b, key, text]) => ({
    method: 'POST' as const,
    path: `/v1/sequences/${n}/next`,
    contentType: 'application/json',
    body: JSON.stringify({ ...b, [key]: text }),
  })),
  fc
    .tuple(
      fc.constantFrom(
        (t: string) => `DEFINE SEQUENCE OVERWRITE fresh3 GAPLESS TIMEZONE '${t}'`,
        (t: string) => `DEFINE SEQUENCE OVERWRITE fresh3 GAPLESS FORMAT '${t}{n}'`,
        (t: string) => `sequence::nextval('${t}')`,
        (t: string) => `REMOVE SEQUENCE IF EXISTS ${t}`,
        (t: string) => `${t}; INFO FOR DB`,
      ),
      textValue,
    )
    .map(([statement, text]) => ({
      method: 'POST' as const,
      path: '/v1/query',
      contentType: 'application/json',
      body: JSON.stringify({ query: statement(text) }),
    })),
);

const request: fc.Arbitrary<FuzzRequest> = fc.oneof(
  { weight: 3, arbitrary: aimed },
  { weight: 2, arbitrary: wild },
);

// ---------------------------------------------------------------------------------------------
// The property

const exchanges = { count: 0, byStatus: new Map<number, number>() };

function parse(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

async function check(r: FuzzRequest): Promise<void> {
  let a: Answer;
  try {
    a = await send(r);
  } catch (e) {
    throw new Error(`no answer (${(e as { cause?: { code?: string } }).cause?.code ?? e}) to ${show(r)}`, {
      cause: e,
    });
  }
  exchanges.count++;
  exchanges.byStatus.set(a.status, (exchanges.byStatus.get(a.status) ?? 0) + 1);
  const what = `${a.status} ${a.text.slice(0, 300)} ← ${show(r)}`;
  expect(a.status, what).toBeLessThan(500);
  if (a.status >= 400) {
    expect(a.contentType, what).toMatch(/^application\/json/);
    const json = parse(a.text) as Record<string, unknown> | undefined;
    expect(json !== null && typeof json === 'object' && !Array.isArray(json), what).toBe(true);
    expect(Object.keys(json!).sort(), what).toEqual(['code', 'message']);
    expect(typeof json!.message === 'string' && json!.message.length > 0, what).toBe(true);
    const code = json!.code as string;
    expect(Object.keys(ERROR_CODES), what).toContain(code);
    expect(ERROR_CODES[code as keyof typeof ERROR_CODES], what).toBe(a.status);
  } else {
    expect(a.status, what).toBe(200);
    // The path as fetch sends it: WHATWG URLs resolve dot segments, `%2e%2e` among them, so
    // `/v1/%2e%2e` is a request for `/`.
    const sent = new URL(r.path, 'http://x').pathname;
    if (sent === '/metrics') expect(a.text, what).toContain('ordo_http_requests_total');
    // The dashboard's page (a GET of /, with any query string) is HTML; every other answer is JSON.
    else if (r.method === 'GET' && sent === '/') expect(a.contentType, what).toMatch(/^text\/html/);
    else expect(parse(a.text), what).not.toBeUndefined();
  }
}

function show(r: FuzzRequest): string {
  const b =
    r.body === undefined
      ? ''
      : typeof r.body === 'string'
        ? JSON.stringify(r.body.length > 200 ? `${r.body.slice(0, 200)}… (${r.body.length})` : r.body)
        : `<${r.body.length} bytes>`;
  const p = r.path.length > 200 ? `${r.path.slice(0, 200)}… (${r.path.length})` : r.path;
  return `${r.method} ${p} [${r.contentType ?? 'no content-type'}] ${b}`;
}

describe('fuzzing the HTTP API', () => {
  it('one request at a time: never a 5xx; every 4xx is { code, message } with its ERROR_CODES status', async () => {
    await fc.assert(fc.asyncProperty(request, check), {
      numRuns: 300,
      interruptAfterTimeLimit: 35_000,
      markInterruptAsFailure: false,
    });
  });

  it('eight requests at once, 40 times over: the same', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(request, { minLength: 2, maxLength: 8 }), async (batch) => {
        await Promise.all(batch.map(check));
      }),
      { numRuns: 40, interruptAfterTimeLimit: 15_000, markInterruptAsFailure: false },
    );
  });

  it('awkward text in each text field of a good body, 150 times: the same', async () => {
    await fc.assert(fc.asyncProperty(awkward, check), {
      numRuns: 150,
      interruptAfterTimeLimit: 15_000,
      markInterruptAsFailure: false,
    });
  });

  it('the server is still whole: healthy, answering, and it logged no 5xx but the known ones', async () => {
    expect((await send({ method: 'GET', path: '/healthz' })).status).toBe(200);
    const r = await send({
      method: 'PUT',
      path: '/v1/sequences/after',
      contentType: 'application/json',
      body: '{}',
    });
    expect(r.status, r.text).toBe(200);
    const next = await send({ method: 'POST', path: '/v1/sequences/after/next' });
    expect(JSON.parse(next.text).values).toEqual([1]);
    const failures = server.logs().filter((l) => (l.level as number) >= 50);
    expect(failures).toEqual([]);
    console.info(
      `fuzz: ${exchanges.count} requests; statuses ${JSON.stringify(Object.fromEntries([...exchanges.byStatus].sort()))}`,
    );
    expect(exchanges.count).toBeGreaterThanOrEqual(300);
  });
});
