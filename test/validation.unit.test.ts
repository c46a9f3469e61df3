import type pg from 'pg';
import { describe, expect, it } from 'vitest';
import { resolveConfig } from '../src/config.js';
import { ERROR_CODES, OrdoError } from '../src/errors.js';
import { FORMAT_TOKENS, MAX_FORMAT_LENGTH, validateFormat } from '../src/sequences/format.js';
import {
  boolean,
  describe as describeValue,
  identifier,
  invalid,
  knownKeys,
  MAX_VALUE,
  oneOf,
  plainObject,
  safeInteger,
} from '../src/validate.js';

/** Runs `action`, which must throw an invalid_argument OrdoError, and returns that error. */
function refused(action: () => unknown, ...fragments: (string | RegExp)[]): OrdoError {
  let thrown: unknown;
  try {
    action();
  } catch (e) {
    thrown = e;
  }
  if (thrown === undefined) throw new Error('expected the call to be refused, but it succeeded');
  expect(thrown).toBeInstanceOf(OrdoError);
  const error = thrown as OrdoError;
  expect(error.code).toBe('invalid_argument');
  expect(error.httpStatus).toBe(ERROR_CODES.invalid_argument);
  for (const fragment of fragments) expect(error.message).toMatch(fragment);
  return error;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const URL_A = 'postgres://a@host-a:5432/a';
const URL_B = 'postgres://b@host-b:5432/b';
/** Only its `connect` method is looked at by resolveConfig; nothing here talks to a database. */
const somePool = { connect: () => undefined } as unknown as pg.Pool;

describe('validate.ts', () => {
  it('invalid() builds an invalid_argument OrdoError', () => {
    const error = invalid('something is off');
    expect(error).toBeInstanceOf(OrdoError);
    expect(error).toBeInstanceOf(Error);
    expect(error.name).toBe('OrdoError');
    expect(error.code).toBe('invalid_argument');
    expect(error.message).toBe('something is off');
    expect(error.httpStatus).toBe(400);
  });

  it('MAX_VALUE is the largest safe integer', () => {
    expect(MAX_VALUE).toBe(2 ** 53 - 1);
  });

  describe('identifier', () => {
    it.each(['a', 'A', '_', 'invoice', 'Invoice_2026', '_x9', 'a'.repeat(63)])('accepts %j', (name) => {
      expect(identifier('name', name)).toBe(name);
    });

    it.each([
      ['', '""'],
      ['1abc', '"1abc"'],
      ['a-b', '"a-b"'],
      ['a b', '"a b"'],
      ['a.b', '"a.b"'],
      ['é', '"é"'],
      ['abc\n', '"abc\\n"'],
      ['a"; DROP TABLE x; --', 'DROP TABLE'],
    ])('refuses %j', (name, shown) => {
      refused(() => identifier('name', name), 'name must be an identifier', shown);
    });

    it('refuses 64 characters and says at most 63', () => {
      refused(() => identifier('schema', 'a'.repeat(64)), /^schema must be/, 'at most 63 characters');
    });

    it.each([
      [42, 'got 42'],
      [null, 'got null'],
      [undefined, 'got undefined'],
      [{}, 'got object'],
      [['a'], 'got an array'],
      [true, 'got true'],
    ])('refuses the non-string %j', (value, shown) => {
      refused(() => identifier('name', value), shown);
    });
  });

  describe('safeInteger', () => {
    it('accepts whole numbers within the default bounds, both ends included', () => {
      for (const n of [0, 1, -1, 123_456, MAX_VALUE, -MAX_VALUE]) expect(safeInteger('n', n)).toBe(n);
    });

    it('accepts the custom bounds themselves', () => {
      expect(safeInteger('count', 1, 1, 10)).toBe(1);
      expect(safeInteger('count', 10, 1, 10)).toBe(10);
    });

    it.each([
      [1.5, 'got 1.5'],
      [2 ** 53, 'got 9007199254740992'],
      [-(2 ** 53), 'got -9007199254740992'],
      [Number.NaN, 'got NaN'],
      [Number.POSITIVE_INFINITY, 'got Infinity'],
      ['1', 'got "1"'],
      [null, 'got null'],
      [undefined, 'got undefined'],
      [1n, 'got bigint'],
    ])('refuses %s', (value, shown) => {
      refused(() => safeInteger('start', value), 'start must be a whole number', shown);
    });

    it('refuses values outside custom bounds and states the bounds', () => {
      refused(() => safeInteger('count', 0, 1, 10), 'count must be a whole number from 1 to 10 (got 0)');
      refused(() => safeInteger('count', 11, 1, 10), 'from 1 to 10 (got 11)');
    });

    it('states the default bounds', () => {
      refused(() => safeInteger('start', 0.5), `from ${-MAX_VALUE} to ${MAX_VALUE}`);
    });
  });

  describe('oneOf', () => {
    const periods = ['never', 'day', 'week'] as const;

    it('accepts the allowed values', () => {
      for (const p of periods) expect(oneOf('reset', p, periods)).toBe(p);
    });

    it.each([['hourly'], ['Day'], [''], [1], [null]])('refuses %j and lists the choices', (value) => {
      refused(() => oneOf('reset', value, periods), "reset must be one of 'never', 'day', 'week'");
    });

    it('shows the refused value', () => {
      refused(() => oneOf('reset', 'hourly', periods), '(got "hourly")');
    });
  });

  describe('boolean', () => {
    it('accepts true and false', () => {
      expect(boolean('cycle', true)).toBe(true);
      expect(boolean('cycle', false)).toBe(false);
    });

    it.each([
      ['true', 'got "true"'],
      [0, 'got 0'],
      [1, 'got 1'],
      [null, 'got null'],
      [undefined, 'got undefined'],
    ])('refuses %j', (value, shown) => {
      refused(() => boolean('cycle', value), 'cycle must be true or false', shown);
    });
  });

  describe('knownKeys', () => {
    it('accepts known keys and no keys at all', () => {
      expect(() => knownKeys('sequences.define', { name: 'x', start: 1 }, ['name', 'start'])).not.toThrow();
      expect(() => knownKeys('sequences.define', {}, ['name'])).not.toThrow();
    });

    it('names the unknown key and lists the known ones', () => {
      refused(
        () => knownKeys('sequences.define', { name: 'x', timezone: 'UTC' }, ['name', 'timeZone']),
        "sequences.define has no option 'timezone'",
        'known options: name, timeZone',
      );
    });

    it('counts a key whose value is undefined', () => {
      refused(() => knownKeys('sequences.next', { scop: undefined }, ['scope']), "'scop'");
    });
  });

  describe('plainObject', () => {
    it('accepts objects', () => {
      const o = { a: 1 };
      expect(plainObject('options', o)).toBe(o);
      const bare = Object.create(null);
      expect(plainObject('options', bare)).toBe(bare);
    });

    it.each([
      [null, 'got null'],
      [undefined, 'got undefined'],
      [[], 'got an array'],
      ['x', 'got "x"'],
      [3, 'got 3'],
    ])('refuses %j', (value, shown) => {
      refused(() => plainObject('next options', value), 'next options must be an object', shown);
    });
  });

  describe('describe', () => {
    it('quotes strings', () => {
      expect(describeValue('abc')).toBe('"abc"');
      expect(describeValue('')).toBe('""');
      expect(describeValue('a"b')).toBe('"a\\"b"');
    });

    it('cuts strings longer than 80 characters', () => {
      expect(describeValue('x'.repeat(80))).toBe(`"${'x'.repeat(80)}"`);
      expect(describeValue('x'.repeat(81))).toBe(`"${'x'.repeat(80)}…"`);
    });

    it('shows numbers, booleans, null and undefined as they are', () => {
      expect(describeValue(1.5)).toBe('1.5');
      expect(describeValue(Number.NaN)).toBe('NaN');
      expect(describeValue(false)).toBe('false');
      expect(describeValue(null)).toBe('null');
      expect(describeValue(undefined)).toBe('undefined');
    });

    it('shows dates, valid or not', () => {
      expect(describeValue(new Date('2026-03-01T10:00:00Z'))).toBe('Date(2026-03-01T10:00:00.000Z)');
      expect(describeValue(new Date('nope'))).toBe('Date(invalid)');
    });

    it('shows only the type of other values', () => {
      expect(describeValue([1, 2])).toBe('an array');
      expect(describeValue({ secret: 'pw' })).toBe('object');
      expect(describeValue(() => 1)).toBe('function');
      expect(describeValue(10n)).toBe('bigint');
    });
  });
});

describe('validateFormat', () => {
  it.each([
    '{n}',
    '{n:1}',
    '{n:9}',
    '{n:10}',
    '{n:20}',
    'INV-{YYYY}-{n:6}',
    '{YY}{MM}{DD}-{n}',
    '{IYYY}-W{WW}-{n:3}',
    '{scope}/{n}',
    'no tokens but {n} and text',
    `${'x'.repeat(MAX_FORMAT_LENGTH - 3)}{n}`,
  ])('accepts %j', (format) => {
    expect(validateFormat(format)).toBe(format);
  });

  it('accepts every documented token', () => {
    const all = FORMAT_TOKENS.map((t) => (t === '{n:W}' ? '{n:4}' : t)).join('-');
    expect(validateFormat(all)).toBe(all);
  });

  it.each([
    ['{Q}-{n}', '{Q}'],
    ['{n:0}', '{n:0}'],
    ['{n:21}', '{n:21}'],
    ['{n:06}', '{n:06}'],
    ['{N}', '{N}'],
    ['{yyyy}-{n}', '{yyyy}'],
    ['{}-{n}', '{}'],
    ['{n:}', '{n:}'],
    ['{ n }', '{ n }'],
  ])('refuses %j: unknown token', (format, token) => {
    const error = refused(() => validateFormat(format), `format has an unknown token ${token};`);
    expect(error.message).toContain('braces only enclose the tokens');
    expect(error.message).toContain(FORMAT_TOKENS.join(' '));
  });

  it.each([
    ['{n}-{n:{YYYY}{MM}{DD}}', "a stray '{'"],
    ['{n:{DD}}', "a stray '{'"],
    ['A{B-{n}', "a stray '{'"],
    ['{n}}', "a stray '}'"],
    ['}{n}', "a stray '}'"],
    ['{n}{', "a stray '{'"],
  ])('refuses %j: braces that enclose no token', (format, what) => {
    refused(() => validateFormat(format), `format has ${what}; braces only enclose the tokens`);
  });

  it('bounds the rendered length: each {scope} counts as 200 characters, {n} as 20', () => {
    const four = '{scope}'.repeat(4);
    // 800 + 20 + 150: well within 1000.
    expect(validateFormat(`${four}{n}${'x'.repeat(150)}`)).toBe(`${four}{n}${'x'.repeat(150)}`);
    refused(
      () => validateFormat(`${'{scope}'.repeat(5)}{n}`),
      'format may render up to 1020 characters; at most 1000 are allowed',
    );
  });

  it.each(['INV-{YYYY}', 'plain', '{scope}-{DD}'])('refuses %j: no number', (format) => {
    refused(() => validateFormat(format), 'must contain {n} or {n:W}', `'${format}'`);
  });

  it.each([[''], [42], [null], [undefined], [['{n}']]])('refuses %j: not a text', (format) => {
    refused(() => validateFormat(format), 'format must be a text of 1 to 200 characters');
  });

  it('refuses a format longer than 200 characters', () => {
    refused(() => validateFormat(`${'x'.repeat(MAX_FORMAT_LENGTH - 2)}{n}`), 'format must be a text');
  });
});

describe('resolveConfig', () => {
  it('fills in defaults', () => {
    const config = resolveConfig({ databaseUrl: URL_A }, {});
    expect(config).toMatchObject({
      source: { kind: 'url', url: URL_A },
      schema: 'ordo',
      migrate: true,
      poolSize: 10,
    });
    expect(config.nodeId).toMatch(UUID);
    expect(config.prepare).toBe(false);
  });

  it('gives every config its own random node id', () => {
    const ids = new Set(Array.from({ length: 5 }, () => resolveConfig({ databaseUrl: URL_A }, {}).nodeId));
    expect(ids.size).toBe(5);
  });

  it('keeps given values', () => {
    const nodeId = '0b6e9c3a-5d2f-4a71-9f1e-3c4d5e6f7a8b';
    expect(
      resolveConfig(
        { databaseUrl: URL_A, schema: 'billing', nodeId, migrate: false, poolSize: 3, prepare: true },
        {},
      ),
    ).toEqual({
      source: { kind: 'url', url: URL_A },
      schema: 'billing',
      nodeId,
      migrate: false,
      poolSize: 3,
      listenUrl: undefined,
      log: expect.any(Function),
      connectTimeoutMs: 10_000,
      statementTimeoutMs: 30_000,
      prepare: true,
    });
  });

  it('connectTimeout and statementTimeout: durations, bounded', () => {
    const config = resolveConfig({ databaseUrl: URL_A, connectTimeout: '2s', statementTimeout: 1500 }, {});
    expect([config.connectTimeoutMs, config.statementTimeoutMs]).toEqual([2000, 1500]);
    refused(
      () => resolveConfig({ databaseUrl: URL_A, connectTimeout: '0s' }, {}),
      'connectTimeout must be a duration',
    );
    refused(
      () => resolveConfig({ databaseUrl: URL_A, statementTimeout: 'soon' }, {}),
      'statementTimeout must be a duration',
    );
  });

  it('listenUrl: from the option, else ORDO_LISTEN_URL; a postgres URL, never echoed', () => {
    expect(resolveConfig({ databaseUrl: URL_A, listenUrl: URL_B }, {}).listenUrl).toBe(URL_B);
    expect(resolveConfig({ databaseUrl: URL_A }, { ORDO_LISTEN_URL: URL_B }).listenUrl).toBe(URL_B);
    expect(
      resolveConfig({ databaseUrl: URL_A, listenUrl: URL_A }, { ORDO_LISTEN_URL: URL_B }).listenUrl,
    ).toBe(URL_A);
    expect(resolveConfig({ databaseUrl: URL_A }, { ORDO_LISTEN_URL: '' }).listenUrl).toBeUndefined();
    const error = refused(
      () => resolveConfig({ databaseUrl: URL_A, listenUrl: 'mysql://u:secret@h/db' }, {}),
      'listenUrl must be a postgres:// or postgresql:// URL',
    );
    expect(error.message).not.toContain('secret');
    refused(
      () => resolveConfig({ databaseUrl: URL_A }, { ORDO_LISTEN_URL: 'redis://h' }),
      'listenUrl must be',
    );
  });

  it('log: a function, by default one that turns warnings into process warnings', () => {
    const log = () => undefined;
    expect(resolveConfig({ databaseUrl: URL_A, log }, {}).log).toBe(log);
    refused(
      () => resolveConfig({ databaseUrl: URL_A, log: 'console' as never }, {}),
      'log must be a function',
    );
  });

  it('lower-cases the node id', () => {
    const nodeId = '0B6E9C3A-5D2F-4A71-9F1E-3C4D5E6F7A8B';
    expect(resolveConfig({ databaseUrl: URL_A, nodeId }, {}).nodeId).toBe(nodeId.toLowerCase());
  });

  it('accepts poolSize 1 and 1000', () => {
    expect(resolveConfig({ databaseUrl: URL_A, poolSize: 1 }, {}).poolSize).toBe(1);
    expect(resolveConfig({ databaseUrl: URL_A, poolSize: 1000 }, {}).poolSize).toBe(1000);
  });

  it('accepts postgresql:// URLs', () => {
    const url = 'postgresql://u:p@h/db';
    expect(resolveConfig({ databaseUrl: url }, {}).source).toEqual({ kind: 'url', url });
  });

  describe('environment', () => {
    it('reads DATABASE_URL', () => {
      expect(resolveConfig({}, { DATABASE_URL: URL_A }).source).toEqual({ kind: 'url', url: URL_A });
    });

    it('prefers ORDO_DATABASE_URL to DATABASE_URL', () => {
      expect(resolveConfig({}, { DATABASE_URL: URL_A, ORDO_DATABASE_URL: URL_B }).source).toEqual({
        kind: 'url',
        url: URL_B,
      });
    });

    it('prefers databaseUrl to both variables', () => {
      const env = { DATABASE_URL: URL_B, ORDO_DATABASE_URL: URL_B };
      expect(resolveConfig({ databaseUrl: URL_A }, env).source).toEqual({ kind: 'url', url: URL_A });
    });

    it('prefers a pool or embedded to the variables', () => {
      const env = { DATABASE_URL: URL_A, ORDO_DATABASE_URL: URL_B };
      expect(resolveConfig({ pool: somePool }, env).source).toEqual({ kind: 'pool', pool: somePool });
      expect(resolveConfig({ embedded: true }, env).source).toEqual({
        kind: 'embedded',
        dataDir: '.ordo/pg',
      });
    });

    it('reads ORDO_SCHEMA, and schema wins over it', () => {
      expect(resolveConfig({ databaseUrl: URL_A }, { ORDO_SCHEMA: 'from_env' }).schema).toBe('from_env');
      expect(resolveConfig({ databaseUrl: URL_A, schema: 'given' }, { ORDO_SCHEMA: 'from_env' }).schema).toBe(
        'given',
      );
    });

    it('validates ORDO_SCHEMA too', () => {
      refused(() => resolveConfig({ databaseUrl: URL_A }, { ORDO_SCHEMA: 'bad-schema' }), '"bad-schema"');
    });

    it('validates a URL from the environment too', () => {
      refused(() => resolveConfig({}, { DATABASE_URL: 'mysql://x@y/z' }), 'postgres://');
    });

    it('does not read process.env when an env is given', () => {
      refused(() => resolveConfig({}, {}), 'no database given');
    });
  });

  describe('sources', () => {
    it('takes a pool as it is', () => {
      const config = resolveConfig({ pool: somePool }, {});
      expect(config.source.kind).toBe('pool');
      expect(config.source.kind === 'pool' && config.source.pool).toBe(somePool);
    });

    it('embedded: true uses ./.ordo/pg', () => {
      expect(resolveConfig({ embedded: true }, {}).source).toEqual({ kind: 'embedded', dataDir: '.ordo/pg' });
      expect(resolveConfig({ embedded: {} }, {}).source).toEqual({ kind: 'embedded', dataDir: '.ordo/pg' });
    });

    it('embedded takes a dataDir', () => {
      expect(resolveConfig({ embedded: { dataDir: '/tmp/x' } }, {}).source).toEqual({
        kind: 'embedded',
        dataDir: '/tmp/x',
      });
    });

    it('embedded: false falls through to the URL', () => {
      expect(resolveConfig({ embedded: false, databaseUrl: URL_A }, {}).source).toEqual({
        kind: 'url',
        url: URL_A,
      });
      refused(() => resolveConfig({ embedded: false }, {}), 'no database given');
    });

    it.each([
      [{ databaseUrl: URL_A, pool: somePool }],
      [{ databaseUrl: URL_A, embedded: true }],
      [{ pool: somePool, embedded: { dataDir: '/tmp/x' } }],
      [{ databaseUrl: URL_A, pool: somePool, embedded: true }],
    ])('refuses more than one source: %#', (options) => {
      refused(() => resolveConfig(options, {}), 'give only one of databaseUrl, pool and embedded');
    });

    it('refuses no source, and says how to give one', () => {
      refused(
        () => resolveConfig({}, {}),
        'no database given',
        'databaseUrl',
        'embedded: true',
        'ORDO_DATABASE_URL',
        'DATABASE_URL',
      );
      refused(() => resolveConfig(undefined, {}), 'no database given');
    });

    it.each([
      ['mysql://root:secret@host/db'],
      ['http://secret@host/db'],
      ['localhost:5432/secret'],
      [''],
      [' postgres://secret@host/db'],
    ])('refuses the URL %j without echoing it', (url) => {
      const error = refused(
        () => resolveConfig({ databaseUrl: url }, {}),
        'databaseUrl must be a postgres:// or postgresql:// URL',
      );
      expect(error.message).not.toContain('secret');
    });

    it('refuses a databaseUrl that is not a string', () => {
      refused(() => resolveConfig({ databaseUrl: 42 as unknown as string }, {}), 'databaseUrl must be');
    });

    it.each([[{}], [null], ['pool']])('refuses a pool without connect(): %j', (pool) => {
      refused(() => resolveConfig({ pool: pool as unknown as pg.Pool }, {}), 'pool must be a pg.Pool');
    });

    it('refuses a bad embedded option', () => {
      refused(
        () => resolveConfig({ embedded: { dataDir: '' } }, {}),
        'embedded.dataDir must be a directory path',
        'got ""',
      );
      refused(
        () => resolveConfig({ embedded: { dataDir: 7 as unknown as string } }, {}),
        'embedded.dataDir',
        'got 7',
      );
      refused(
        () => resolveConfig({ embedded: { datadir: '/tmp/x' } as never }, {}),
        "embedded has no option 'datadir'",
      );
      refused(() => resolveConfig({ embedded: 'yes' as never }, {}), 'embedded must be an object');
    });
  });

  describe('refusals', () => {
    it('refuses options that are not an object', () => {
      refused(() => resolveConfig(null as never, {}), 'createOrdo options must be an object', 'got null');
      refused(() => resolveConfig([] as never, {}), 'got an array');
    });

    it('refuses a misspelt option', () => {
      refused(
        () => resolveConfig({ databaseUrl: URL_A, poolsize: 5 } as never, {}),
        "createOrdo has no option 'poolsize'",
        'poolSize',
      );
    });

    it.each([['bad-schema'], ['1schema'], ['s'.repeat(64)], [''], [7]])('refuses the schema %j', (schema) => {
      refused(() => resolveConfig({ databaseUrl: URL_A, schema: schema as string }, {}), /^schema must be/);
    });

    it.each([
      ['not-a-uuid', '"not-a-uuid"'],
      ['0b6e9c3a5d2f4a719f1e3c4d5e6f7a8b', '"0b6e9c3a5d2f4a719f1e3c4d5e6f7a8b"'],
      ['0b6e9c3a-5d2f-4a71-9f1e-3c4d5e6f7a8', '"0b6e9c3a-5d2f-4a71-9f1e-3c4d5e6f7a8"'],
      ['', '""'],
      [42, 'got 42'],
    ])('refuses the nodeId %j', (nodeId, shown) => {
      refused(
        () => resolveConfig({ databaseUrl: URL_A, nodeId: nodeId as string }, {}),
        'nodeId must be a UUID',
        shown,
      );
    });

    it.each([['yes'], [1], ['true']])('refuses migrate %j', (migrate) => {
      refused(
        () => resolveConfig({ databaseUrl: URL_A, migrate: migrate as unknown as boolean }, {}),
        'migrate must be true or false',
      );
    });

    it.each([[0], [1001], [1.5], [-1], ['10']])('refuses poolSize %j', (poolSize) => {
      refused(
        () => resolveConfig({ databaseUrl: URL_A, poolSize: poolSize as number }, {}),
        'poolSize must be a whole number from 1 to 1000',
      );
    });
  });
});
