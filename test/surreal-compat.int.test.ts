// ordo's statements side by side with SurrealDB itself: the embedded SurrealDB of the dev
// dependencies (surrealdb + @surrealdb/node, in this process) runs the same text, and ordo must
// answer it the same way through each of its three surfaces — ordo.query(), `ordo sql --json`
// and POST /v1/query. The cases follow what SurrealDB's own sequence tests check (the language
// tests for sequence::nextval, DEFINE / ALTER / REMOVE SEQUENCE and parameters, and the Rust
// tests of concurrent nextval and nextval after a restart), written anew; every expected answer
// is the one the embedded SurrealDB gives when the test runs. Where ordo differs on purpose, the
// case says so and checks ordo's answer alone.
import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { promisify } from 'node:util';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { FastifyInstance } from 'fastify';
import type { Surreal } from 'surrealdb';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo } from '../src/index.js';
import { buildServer } from '../src/server/app.js';
import { freshDatabase, type TestDatabase } from './support/database.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const execFileP = promisify(execFile);

/** Runs argv[2]'s text on a SurrealDB stored in the folder argv[1], and prints its answers. */
const SURREAL_ON_DISK = `
  import { Surreal } from 'surrealdb';
  import { createNodeEngines } from '@surrealdb/node';
  const [dir, text] = process.argv.slice(1);
  const s = new Surreal({ engines: createNodeEngines() });
  await s.connect('surrealkv://' + dir);
  await s.use({ namespace: 'compat', database: 'restart' });
  const answers = (await s.query(text).responses()).map((r) =>
    r.success ? { result: typeof r.result === 'bigint' ? Number(r.result) : r.result ?? null } : { error: r.error.message });
  await s.close();
  process.stdout.write(JSON.stringify(answers));
  process.exit(0);
`;

/** One statement's answer, without ordo's error code (SurrealDB has none). */
type Outcome = { result: unknown } | { error: string };
/** Every statement's answer, or the whole text refused because it does not parse. */
type Answer = Outcome[] | { refused: string };

interface Surface {
  name: string;
  /** Runs a text; `codes` receives ordo's error code of each failed statement, in order. */
  run(text: string, codes?: string[]): Promise<Answer>;
  /** Removes every sequence, so that each case starts from nothing. */
  reset(): Promise<void>;
}

let db: TestDatabase;
let surreal: Surreal;
let caseNumber = 0;
let surrealDatabase: string | undefined;
let library: Ordo;
let cliCleaner: Ordo;
let httpOrdo: Ordo;
let app: FastifyInstance;
let surfaces: Surface[];
const opened: Ordo[] = [];

beforeAll(async () => {
  db = await freshDatabase();
  const [{ Surreal }, { createNodeEngines }] = await Promise.all([
    import('surrealdb'),
    import('@surrealdb/node'),
  ]);
  surreal = new Surreal({ engines: createNodeEngines() });
  await surreal.connect('mem://');
  library = await createOrdo({ databaseUrl: db.url, schema: 'compat_lib' });
  cliCleaner = await createOrdo({ databaseUrl: db.url, schema: 'compat_cli' });
  httpOrdo = await createOrdo({ databaseUrl: db.url, schema: 'compat_http' });
  app = await buildServer(httpOrdo);
  surfaces = [
    {
      name: 'ordo.query',
      run: (text, codes) => viaLibrary(library, text, codes),
      reset: () => clear(library),
    },
    {
      name: 'ordo sql --json',
      run: (text, codes) => viaCli('compat_cli', text, codes),
      reset: () => clear(cliCleaner),
    },
    { name: 'POST /v1/query', run: (text, codes) => viaHttp(app, text, codes), reset: () => clear(httpOrdo) },
  ];
}, 60_000);

afterAll(async () => {
  await app?.close();
  await Promise.all([library, cliCleaner, httpOrdo, ...opened].map((o) => o?.close().catch(() => undefined)));
  await surreal?.close();
  await db?.drop();
});

// ─── the three surfaces, and SurrealDB ─────────────────────────────────────────────────────

function withoutCodes(results: { result?: unknown; error?: string; code?: string }[], codes?: string[]) {
  return results.map((r): Outcome => {
    if (r.error === undefined) return { result: r.result };
    codes?.push(r.code!);
    return { error: r.error };
  });
}

