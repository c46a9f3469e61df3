import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadMigrations } from '../src/db/migrations.js';
import {
  createOrdo,
  type DefineSequenceOptions,
  ERROR_CODES,
  MAX_COUNT,
  type NextOptions,
  type Ordo,
  OrdoError,
  type OrdoErrorCode,
} from '../src/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';

let db: TestDatabase;
let ordo: Ordo;
let raw: pg.Pool;

beforeAll(async () => {
  db = await freshDatabase();
  ordo = await createOrdo({ databaseUrl: db.url });
  raw = db.pool();
});
afterAll(async () => {
  await ordo?.close();
  await db?.drop();
});

/** Every code an assertion below has seen, checked against ERROR_CODES by the last test. */
const reached = new Set<OrdoErrorCode>();

/**
 * Runs `action`, which must fail with an OrdoError of `code` whose message contains each
 * fragment; returns the error. `action` is a function so that a synchronous throw counts too.
 */
async function expectOrdoError(
  action: () => unknown,
  code: OrdoErrorCode,
  ...fragments: (string | RegExp)[]
): Promise<OrdoError> {
  let thrown: unknown;
  let failed = false;
  try {
    await action();
  } catch (e) {
    thrown = e;
    failed = true;
  }
  if (!failed) throw new Error(`expected an OrdoError '${code}', but the call succeeded`);
  expect(thrown).toBeInstanceOf(OrdoError);
  const error = thrown as OrdoError;
  expect(error.name).toBe('OrdoError');
  expect(error.code).toBe(code);
  expect(error.httpStatus).toBe(ERROR_CODES[code]);
  for (const fragment of fragments) expect(error.message).toMatch(fragment);
  reached.add(error.code);
  return error;
}

/** A raw client in an open transaction; always rolled back and released by `use`. */
async function inTransaction<T>(use: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  const client = await raw.connect();
  try {
    await client.query('BEGIN');
    return await use(client);
  } finally {
    await client.query('ROLLBACK').catch(() => undefined);
    client.release();
  }
}

describe('invalid_argument', () => {
  describe('sequences.define refuses, and writes nothing', () => {
    const cases: [string, unknown, (string | RegExp)[]][] = [
      ['a name starting with a digit', { name: '1abc' }, ['name must be an identifier', '"1abc"']],
      ['a name with a dash', { name: 'a-b' }, ['name must be an identifier', '"a-b"']],
      ['a name of 64 characters', { name: 'n'.repeat(64) }, ['at most 63 characters', 'n'.repeat(64)]],
      ['a name that is not a string', { name: 42 }, ['name must be an identifier', 'got 42']],
      ['no name', {}, ['name must be an identifier', 'got undefined']],
      [
        'a misspelt option',
        { name: 'typo', timezone: 'Europe/Paris' },
        ["sequences.define has no option 'timezone'", 'timeZone'],
      ],
      ['an unknown time zone', { name: 'tz_mars', timeZone: 'Mars/Base' }, ["'Mars/Base'", /time zone/i]],
      ['the abbreviation CEST (not a zone)', { name: 'tz_cest', timeZone: 'CEST' }, ["'CEST'", /time zone/i]],
      ['the POSIX offset UTC+3', { name: 'tz_posix', timeZone: 'UTC+3' }, ["'UTC+3'", /time zone/i]],
      ['an empty time zone', { name: 'tz_empty', timeZone: '' }, ['timeZone must be', 'got ""']],
      ['a time zone that is not a string', { name: 'tz_num', timeZone: 3 }, ['timeZone must be', 'got 3']],
      ['a format with an unknown token', { name: 'fmt_q', format: 'INV-{Q}-{n}' }, ['unknown token {Q}']],
      [
        'a format without {n}',
        { name: 'fmt_nonum', format: 'INV-{YYYY}' },
        ['must contain {n}', "'INV-{YYYY}'"],
      ],
      ['a format width of 21', { name: 'fmt_w', format: '{n:21}' }, ['unknown token {n:21}']],
      ['an empty format', { name: 'fmt_empty', format: '' }, ['format must be a text']],
      ['start above maxValue', { name: 'lim1', start: 10, maxValue: 5 }, ['maxValue', 'from 10', 'got 5']],
      ['minValue above start', { name: 'lim2', start: 1, minValue: 5 }, ['minValue', 'to 1', 'got 5']],
      ['increment 0', { name: 'inc0', increment: 0 }, ['increment must be a whole number from 1', 'got 0']],
      ['a negative increment', { name: 'incneg', increment: -1 }, ['increment', 'got -1']],
      ['a fractional start', { name: 'frac', start: 1.5 }, ['start must be a whole number', 'got 1.5']],
      ['an unsafe maxValue', { name: 'unsafe', maxValue: 2 ** 53 }, ['maxValue', 'got 9007199254740992']],
      ['an unsafe start', { name: 'unsafe2', start: -(2 ** 53) }, ['start', 'got -9007199254740992']],
      ['a start given as text', { name: 'strstart', start: '1' }, ['start', 'got "1"']],
      ['an unknown reset', { name: 'rst', reset: 'hourly' }, ["reset must be one of 'never'", '"hourly"']],
      [
        'a batched sequence with a reset',
        { name: 'batch', kind: 'batched', reset: 'day' },
        ['reset applies to gapless sequences only'],
      ],
      [
        'a gapless sequence with a batch',
        { name: 'gbatch', batch: 10 },
        ['batch applies to batched sequences only'],
      ],
      [
        'a batch of 0',
        { name: 'batch0', kind: 'batched', batch: 0 },
        ['batch must be a whole number from 1 to 1000000'],
      ],
      ['an unknown kind', { name: 'kindx', kind: 'sparse' }, ["kind must be one of 'gapless'", '"sparse"']],
      ['a cycle that is not a boolean', { name: 'cyc', cycle: 'yes' }, ['cycle must be true or false']],
      ['an ifNotExists that is not a boolean', { name: 'ine', ifNotExists: 1 }, ['ifNotExists must be']],
      ['a definition that is not an object', null, ['sequence definition must be an object']],
    ];

    it.each(cases)('%s', async (_, definition, fragments) => {
      const before = await ordo.sequences.list();
      await expectOrdoError(
        () => ordo.sequences.define(definition as DefineSequenceOptions),
        'invalid_argument',
        ...fragments,
      );
      expect(await ordo.sequences.list()).toEqual(before);
      const name = (definition as { name?: unknown } | null)?.name;
      if (typeof name === 'string' && /^[A-Za-z_]\w{0,62}$/.test(name)) {
        expect(await ordo.sequences.get(name)).toBeNull();
      }
    });

    it('a refused time zone leaves the name free', async () => {
      await expectOrdoError(
        () => ordo.sequences.define({ name: 'tz_retry', timeZone: 'Mars/Base' }),
        'invalid_argument',
      );
      const def = await ordo.sequences.define({ name: 'tz_retry', timeZone: 'Europe/Paris' });
      expect(def.timeZone).toBe('Europe/Paris');
    });
  });

  describe('next, nextval and nextMany refuse bad arguments', () => {
    beforeAll(async () => {
      await ordo.sequences.define({ name: 'args' });
    });

    const callers: [string, (name: string, options?: NextOptions) => Promise<unknown>][] = [
      ['next', (name, options) => ordo.sequences.next(name, options)],
      ['nextval', (name, options) => ordo.nextval(name, options)],
      ['nextMany', (name, options) => ordo.sequences.nextMany(name, 2, options)],
    ];

    const cases: [string, string, unknown, (string | RegExp)[]][] = [
      ['a bad name', '1abc', {}, ['name must be an identifier', '"1abc"']],
      ['a name that is not a string', 7 as unknown as string, {}, ['name must be an identifier', 'got 7']],
      [
        'a scope of 201 characters',
        'args',
        { scope: 's'.repeat(201) },
        ['scope must be a text of at most 200'],
      ],
      ['a scope that is not a string', 'args', { scope: 42 }, ['scope must be a text', 'got 42']],
      ['a scope with a NUL character', 'args', { scope: 'a\u0000b' }, ['scope must be a text']],
      ['at "yesterday"', 'args', { at: 'yesterday' }, ['at must be a Date or an ISO 8601', '"yesterday"']],
      ['at an invalid Date', 'args', { at: new Date('nope') }, ['at must be a Date', 'Date(invalid)']],
      ['at a number', 'args', { at: 1_700_000_000_000 }, ['at must be a Date', 'got 1700000000000']],
      ['a tx without query()', 'args', { tx: {} }, ['tx must be a pg Client/PoolClient']],
      ['a null tx', 'args', { tx: null }, ['tx must be']],
      ['a misspelt option', 'args', { scop: 'x' }, ["sequences.next has no option 'scop'", 'scope']],
      ['options that are not an object', 'args', 'acme', ['next options must be an object', '"acme"']],
    ];

    for (const [callerName, call] of callers) {
      it.each(cases)(`${callerName}: %s`, async (_, name, options, fragments) => {
        await expectOrdoError(() => call(name, options as NextOptions), 'invalid_argument', ...fragments);
      });
    }

    it.each([
      ['year 10000', new Date('+010000-01-01T00:00:00Z')],
      ['year 0', new Date('0000-06-01T00:00:00Z')],
      ['the earliest JavaScript date', new Date(-8.64e15)],
    ])('at %s, a valid Date PostgreSQL cannot hold, is an invalid argument', async (_, at) => {
      // The caller chose the date: a 400, not a 500 database_error.
      await expectOrdoError(() => ordo.sequences.next('args', { at }), 'invalid_argument');
    });

    it('a refused call takes no value', async () => {
      await expectOrdoError(() => ordo.sequences.next('args', { at: 'yesterday' }), 'invalid_argument');
      await ordo.sequences.define({ name: 'args_untouched' });
      await expectOrdoError(
        () => ordo.sequences.nextMany('args_untouched', 0),
        'invalid_argument',
        'count must be a whole number from 1 to 10000',
        'got 0',
      );
      expect(await ordo.nextval('args_untouched')).toBe(1);
    });

    it.each([
      [0, 'got 0'],
      [MAX_COUNT + 1, 'got 10001'],
      [-3, 'got -3'],
      [1.5, 'got 1.5'],
      ['2', 'got "2"'],
    ])('nextMany refuses count %j', async (count, shown) => {
      await expectOrdoError(
        () => ordo.sequences.nextMany('args', count as number),
        'invalid_argument',
        'count must be a whole number from 1 to 10000',
        shown,
      );
    });

    it('nextMany accepts count 10000 (the limit itself)', async () => {
      await ordo.sequences.define({ name: 'args_many' });
      const issued = await ordo.sequences.nextMany('args_many', MAX_COUNT);
      expect(issued).toHaveLength(MAX_COUNT);
      expect(issued.at(-1)?.value).toBe(MAX_COUNT);
    });
  });

  describe('get and remove refuse bad arguments', () => {
    it('get refuses a bad name', async () => {
      await expectOrdoError(() => ordo.sequences.get('a-b'), 'invalid_argument', 'name', '"a-b"');
    });

    it('remove refuses a bad name, a misspelt option and a non-boolean ifExists', async () => {
      await expectOrdoError(() => ordo.sequences.remove('1abc'), 'invalid_argument', '"1abc"');
      await expectOrdoError(
        () => ordo.sequences.remove('whatever', { ifexists: true } as never),
        'invalid_argument',
        "sequences.remove has no option 'ifexists'",
      );
      await expectOrdoError(
        () => ordo.sequences.remove('whatever', { ifExists: 'yes' } as never),
        'invalid_argument',
        'ifExists must be true or false',
      );
    });

    it('a refused remove removes nothing', async () => {
      await ordo.sequences.define({ name: 'keep_me' });
      await expectOrdoError(
        () => ordo.sequences.remove('keep_me', { ifExists: 1 } as never),
        'invalid_argument',
        'ifExists',
      );
      expect(await ordo.sequences.get('keep_me')).not.toBeNull();
    });
  });

  describe('createOrdo refuses bad options before connecting', () => {
    it('both databaseUrl and pool', async () => {
      await expectOrdoError(
        () => createOrdo({ databaseUrl: db.url, pool: raw }),
        'invalid_argument',
        'give only one of databaseUrl, pool and embedded',
      );
    });

    it('both databaseUrl and embedded', async () => {
      await expectOrdoError(
        () => createOrdo({ databaseUrl: db.url, embedded: true }),
        'invalid_argument',
        'give only one of databaseUrl, pool and embedded',
      );
    });

    it('a URL that is not postgres://, without echoing it', async () => {
      const error = await expectOrdoError(
        () => createOrdo({ databaseUrl: 'mysql://root:s3cr3t@127.0.0.1:3306/app' }),
        'invalid_argument',
        'databaseUrl must be a postgres:// or postgresql:// URL',
      );
      expect(error.message).not.toContain('s3cr3t');
    });

    it('no database at all', async () => {
      const saved = {
        DATABASE_URL: process.env.DATABASE_URL,
        ORDO_DATABASE_URL: process.env.ORDO_DATABASE_URL,
      };
      delete process.env.DATABASE_URL;
      delete process.env.ORDO_DATABASE_URL;
      try {
        await expectOrdoError(
          () => createOrdo(),
          'invalid_argument',
          'no database given',
          'ORDO_DATABASE_URL or DATABASE_URL',
        );
        await expectOrdoError(() => createOrdo({ schema: 'ordo' }), 'invalid_argument', 'no database given');
      } finally {
        for (const [key, value] of Object.entries(saved)) {
          if (value === undefined) delete process.env[key];
          else process.env[key] = value;
        }
      }
    });

    it('a bad schema name', async () => {
      await expectOrdoError(
        () => createOrdo({ databaseUrl: db.url, schema: 'my-schema' }),
        'invalid_argument',
        'schema must be an identifier',
        '"my-schema"',
      );
    });

    it('a bad nodeId', async () => {
      await expectOrdoError(
        () => createOrdo({ databaseUrl: db.url, nodeId: 'node-1' }),
        'invalid_argument',
        'nodeId must be a UUID',
        '"node-1"',
      );
    });

    it('a misspelt option', async () => {
      await expectOrdoError(
        () => createOrdo({ databaseUrl: db.url, poolsize: 3 } as never),
        'invalid_argument',
        "createOrdo has no option 'poolsize'",
      );
    });

    it('a bad poolSize, migrate or pool', async () => {
      await expectOrdoError(
        () => createOrdo({ databaseUrl: db.url, poolSize: 0 }),
        'invalid_argument',
        'poolSize',
        'got 0',
      );
      await expectOrdoError(
        () => createOrdo({ databaseUrl: db.url, migrate: 'no' as never }),
        'invalid_argument',
        'migrate must be true or false',
      );
      await expectOrdoError(
        () => createOrdo({ pool: {} as never }),
        'invalid_argument',
        'pool must be a pg.Pool',
      );
    });

    it('a refused schema name creates nothing', async () => {
      const { rows } = await raw.query(
        "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' AND nspname NOT IN ('information_schema', 'public') ORDER BY 1",
      );
      expect(rows.map((r) => r.nspname)).toEqual(['ordo']);
    });
  });
});