async function viaLibrary(ordo: Ordo, text: string, codes?: string[]): Promise<Answer> {
  try {
    return withoutCodes((await ordo.query(text)) as never, codes);
  } catch (e) {
    codes?.push((e as { code: string }).code);
    return { refused: (e as Error).message };
  }
}

async function viaCli(schema: string, text: string, codes?: string[]): Promise<Answer> {
  const { code, out } = await cli(['sql', '--json', '--schema', schema, text]);
  const printed = JSON.parse(out) as unknown;
  if (Array.isArray(printed)) {
    expect(code).toBe(printed.some((r: { error?: string }) => r.error !== undefined) ? 1 : 0);
    return withoutCodes(printed, codes);
  }
  // Text that does not parse: one { error, code } object, printed as JSON too.
  expect(code).toBe(1);
  const refusal = printed as { error: string; code: string };
  codes?.push(refusal.code);
  return { refused: refusal.error };
}

async function viaHttp(server: FastifyInstance, text: string, codes?: string[]): Promise<Answer> {
  const reply = await server.inject({ method: 'POST', url: '/v1/query', payload: { query: text } });
  if (reply.statusCode === 400) {
    const body = reply.json() as { code: string; message: string };
    codes?.push(body.code);
    return { refused: body.message };
  }
  expect(reply.statusCode).toBe(200);
  return withoutCodes(reply.json(), codes);
}

function cli(args: string[]): Promise<{ code: number; out: string; err: string }> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      ['--import', 'tsx', 'test/support/ordo-cli.ts', ...args],
      { cwd: ROOT, env: { ...process.env, DATABASE_URL: db.url, ORDO_DATABASE_URL: '' }, maxBuffer: 1 << 26 },
      (error, out, err) => resolve({ code: error ? Number(error.code ?? 1) : 0, out, err }),
    );
  });
}

async function clear(ordo: Ordo): Promise<void> {
  for (const d of await ordo.sequences.list()) await ordo.sequences.remove(d.name, { ifExists: true });
}

/** SurrealDB's values as JSON gives them: NONE as null, durations as their text. */
function plain(value: unknown): unknown {
  if (value === undefined || value === null) return null;
  if (typeof value === 'bigint') return Number(value);
  if (Array.isArray(value)) return value.map(plain);
  if (typeof value === 'object') {
    const proto = Object.getPrototypeOf(value);
    if (proto === Object.prototype || proto === null) {
      return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, plain(v)]));
    }
    return String(value);
  }
  return value;
}

/** The text on SurrealDB, in a database of its own (one per call unless `database` is given). */
async function onSurreal(text: string, database = `case_${++caseNumber}`): Promise<Answer> {
  // Only when it changes: use() while queries are in flight does not return.
  if (database !== surrealDatabase) {
    await surreal.use({ namespace: 'compat', database });
    surrealDatabase = database;
  }
  try {
    const responses = await surreal.query(text).responses();
    return responses.map((r) =>
      r.success ? { result: plain(r.result) } : { error: (r.error as Error).message },
    );
  } catch (e) {
    return { refused: (e as Error).message };
  }
}

/** Refusals read differently (SurrealDB draws a caret under the text): that both refuse is what counts. */
function comparable(answer: Answer): Answer {
  return Array.isArray(answer) ? answer : { refused: 'the whole text' };
}

/**
 * Runs `text` on SurrealDB and on every surface of ordo (each from no sequences), expects the
 * same answers, and returns SurrealDB's (with ordo's error codes per surface, for the caller).
 */
async function sameAsSurreal(
  text: string,
  database?: string,
): Promise<{ answer: Answer; codes: string[][] }> {
  const answer = await onSurreal(text, database);
  const codes: string[][] = [];
  for (const surface of surfaces) {
    await surface.reset();
    const surfaceCodes: string[] = [];
    const got = await surface.run(text, surfaceCodes);
    expect(comparable(got), `${surface.name}: ${text}`).toEqual(comparable(answer));
    codes.push(surfaceCodes);
  }
  return { answer, codes };
}

const EMPTY_INFO = {
  accesses: {},
  analyzers: {},
  apis: {},
  buckets: {},
  configs: {},
  functions: {},
  models: {},
  modules: {},
  params: {},
  sequences: {},
  tables: {},
  users: {},
};

// ─── the language tests ────────────────────────────────────────────────────────────────────