describe('sequence_not_found', () => {
  it('next, nextval and nextMany on an unknown sequence', async () => {
    await expectOrdoError(
      () => ordo.sequences.next('no_such_seq'),
      'sequence_not_found',
      "The sequence 'no_such_seq' does not exist",
    );
    await expectOrdoError(() => ordo.nextval('no_such_seq'), 'sequence_not_found', "'no_such_seq'");
    await expectOrdoError(
      () => ordo.sequences.nextMany('no_such_seq', 3),
      'sequence_not_found',
      "'no_such_seq'",
    );
  });

  it('in a transaction too', async () => {
    await inTransaction(async (client) => {
      await expectOrdoError(
        () => ordo.sequences.next('no_such_seq', { tx: client }),
        'sequence_not_found',
        "'no_such_seq'",
      );
    });
  });

  it('concurrent standalone calls all get it', async () => {
    const results = await Promise.allSettled(
      Array.from({ length: 5 }, () => ordo.sequences.next('no_such_seq_either')),
    );
    for (const r of results) {
      expect(r.status).toBe('rejected');
      expect(r.status === 'rejected' && (r.reason as OrdoError).code).toBe('sequence_not_found');
    }
  });

  it('remove without ifExists; with ifExists it answers false', async () => {
    await expectOrdoError(
      () => ordo.sequences.remove('no_such_seq'),
      'sequence_not_found',
      "The sequence 'no_such_seq' does not exist",
    );
    await expect(ordo.sequences.remove('no_such_seq', { ifExists: true })).resolves.toBe(false);
  });

  it('get answers null rather than failing', async () => {
    await expect(ordo.sequences.get('no_such_seq')).resolves.toBeNull();
  });

  it('a removed sequence is gone for next and remove', async () => {
    await ordo.sequences.define({ name: 'short_lived' });
    expect(await ordo.nextval('short_lived')).toBe(1);
    await expect(ordo.sequences.remove('short_lived')).resolves.toBe(true);
    await expectOrdoError(() => ordo.nextval('short_lived'), 'sequence_not_found', "'short_lived'");
    await expectOrdoError(() => ordo.sequences.remove('short_lived'), 'sequence_not_found', "'short_lived'");
  });
});

describe('sequence_exists', () => {
  it('define twice', async () => {
    const first = await ordo.sequences.define({ name: 'dup', start: 5 });
    const error = await expectOrdoError(
      () => ordo.sequences.define({ name: 'dup', start: 5 }),
      'sequence_exists',
    );
    expect(error.message).toBe("The sequence 'dup' already exists");
    expect(await ordo.sequences.get('dup')).toEqual(first);
  });

  it('a different definition under the same name is refused as well and changes nothing', async () => {
    const first = await ordo.sequences.define({ name: 'dup2' });
    await expectOrdoError(
      () => ordo.sequences.define({ name: 'dup2', start: 100, reset: 'year', format: 'X-{n}' }),
      'sequence_exists',
      "The sequence 'dup2' already exists",
    );
    expect(await ordo.sequences.get('dup2')).toEqual(first);
  });

  it('with ifNotExists, the existing definition is returned unchanged', async () => {
    const first = await ordo.sequences.define({ name: 'dup3', start: 7, format: 'D-{n:3}' });
    const again = await ordo.sequences.define({ name: 'dup3', start: 100, ifNotExists: true });
    expect(again).toEqual(first);
    expect(again.start).toBe(7);
    expect(await ordo.sequences.get('dup3')).toEqual(first);
  });

  it('with ifNotExists, a new name is defined', async () => {
    const def = await ordo.sequences.define({ name: 'dup4', start: 3, ifNotExists: true });
    expect(def).toMatchObject({ name: 'dup4', start: 3 });
    expect(await ordo.nextval('dup4')).toBe(3);
  });

  it('of concurrent defines of one name, exactly one wins', async () => {
    const results = await Promise.allSettled(
      Array.from({ length: 6 }, () => ordo.sequences.define({ name: 'dup_race' })),
    );
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    const losers = results.flatMap((r) => (r.status === 'rejected' ? [r.reason] : []));
    expect(losers).toHaveLength(5);
    for (const e of losers) {
      expect(e).toBeInstanceOf(OrdoError);
      expect((e as OrdoError).code).toBe('sequence_exists');
    }
  });
});