describe('as SurrealDB answers its own sequence tests', () => {
  it('sequence::nextval: START, REMOVE, a removed sequence, and TIMEOUT 0s', async () => {
    const { answer, codes } = await sameAsSurreal(`
      DEFINE SEQUENCE ids START 10;
      RETURN sequence::nextval('ids');
      sequence::nextval('ids');
      REMOVE SEQUENCE ids;
      RETURN sequence::nextval('ids');
      DEFINE SEQUENCE ids BATCH 10 TIMEOUT 0s;
      -- SurrealDB's test takes this value in CREATE |test:20| CONTENT { sq: sequence::nextval('sq') }
      -- RETURN NONE: ordo has no tables, so RETURN asks for it; the timeout fails it the same way.
      RETURN sequence::nextval('ids');
    `);
    expect(answer).toEqual([
      { result: null },
      { result: 10 },
      { result: 11 },
      { result: null },
      { error: "The sequence 'ids' does not exist" },
      { result: null },
      { error: 'The query was not executed because it exceeded the timeout: 0ns' },
    ]);
    for (const c of codes) expect(c).toEqual(['sequence_not_found', 'timeout']);
  });

  it('DEFINE SEQUENCE: defaults, INFO FOR DB with every section, OVERWRITE to a START below 0, a second DEFINE, STRUCTURE', async () => {
    const { answer, codes } = await sameAsSurreal(`
      DEFINE SEQUENCE first;
      DEFINE SEQUENCE second BATCH 100;
      DEFINE SEQUENCE third TIMEOUT 5s;
      INFO FOR DB;
      DEFINE SEQUENCE OVERWRITE second BATCH 250 START -25;
      DEFINE SEQUENCE second BATCH 150;
      INFO FOR DB;
      INFO FOR DB STRUCTURE;
      RETURN sequence::nextval('second');
    `);
    expect((answer as Outcome[])[6]).toEqual({
      result: {
        ...EMPTY_INFO,
        sequences: {
          first: 'DEFINE SEQUENCE first BATCH 1000 START 0',
          second: 'DEFINE SEQUENCE second BATCH 250 START -25',
          third: 'DEFINE SEQUENCE third BATCH 1000 START 0 TIMEOUT 5s',
        },
      },
    });
    expect((answer as Outcome[])[8]).toEqual({ result: -25 });
    for (const c of codes) expect(c).toEqual(['sequence_exists']);
  });

  it('OVERWRITE of a sequence that handed out nothing takes its START, lower or higher, and keeps it', async () => {
    const { answer } = await sameAsSurreal(`
      DEFINE SEQUENCE s START 10;
      DEFINE SEQUENCE OVERWRITE s START 20;
      DEFINE SEQUENCE OVERWRITE s BATCH 3 START 5;
      (INFO FOR DB).sequences.s;
      RETURN sequence::nextval('s');
      RETURN sequence::nextval('s');
      RETURN sequence::nextval('s');
      RETURN sequence::nextval('s');
    `);
    expect((answer as Outcome[]).slice(3)).toEqual([
      { result: 'DEFINE SEQUENCE s BATCH 3 START 5' },
      { result: 5 },
      { result: 6 },
      { result: 7 },
      { result: 8 },
    ]);
  });

  it('OVERWRITE of a sequence that does not exist defines it; IF NOT EXISTS of a new one too', async () => {
    const { answer, codes } = await sameAsSurreal(`
      DEFINE SEQUENCE OVERWRITE fresh BATCH 5 START 7 TIMEOUT 2s;
      DEFINE SEQUENCE IF NOT EXISTS newer START -3;
      (INFO FOR DB).sequences;
      RETURN sequence::nextval('fresh');
      RETURN sequence::nextval('newer');
      DEFINE SEQUENCE IF NOT EXISTS newer START 100;
      DEFINE SEQUENCE newer;
      RETURN sequence::nextval('newer');
    `);
    expect(answer).toEqual([
      { result: null },
      { result: null },
      {
        result: {
          fresh: 'DEFINE SEQUENCE fresh BATCH 5 START 7 TIMEOUT 2s',
          newer: 'DEFINE SEQUENCE newer BATCH 1000 START -3',
        },
      },
      { result: 7 },
      { result: -3 },
      { result: null },
      { error: "The sequence 'newer' already exists" },
      { result: -2 },
    ]);
    for (const c of codes) expect(c).toEqual(['sequence_exists']);
  });

  it('ALTER SEQUENCE: TIMEOUT d, TIMEOUT NONE, IF EXISTS, a missing sequence, TIMEOUT 0s, no clause', async () => {
    const { answer, codes } = await sameAsSurreal(`
      DEFINE SEQUENCE seq;
      ALTER SEQUENCE seq TIMEOUT 5s;
      INFO FOR DB;
      ALTER SEQUENCE seq TIMEOUT NONE;
      INFO FOR DB;
      ALTER SEQUENCE IF EXISTS nope TIMEOUT 5s;
      ALTER SEQUENCE nope TIMEOUT 5s;
      ALTER SEQUENCE nope;
      ALTER SEQUENCE seq TIMEOUT 0s;
      (INFO FOR DB).sequences;
      ALTER SEQUENCE seq;
      ALTER SEQUENCE IF EXISTS seq TIMEOUT 1m30s;
      (INFO FOR DB).sequences.seq;
      ALTER SEQUENCE \`seq\` TIMEOUT 1500ms;
      (INFO FOR DB STRUCTURE).sequences;
    `);
    expect((answer as Outcome[])[4]).toEqual({
      result: { ...EMPTY_INFO, sequences: { seq: 'DEFINE SEQUENCE seq BATCH 1000 START 0' } },
    });
    expect((answer as Outcome[])[9]).toEqual({
      result: { seq: 'DEFINE SEQUENCE seq BATCH 1000 START 0 TIMEOUT 0ns' },
    });
    for (const c of codes) expect(c).toEqual(['sequence_not_found', 'sequence_not_found']);
  });

  it('REMOVE SEQUENCE: removed, IF EXISTS on a removed one, a missing one, then INFO FOR DB empty', async () => {
    const { answer, codes } = await sameAsSurreal(`
      DEFINE SEQUENCE one;
      DEFINE SEQUENCE two BATCH 100;
      REMOVE SEQUENCE one;
      REMOVE SEQUENCE IF EXISTS one;
      REMOVE SEQUENCE IF EXISTS two;
      REMOVE SEQUENCE two;
      INFO FOR DB;
    `);
    expect((answer as Outcome[]).at(-1)).toEqual({ result: EMPTY_INFO });
    for (const c of codes) expect(c).toEqual(['sequence_not_found']);
  });

  it('parameters: LET values used as the name, BATCH, START and TIMEOUT; (INFO FOR DB).sequences', async () => {
    const { answer } = await sameAsSurreal(`
      LET $name = "counter";
      LET $batch = 100;
      LET $start = 0;
      LET $timeout = 5s;
      DEFINE SEQUENCE $name BATCH $batch START $start TIMEOUT $timeout;
      (INFO FOR DB).sequences;
      RETURN sequence::nextval($name);
      REMOVE SEQUENCE $name;
      (INFO FOR DB).sequences;
    `);
    expect((answer as Outcome[]).slice(5)).toEqual([
      { result: { counter: 'DEFINE SEQUENCE counter BATCH 100 START 0 TIMEOUT 5s' } },
      { result: 0 },
      { result: null },
      { result: {} },
    ]);
  });

  it('names given as strings, and timeouts printed as SurrealDB prints them', async () => {
    await sameAsSurreal(`
      DEFINE SEQUENCE "double" BATCH 5;
      DEFINE SEQUENCE 'single' START 3;
      RETURN sequence::nextval("double");
      RETURN sequence::nextval('single');
      DEFINE SEQUENCE d1 TIMEOUT 1m30s;
      DEFINE SEQUENCE d2 TIMEOUT 1500ms;
      DEFINE SEQUENCE d3 TIMEOUT 7d;
      DEFINE SEQUENCE d4 TIMEOUT 90s;
      DEFINE SEQUENCE d5 TIMEOUT NONE;
      DEFINE SEQUENCE IF NOT EXISTS d1 BATCH 3;
      DEFINE SEQUENCE OVERWRITE d2 TIMEOUT 2h;
      (INFO FOR DB).sequences;
      (INFO FOR DB STRUCTURE).sequences.timeout;
      REMOVE SEQUENCE "double";
      REMOVE SEQUENCE IF EXISTS 'double';
      (INFO FOR DB STRUCTURE).sequences.name;
      RETURN INFO FOR DB;
      (INFO FOR DATABASE).tables;
      (INFO FOR DB).nothing;
    `);
  });

  it("a value a statement cannot use fails that statement alone, with SurrealDB's words; the others run", async () => {
    const { answer, codes } = await sameAsSurreal(`
      DEFINE SEQUENCE a TIMEOUT 5;
      DEFINE SEQUENCE b BATCH 'x';
      DEFINE SEQUENCE c START 1.5;
      DEFINE SEQUENCE d TIMEOUT -5s;
      LET $n = 5;
      DEFINE SEQUENCE $n;
      RETURN sequence::nextval($n);
      RETURN sequence::nextval('no such sequence');
      REMOVE SEQUENCE IF EXISTS 'no such sequence';
      REMOVE SEQUENCE 'no such sequence';
      DEFINE SEQUENCE fine BATCH '10' START 5.0 TIMEOUT '5s';
      DEFINE SEQUENCE IF NOT EXISTS fine BATCH -1;
      DEFINE SEQUENCE fine BATCH -1;
      ALTER SEQUENCE IF EXISTS nope TIMEOUT 5;
      ALTER SEQUENCE nope TIMEOUT 5;
      ALTER SEQUENCE fine TIMEOUT 5;
      RETURN sequence::nextval('fine');
      (INFO FOR DB).sequences;
    `);
    expect(answer).toEqual([
      { error: 'Could not cast into `duration` using input `5`' },
      { error: "Could not cast into `int` using input `'x'`" },
      { error: 'Could not cast into `int` using input `1.5f`' },
      { error: "Cannot negate the value '5s'" },
      { result: null },
      { error: 'Expected `sequence name` but found `5`' },
      { error: 'Incorrect arguments for function sequence::nextval()(). Expect a sequence name' },
      { error: "The sequence 'no such sequence' does not exist" },
      { result: null },
      { error: "The sequence 'no such sequence' does not exist" },
      { result: null },
      { result: null },
      { error: "The sequence 'fine' already exists" },
      { result: null },
      { error: "The sequence 'nope' does not exist" },
      { error: 'Could not cast into `duration` using input `5`' },
      { result: 5 },
      { result: { fine: 'DEFINE SEQUENCE fine BATCH 10 START 5 TIMEOUT 5s' } },
    ]);
    const invalid = 'invalid_argument';
    const missing = 'sequence_not_found';
    for (const c of codes) {
      expect(c).toEqual(
        [invalid, invalid, invalid, invalid, invalid, invalid, missing, missing].concat([
          'sequence_exists',
          missing,
          invalid,
        ]),
      );
    }
  });

  it('a text with a statement that does not parse runs none of it, on both', async () => {
    for (const text of [
      "DEFINE SEQUENCE fine; DEFINE SEQUENCE if; RETURN sequence::nextval('fine');",
      'DEFINE SEQUENCE fine; DEFINE SEQUENCE other TIMEOUT 5x;',
      "DEFINE SEQUENCE fine; RETURN sequence::nextval('fine'); ALTER SEQUENCE fine TIMEOUT 5s DROP;",
      'DEFINE SEQUENCE fine; DEFINE SEQUENCE other BATCH 10 START 5 BATCH 3;',
      "DEFINE SEQUENCE fine; RETURN sequence::nextval('fine'; INFO FOR DB;",
    ]) {
      const database = `refused_${++caseNumber}`;
      const { answer, codes } = await sameAsSurreal(text, database);
      expect(answer).toMatchObject({ refused: expect.stringContaining('Parse error') });
      for (const c of codes) expect(c).toEqual(['invalid_argument']);
      // Nothing ran: neither defined `fine`.
      expect(await onSurreal('(INFO FOR DB).sequences', database)).toEqual([{ result: {} }]);
      for (const surface of surfaces) {
        expect(await surface.run('(INFO FOR DB).sequences'), surface.name).toEqual([{ result: {} }]);
      }
    }
  });
});