describe('sequence_exhausted', () => {
  it('standalone: maxValue 3, the 4th call fails, and keeps failing', async () => {
    await ordo.sequences.define({ name: 'ex_alone', maxValue: 3 });
    expect([
      await ordo.nextval('ex_alone'),
      await ordo.nextval('ex_alone'),
      await ordo.nextval('ex_alone'),
    ]).toEqual([1, 2, 3]);
    await expectOrdoError(() => ordo.sequences.next('ex_alone'), 'sequence_exhausted', "'ex_alone'", '3');
    await expectOrdoError(() => ordo.nextval('ex_alone'), 'sequence_exhausted', "'ex_alone'");
    await expectOrdoError(() => ordo.sequences.nextMany('ex_alone', 1), 'sequence_exhausted');
  });

  it('in a transaction: the 4th call fails, and a rollback gives the values back', async () => {
    await ordo.sequences.define({ name: 'ex_tx', maxValue: 3 });
    await inTransaction(async (client) => {
      const taken: number[] = [];
      for (let i = 0; i < 3; i++) taken.push((await ordo.sequences.next('ex_tx', { tx: client })).value);
      expect(taken).toEqual([1, 2, 3]);
      await expectOrdoError(
        () => ordo.sequences.next('ex_tx', { tx: client }),
        'sequence_exhausted',
        "The sequence 'ex_tx' is exhausted",
        '3',
      );
    });
    // Rolled back: all three values are free again.
    expect((await ordo.sequences.nextMany('ex_tx', 3)).map((i) => i.value)).toEqual([1, 2, 3]);
  });

  it('nextMany asking for more than is left fails and takes nothing', async () => {
    await ordo.sequences.define({ name: 'ex_many', maxValue: 3 });
    await expectOrdoError(() => ordo.sequences.nextMany('ex_many', 4), 'sequence_exhausted', "'ex_many'");
    expect(await ordo.nextval('ex_many')).toBe(1);
    await expectOrdoError(() => ordo.sequences.nextMany('ex_many', 3), 'sequence_exhausted');
    expect((await ordo.sequences.nextMany('ex_many', 2)).map((i) => i.value)).toEqual([2, 3]);
  });

  it('respects increment: start 1, increment 5, maxValue 12 gives 1, 6, 11', async () => {
    await ordo.sequences.define({ name: 'ex_step', increment: 5, maxValue: 12 });
    expect((await ordo.sequences.nextMany('ex_step', 3)).map((i) => i.value)).toEqual([1, 6, 11]);
    await expectOrdoError(() => ordo.nextval('ex_step'), 'sequence_exhausted', '12');
  });

  it('10 concurrent standalone calls with maxValue 5: exactly 5 succeed with 1..5, 5 fail', async () => {
    await ordo.sequences.define({ name: 'ex_race', maxValue: 5 });
    const results = await Promise.allSettled(
      Array.from({ length: 10 }, () => ordo.sequences.next('ex_race')),
    );
    const values = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value.value] : []));
    const errors = results.flatMap((r) => (r.status === 'rejected' ? [r.reason] : []));
    expect(values.sort((a, b) => a - b)).toEqual([1, 2, 3, 4, 5]);
    expect(errors).toHaveLength(5);
    for (const e of errors) {
      expect(e).toBeInstanceOf(OrdoError);
      expect((e as OrdoError).code).toBe('sequence_exhausted');
      expect((e as OrdoError).httpStatus).toBe(ERROR_CODES.sequence_exhausted);
    }
    reached.add('sequence_exhausted');
  });

  it('each scope has its own room', async () => {
    await ordo.sequences.define({ name: 'ex_scoped', maxValue: 1 });
    expect(await ordo.nextval('ex_scoped', { scope: 'a' })).toBe(1);
    expect(await ordo.nextval('ex_scoped', { scope: 'b' })).toBe(1);
    await expectOrdoError(() => ordo.nextval('ex_scoped', { scope: 'a' }), 'sequence_exhausted');
  });

  it('a cycling sequence never is exhausted', async () => {
    await ordo.sequences.define({ name: 'ex_cycle', maxValue: 2, cycle: true });
    expect((await ordo.sequences.nextMany('ex_cycle', 5)).map((i) => i.value)).toEqual([1, 2, 1, 2, 1]);
  });
});

describe('timeout', () => {
  it('lock_timeout while another transaction holds the counter row', async () => {
    await ordo.sequences.define({ name: 'locked' });
    const client1 = await raw.connect();
    const client2 = await raw.connect();
    try {
      await client1.query('BEGIN');
      expect((await ordo.sequences.next('locked', { tx: client1 })).value).toBe(1);
      await client2.query('BEGIN');
      await client2.query("SET LOCAL lock_timeout = '100ms'");
      const error = await expectOrdoError(
        () => ordo.sequences.next('locked', { tx: client2 }),
        'timeout',
        /lock/i,
      );
      expect(error.cause).toMatchObject({ code: '55P03' });
    } finally {
      await client2.query('ROLLBACK').catch(() => undefined);
      await client1.query('ROLLBACK').catch(() => undefined);
      client2.release();
      client1.release();
    }
    // Both rolled back: the number was given back.
    expect(await ordo.nextval('locked')).toBe(1);
  });

  it('statement_timeout while another transaction holds the counter row', async () => {
    await ordo.sequences.define({ name: 'locked2' });
    expect(await ordo.nextval('locked2')).toBe(1);
    const client1 = await raw.connect();
    const client2 = await raw.connect();
    try {
      await client1.query('BEGIN');
      expect((await ordo.sequences.nextMany('locked2', 2, { tx: client1 })).map((i) => i.value)).toEqual([
        2, 3,
      ]);
      await client2.query('BEGIN');
      await client2.query("SET LOCAL statement_timeout = '100ms'");
      const error = await expectOrdoError(
        () => ordo.sequences.nextMany('locked2', 2, { tx: client2 }),
        'timeout',
        /statement timeout/i,
      );
      expect(error.cause).toMatchObject({ code: '57014' });
    } finally {
      await client2.query('ROLLBACK').catch(() => undefined);
      await client1.query('ROLLBACK').catch(() => undefined);
      client2.release();
      client1.release();
    }
    expect(await ordo.nextval('locked2')).toBe(2);
  });
});