// ─── the Rust tests ────────────────────────────────────────────────────────────────────────

/** `count` × `RETURN sequence::nextval('name')`, one statement after another, as one text. */
function nextvals(name: string, count: number): string {
  return Array.from({ length: count }, () => `RETURN sequence::nextval('${name}')`).join(';\n');
}

function values(answer: Answer): number[] {
  if (!Array.isArray(answer)) throw new Error(`refused: ${answer.refused}`);
  return answer.map((o) => {
    if (!('result' in o) || typeof o.result !== 'number')
      throw new Error(`not a value: ${JSON.stringify(o)}`);
    return o.result;
  });
}

function range(from: number, count: number): number[] {
  return Array.from({ length: count }, (_, i) => from + i);
}

const sorted = (list: number[]) => [...list].sort((a, b) => a - b);

describe('as SurrealDB answers its concurrency and restart tests', () => {
  const DEFINITIONS =
    'DEFINE SEQUENCE sq1 START -250; DEFINE SEQUENCE sq2 BATCH 50; DEFINE SEQUENCE sq3 BATCH 10 START 1000;';
  /** Six tasks at once, each taking `count` values one statement at a time: 3 × sq1, 2 × sq2, 1 × sq3. */
  const TASKS = ['sq1', 'sq1', 'sq1', 'sq2', 'sq2', 'sq3'] as const;

  async function concurrently(run: (text: string) => Promise<Answer>, count: number, perText: number) {
    const taken = await Promise.all(
      TASKS.map(async (name) => {
        const got: number[] = [];
        for (let done = 0; done < count; done += perText)
          got.push(...values(await run(nextvals(name, perText))));
        return { name, got };
      }),
    );
    const all = (name: string) => sorted(taken.filter((t) => t.name === name).flatMap((t) => t.got));
    for (const t of taken) expect(new Set(t.got).size).toBe(count);
    return { sq1: all('sq1'), sq2: all('sq2'), sq3: all('sq3') };
  }

  it('concurrent nextval on three sequences: every value once, from START on, without a hole', async () => {
    const database = `concurrent_${++caseNumber}`;
    await onSurreal(DEFINITIONS, database);
    const onSurrealSide = await concurrently((text) => onSurreal(text, database), 1000, 1);
    const expected = { sq1: range(-250, 3000), sq2: range(0, 2000), sq3: range(1000, 1000) };
    expect(onSurrealSide).toEqual(expected);

    // ordo.query: 1000 statements per task, one at a time, as SurrealDB's test runs them.
    await surfaces[0]!.reset();
    await surfaces[0]!.run(DEFINITIONS);
    expect(await concurrently((text) => viaLibrary(library, text), 1000, 1)).toEqual(expected);

    // POST /v1/query: the same, 25 statements per request.
    await surfaces[2]!.reset();
    await surfaces[2]!.run(DEFINITIONS);
    expect(await concurrently((text) => viaHttp(app, text), 1000, 25)).toEqual(expected);
  }, 120_000);

  it('`ordo sql`: one process runs the six tasks interleaved in one text (a process is a node)', async () => {
    const count = 200;
    const statements: string[] = [];
    for (let i = 0; i < count; i++)
      for (const name of TASKS) statements.push(`RETURN sequence::nextval('${name}')`);
    const text = `${DEFINITIONS}\n${statements.join(';\n')}`;
    const { answer } = await sameAsSurreal(text);
    const got = values((answer as Outcome[]).slice(3));
    const of = (name: string) => sorted(got.filter((_, i) => TASKS[i % TASKS.length] === name));
    expect(of('sq1')).toEqual(range(-250, 3 * count));
    expect(of('sq2')).toEqual(range(0, 2 * count));
    expect(of('sq3')).toEqual(range(1000, count));
  }, 60_000);

  it('after a clean restart, nextval goes on where it stopped: 0..999, then 1000..1999', async () => {
    // SurrealDB on disk, closed and opened again: each open in a process of its own, as a
    // surrealkv store cannot be opened a second time by the process that closed it.
    const dir = await mkdtemp(join(tmpdir(), 'ordo-surreal-'));
    try {
      const onDisk = async (text: string): Promise<Answer> => {
        const { stdout } = await execFileP(
          process.execPath,
          ['--input-type=module', '-e', SURREAL_ON_DISK, dir, text],
          { cwd: ROOT, timeout: 60_000 },
        );
        return JSON.parse(stdout) as Answer;
      };
      await onDisk('DEFINE SEQUENCE sq');
      const surrealValues = [
        ...values(await onDisk(nextvals('sq', 1000))),
        ...values(await onDisk(nextvals('sq', 1000))),
      ];
      expect(sorted(surrealValues)).toEqual(range(0, 2000));
    } finally {
      await rm(dir, { recursive: true, force: true });
    }

    // ordo.query: a node, closed, and a new one on the same database.
    const schema = 'compat_restart';
    let node = await createOrdo({ databaseUrl: db.url, schema });
    opened.push(node);
    await node.query('DEFINE SEQUENCE sq');
    const first = values(await viaLibrary(node, nextvals('sq', 1000)));
    await node.close();
    node = await createOrdo({ databaseUrl: db.url, schema });
    opened.push(node);
    const second = values(await viaLibrary(node, nextvals('sq', 1000)));
    expect(first).toEqual(range(0, 1000));
    expect(second).toEqual(range(1000, 1000));

    // `ordo sql`: every run is a node that starts and closes.
    await cli(['sql', '--schema', 'compat_restart_cli', 'DEFINE SEQUENCE sq']);
    const runs: number[] = [];
    for (let i = 0; i < 2; i++)
      runs.push(...values(await viaCli('compat_restart_cli', nextvals('sq', 1000))));
    expect(runs).toEqual(range(0, 2000));

    // POST /v1/query: a server, closed with its client, and another one.
    const server = async () => {
      const o = await createOrdo({ databaseUrl: db.url, schema: 'compat_restart_http' });
      opened.push(o);
      return { o, a: await buildServer(o) };
    };
    let s = await server();
    await viaHttp(s.a, 'DEFINE SEQUENCE sq');
    const http: number[] = [];
    for (let i = 0; i < 2; i++) {
      for (let j = 0; j < 1000; j += 100) http.push(...values(await viaHttp(s.a, nextvals('sq', 100))));
      await s.a.close();
      await s.o.close();
      s = await server();
    }
    await s.a.close();
    expect(http).toEqual(range(0, 2000));
  }, 120_000);
});