describe('database_error', () => {
  it('a tx whose transaction has already failed', async () => {
    await ordo.sequences.define({ name: 'aborted_tx' });
    await inTransaction(async (client) => {
      await expect(client.query('SELECT 1/0')).rejects.toThrow(/division by zero/);
      const error = await expectOrdoError(
        () => ordo.sequences.next('aborted_tx', { tx: client }),
        'database_error',
        /current transaction is aborted/,
      );
      expect(error.cause).toMatchObject({ code: '25P02' });
    });
    expect(await ordo.nextval('aborted_tx')).toBe(1);
  });

  it('a tx adapter whose query() throws a plain error', async () => {
    await ordo.sequences.define({ name: 'adapter_tx' });
    const boom = new Error('driver exploded');
    const error = await expectOrdoError(
      () =>
        ordo.sequences.next('adapter_tx', {
          tx: {
            query: async () => {
              throw boom;
            },
          },
        }),
      'database_error',
      'driver exploded',
    );
    expect(error.cause).toBe(boom);
  });

  it('createOrdo on a database that does not exist', async () => {
    const url = new URL(db.url);
    url.pathname = '/ordo_no_such_database';
    await expectOrdoError(
      () => createOrdo({ databaseUrl: url.toString() }),
      'database_error',
      'ordo_no_such_database',
    );
  });
});

describe('closed', () => {
  it('every call after close() is refused; calls in flight are answered first', async () => {
    const other = await createOrdo({ databaseUrl: db.url });
    await other.sequences.define({ name: 'closing' });
    const inFlight = [other.sequences.next('closing'), other.nextval('closing')];
    await other.close();
    const answered = await Promise.all(inFlight);
    expect([(answered[0] as { value: number }).value, answered[1]].sort()).toEqual([1, 2]);

    const calls: [string, () => Promise<unknown>][] = [
      ['define', () => other.sequences.define({ name: 'after_close' })],
      ['get', () => other.sequences.get('closing')],
      ['list', () => other.sequences.list()],
      ['remove', () => other.sequences.remove('closing')],
      ['remove ifExists', () => other.sequences.remove('closing', { ifExists: true })],
      ['next', () => other.sequences.next('closing')],
      ['next in a tx', () => other.sequences.next('closing', { tx: raw })],
      ['nextMany', () => other.sequences.nextMany('closing', 2)],
      ['nextval', () => other.nextval('closing')],
    ];
    for (const [, call] of calls) {
      await expectOrdoError(call, 'closed', 'This ordo client is closed');
    }
    // Closing again is harmless, and the sequence is untouched by the refused calls.
    await expect(other.close()).resolves.toBeUndefined();
    expect(await ordo.sequences.get('after_close')).toBeNull();
    expect(await ordo.nextval('closing')).toBe(3);
  });

  it('a standalone call made just before close() is settled by the time close() resolves', async () => {
    const other = await createOrdo({ databaseUrl: db.url });
    await other.sequences.define({ name: 'closing_many' });
    const outcomes: string[] = [];
    const record = (label: string, p: Promise<unknown>) =>
      p.then(
        () => outcomes.push(`${label}: answered`),
        (e: unknown) => outcomes.push(`${label}: ${e instanceof OrdoError ? e.code : 'not an OrdoError'}`),
      );
    const calls = [
      record('nextMany', other.sequences.nextMany('closing_many', 2)),
      record('list', other.sequences.list()),
      record('get', other.sequences.get('closing_many')),
    ];
    await other.close();
    await new Promise<void>((resolve) => setImmediate(resolve));
    // Each call was made before close(): it must be answered (or refused as closed), never left pending.
    expect(outcomes.sort()).toEqual([
      expect.stringMatching(/^get: (answered|closed)$/),
      expect.stringMatching(/^list: (answered|closed)$/),
      expect.stringMatching(/^nextMany: (answered|closed)$/),
    ]);
    await Promise.all(calls);
  });

  it('a call of several statements made just before close() is answered whole: close() ends the pool after its last statement', async () => {
    const other = await createOrdo({ databaseUrl: db.url });
    await other.sequences.define({ name: 'closing_steps', kind: 'batched', batch: 10 });
    await ordo.sequences.define({ name: 'closing_gapless' });
    // alterTimeout sends its change, then reads the definition back: its second statement starts
    // from the first one's answer, when nothing is in flight for a moment.
    const altered = other.sequences.alterTimeout('closing_steps', '5s');
    // A standalone next() of a sequence this client has not looked up: the lookup, then the take.
    const first = other.sequences.next('closing_gapless');
    await other.close();
    await expect(altered).resolves.toMatchObject({ name: 'closing_steps', timeoutMs: 5000 });
    await expect(first).resolves.toMatchObject({ value: 1 });
    expect((await ordo.sequences.get('closing_steps'))?.timeoutMs).toBe(5000);
  });
  it('refuses even arguments it would otherwise reject as invalid', async () => {
    const other = await createOrdo({ databaseUrl: db.url });
    await other.close();
    await expectOrdoError(() => other.sequences.next('1abc'), 'closed');
  });
});