// ─── where ordo differs on purpose ─────────────────────────────────────────────────────────

describe('where ordo differs from SurrealDB on purpose', () => {
  it('a restart in the middle of a batch goes on at the next value (SurrealDB 3.0 skips to the next batch)', async () => {
    const schema = 'compat_partial';
    let node = await createOrdo({ databaseUrl: db.url, schema });
    opened.push(node);
    await node.query('DEFINE SEQUENCE part BATCH 10');
    expect(values((await node.query(nextvals('part', 3))) as Answer)).toEqual([0, 1, 2]);
    await node.close();
    node = await createOrdo({ databaseUrl: db.url, schema });
    opened.push(node);
    expect(values((await node.query(nextvals('part', 3))) as Answer)).toEqual([3, 4, 5]);
    await node.close();
  });

  it("values out of ordo's bounds fail their statement alone: BATCH 1 to 1,000,000, START within ±(2^53 − 1), names as identifiers", async () => {
    const text = `
      DEFINE SEQUENCE zero BATCH 0;
      DEFINE SEQUENCE negative BATCH -1;
      DEFINE SEQUENCE huge BATCH 5000000;
      DEFINE SEQUENCE far START 9007199254740992;
      DEFINE SEQUENCE "my seq";
      DEFINE SEQUENCE later START 3;
      RETURN sequence::nextval('later');
      (INFO FOR DB).sequences.later;
    `;
    const rest = [{ result: null }, { result: 3 }, { result: 'DEFINE SEQUENCE later BATCH 1000 START 3' }];
    // SurrealDB takes all but a negative batch (its batch is 0 to 2^32 − 1, its START any 64-bit number).
    expect(await onSurreal(text)).toEqual([
      { result: null },
      {
        error:
          'Invalid query: `-1` is not valid batch size for a sequence definition. A batch size must be within 0..=4294967295',
      },
      { result: null },
      { result: null },
      { result: null },
      ...rest,
    ]);
    for (const surface of surfaces) {
      await surface.reset();
      const codes: string[] = [];
      expect(await surface.run(text, codes), surface.name).toEqual([
        { error: "BATCH must be a whole number from 1 to 1000000, found '0' at 2:34" },
        { error: "BATCH must be a whole number from 1 to 1000000, found '-1' at 3:38" },
        { error: "BATCH must be a whole number from 1 to 1000000, found '5000000' at 4:34" },
        {
          error:
            "START must be a whole number from -9007199254740991 to 9007199254740991, found '9007199254740992' at 5:33",
        },
        {
          error:
            'sequence name must be an identifier: a letter or underscore, then letters, digits or underscores, at most 63 characters (got "my seq") at 6:23',
        },
        ...rest,
      ]);
      expect(codes).toEqual(Array(5).fill('invalid_argument'));
    }
  });

  it('never backwards once values were handed out (SurrealDB issue #7502): OVERWRITE to a lower START continues above them', async () => {
    await library.query('REMOVE SEQUENCE IF EXISTS used');
    const results = await library.query(`
      DEFINE SEQUENCE used BATCH 1 START 1;
      RETURN sequence::nextval('used');
      RETURN sequence::nextval('used');
      DEFINE SEQUENCE OVERWRITE used BATCH 1 START 500;
      RETURN sequence::nextval('used');
      DEFINE SEQUENCE OVERWRITE used BATCH 1 START 1;
      RETURN sequence::nextval('used');
    `);
    const taken = results
      .filter((_, i) => [1, 2, 4, 6].includes(i))
      .map((r) => (r as { result: number }).result);
    // SurrealDB 3.0 answers 1, 2, 3, 4 here: its OVERWRITE … START 500 reaches the running node
    // only after a restart, and then a START 1 would hand out 1 and 2 again. ordo: at once, and never again.
    expect(taken.slice(0, 3)).toEqual([1, 2, 500]);
    expect(taken[3]).toBeGreaterThan(500);
    expect(new Set(taken).size).toBe(4);
    const start = (await library.sequences.get('used'))!.start;
    expect(start).toBeGreaterThan(500);
    expect((await library.query('(INFO FOR DB).sequences.used'))[0]).toEqual({
      result: `DEFINE SEQUENCE used BATCH 1 START ${start}`,
    });
  });

  // A change of kind keeps what was handed out: the new storage (or counters) starts above it,
  // and a later OVERWRITE … START lower, which finds that storage unused, still does not go below.
  describe('never backwards across a change of kind', () => {
    let kinds: Ordo;
    let sql: ReturnType<TestDatabase['pool']>;
    beforeAll(async () => {
      kinds = await createOrdo({ databaseUrl: db.url, schema: 'compat_kinds' });
      opened.push(kinds);
      sql = db.pool(1);
    });
    /** The values a text handed out, in order (its other statements answer null). */
    async function handedOut(text: string): Promise<number[]> {
      const answers = (await kinds.query(text)) as Outcome[];
      for (const a of answers) expect(a).not.toHaveProperty('error');
      return answers.flatMap((a) => ('result' in a && typeof a.result === 'number' ? [a.result] : []));
    }

    it('gapless 1, 2, 3 → batched → OVERWRITE … START 0: 4, 5, 6', async () => {
      const before = await handedOut(`
        DEFINE SEQUENCE g GAPLESS;
        ${nextvals('g', 3)};
        DEFINE SEQUENCE OVERWRITE g BATCH 10;
      `);
      const after = await handedOut(`
        DEFINE SEQUENCE OVERWRITE g BATCH 10 START 0;
        ${nextvals('g', 3)};
      `);
      expect(before).toEqual([1, 2, 3]);
      expect(after).toEqual([4, 5, 6]);
      expect((await kinds.query('(INFO FOR DB).sequences.g'))[0]).toEqual({
        result: 'DEFINE SEQUENCE g BATCH 10 START 4',
      });
    });

    it('batched 0, 1, 2 → gapless → batched, ownership rows collected → OVERWRITE … START 0: above 2', async () => {
      const before = await handedOut(`
        DEFINE SEQUENCE b BATCH 10;
        ${nextvals('b', 3)};
        DEFINE SEQUENCE OVERWRITE b GAPLESS;
        DEFINE SEQUENCE OVERWRITE b BATCH 10;
      `);
      // As maintain() does after a week; uniqueness must not depend on these rows.
      await sql.query(`SELECT compat_kinds.collect_batches('0 seconds')`);
      const after = await handedOut(`
        DEFINE SEQUENCE OVERWRITE b BATCH 10 START 0;
        ${nextvals('b', 3)};
      `);
      expect(before).toEqual([0, 1, 2]);
      expect(Math.min(...after)).toBeGreaterThan(2);
      expect(new Set([...before, ...after]).size).toBe(6);
    });

    it('batched 0, 1, 2 → gapless → gapless START 0: above 2', async () => {
      const before = await handedOut(`
        DEFINE SEQUENCE c BATCH 10;
        ${nextvals('c', 3)};
        DEFINE SEQUENCE OVERWRITE c GAPLESS;
        DEFINE SEQUENCE OVERWRITE c GAPLESS START 0;
      `);
      const after = await handedOut(nextvals('c', 3));
      expect(before).toEqual([0, 1, 2]);
      expect(Math.min(...after)).toBeGreaterThan(2);
      expect(new Set([...before, ...after]).size).toBe(6);
    });
  });
});