describe('schema versions', () => {
  let fresh: TestDatabase;

  beforeAll(async () => {
    fresh = await freshDatabase();
  });
  afterAll(async () => {
    await fresh?.drop();
  });

  it('schema_outdated: migrate: false on an empty database, and nothing is created', async () => {
    await expectOrdoError(
      () => createOrdo({ databaseUrl: fresh.url, migrate: false }),
      'schema_outdated',
      'is at migration 0',
      `needs ${loadMigrations().at(-1)!.version}`,
      /migrate/,
    );
    const { rows } = await fresh.pool().query("SELECT to_regnamespace('ordo') AS ns");
    expect(rows[0].ns).toBeNull();
  });

  it('schema_outdated names a custom schema', async () => {
    await expectOrdoError(
      () => createOrdo({ databaseUrl: fresh.url, schema: 'tenant_x', migrate: false }),
      'schema_outdated',
      '"tenant_x"',
    );
  });

  it('schema_too_new: a migration newer than this version knows', async () => {
    const first = await createOrdo({ databaseUrl: fresh.url });
    await first.close();
    await fresh.pool().query("INSERT INTO ordo.migrations (version, name) VALUES (9999, 'future')");
    await expectOrdoError(
      () => createOrdo({ databaseUrl: fresh.url }),
      'schema_too_new',
      '9999',
      /upgrade ordo/,
    );
    await expectOrdoError(
      () => createOrdo({ databaseUrl: fresh.url, migrate: false }),
      'schema_too_new',
      '9999',
    );
  });
});

describe('database_unavailable', () => {
  it('nothing listens on the port', async () => {
    await expectOrdoError(
      () => createOrdo({ databaseUrl: 'postgres://postgres@127.0.0.1:1/postgres' }),
      'database_unavailable',
      /ECONNREFUSED|127\.0\.0\.1:1/,
    );
  });
});

describe('embedded_failed', () => {
  it('a data directory beneath a regular file', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'ordo-errors-'));
    // As root, PostgreSQL runs as `postgres`, which must enter the folder: only the file is in the way.
    await chmod(dir, 0o755);
    try {
      const file = join(dir, 'not-a-directory');
      await writeFile(file, 'just a file\n');
      const dataDir = join(file, 'pg');
      await expectOrdoError(
        () => createOrdo({ embedded: { dataDir } }),
        'embedded_failed',
        dataDir,
        'could not be initialised',
      );
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

// unsupported_server: ordo refuses PostgreSQL older than 13, but every server these tests
// run on (the DATABASE_URL one and the embedded PostgreSQL 18) is newer, and faking
// server_version_num would mean mocking the database. It is not reachable here.
//
// unauthorized, forbidden, not_found, payload_too_large and unsupported_media_type belong to
// the HTTP server (test/server.int.test.ts reaches them); nothing in the library API raises them.
// The outbox's codes are reached by test/outbox*.int.test.ts (on a PostgreSQL of their own), the
// throttles' by test/throttles*.int.test.ts, serialization_failure (a REPEATABLE READ commit
// numbering rows at commit) by test/attach.int.test.ts, prepared_statement_missing (prepare:
// true through a pooler in transaction mode) by test/pgbouncer.int.test.ts.
const UNREACHABLE: OrdoErrorCode[] = [
  'unsupported_server',
  'unauthorized',
  'forbidden',
  'not_found',
  'payload_too_large',
  'unsupported_media_type',
  // Answered by Node's HTTP parser through the server: test/server-hostile.int.test.ts.
  'request_timeout',
  'headers_too_large',
  'subscription_not_found',
  'subscription_conflict',
  'subscription_busy',
  'receipt_expired',
  'handler_failed',
  'throttle_not_found',
  'throttle_exists',
  'permit_not_found',
  'permit_expired',
  'throttled',
  'serialization_failure',
  'prepared_statement_missing',
];

describe('coverage of ERROR_CODES', () => {
  it('every reachable code was raised by a test above', () => {
    const expected = (Object.keys(ERROR_CODES) as OrdoErrorCode[]).filter((c) => !UNREACHABLE.includes(c));
    expect([...reached].sort()).toEqual(expected.sort());
  });
});
