// The README and the guides are right in every example: this file reads README.md and every
// docs/*.md when it runs, takes what each shows (its SQL blocks and their results, the SQL
// functions it lists "From SQL", the results its TypeScript and curl samples show, the limits it
// states, its links) and checks each against a fresh database of its own, in the document's
// order. ORDO_README names another copy of the README, ORDO_DOCS another folder of guides (to try
// a fix).
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { maxHeaderSize } from 'node:http';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { runInNewContext } from 'node:vm';
import type { FastifyInstance } from 'fastify';
import type pg from 'pg';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  createOrdo,
  ERROR_CODES,
  MAX_APPEND,
  MAX_COUNT,
  type Ordo,
  OrdoError,
  type Subscription,
} from '../src/index.js';
import { MAX_RENDERED_LENGTH, MAX_FORMAT_LENGTH } from '../src/sequences/format.js';
import { buildServer } from '../src/server/app.js';
import { parseTokens } from '../src/server/auth.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import {
  type Block,
  defineCalls,
  fencedBlocks,
  headingAnchors,
  jsValue,
  markdownLinks,
  type ShownCall,
  type SqlFunction,
  sqlFunctions,
  type SqlStatement,
  sqlStatements,
  sqlValue,
  shownCalls,
  splitTopLevel,
  tableAfter,
} from './support/readme.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const README = process.env.ORDO_README ?? join(ROOT, 'README.md');
const DOCS = process.env.ORDO_DOCS ?? join(ROOT, 'docs');

/** A document this file checks: the README or a guide. */
interface Doc {
  /** As the repository names it: `README.md`, `docs/gapless.md`. */
  name: string;
  path: string;
  text: string;
  blocks: Block[];
  /** A year in a shown text stands for this year, in the time zone of the document's first sequence. */
  withYear(text: string): string;
}

function load(path: string, name: string): Doc {
  const text = readFileSync(path, 'utf8');
  const timeZone = /timeZone["']?:\s*["']([^"']+)/.exec(text)?.[1] ?? 'UTC';
  const year = new Intl.DateTimeFormat('en', { timeZone, year: 'numeric' }).format(new Date());
  return {
    name,
    path,
    text,
    blocks: fencedBlocks(text),
    withYear: (shown) => shown.replace(/'[^']*'|"[^"]*"/g, (quoted) => quoted.replace(/\b20\d\d\b/g, year)),
  };
}

const readme = load(README, 'README.md');
const guides = readdirSync(DOCS)
  .filter((file) => file.endsWith('.md'))
  .sort()
  .map((file) => load(join(DOCS, file), `docs/${file}`));
const documents = [readme, ...guides];

/** A database of its own, with an ordo on it and, for the curl samples, a server on another schema. */
interface Context {
  db: TestDatabase;
  ordo: Ordo;
  sql: pg.Pool;
  /** The curl examples define `invoice` too: their own client and schema, so each sample starts at 1. */
  httpOrdo: Ordo;
  app: FastifyInstance;
}

/** A context made before the tests of the describe block that calls this, and closed after them. */
function context(): Context {
  const ctx = {} as Context;
  beforeAll(async () => {
    ctx.db = await freshDatabase();
    ctx.ordo = await createOrdo({ databaseUrl: ctx.db.url });
    ctx.httpOrdo = await createOrdo({ databaseUrl: ctx.db.url, schema: 'readme_http' });
    ctx.app = await buildServer(ctx.httpOrdo);
    ctx.sql = ctx.db.pool(2);
  });
  afterAll(async () => {
    await ctx.app?.close();
    await ctx.httpOrdo?.close();
    await ctx.ordo?.close();
    await ctx.db?.drop();
  });
  return ctx;
}

interface Check {
  line: number;
  title: string;
  run: () => Promise<void>;
}

/** Every example a document shows, in its order. */
function exampleChecks(doc: Doc, ctx: Context): Check[] {
  const checks: Check[] = [];
  for (const block of doc.blocks) {
    if (block.lang === 'ts') {
      for (const d of defineCalls(block)) {
        checks.push({
          line: d.line,
          title: `ordo.${d.api}.define(${JSON.stringify(d.options)})`,
          run: async () => void (await ctx.ordo[d.api].define(d.options as any)),
        });
      }
      for (const call of shownCalls(block)) {
        // A call at an explicit `at` shows the year it names; others show this year's.
        const shown = jsValue(/\bat:/.test(call.expr) ? call.shown : doc.withYear(call.shown));
        if (shown)
          checks.push({
            line: call.line,
            title: `${call.expr} → ${call.shown}`,
            run: () => runShown(ctx, call, shown.value),
          });
      }
    }
    if (block.lang === 'sql') {
      for (const s of sqlStatements(block)) {
        checks.push({
          line: s.line,
          title: `${s.sql}${s.shown ? ` -- ${s.shown}` : ''}`,
          run: () => runSql(ctx, doc, s),
        });
      }
    }
    if (block.lang === 'sh' && block.code.includes('curl ')) {
      checks.push({
        line: block.line,
        title: 'the curl example (HTTP)',
        run: () => runCurl(ctx, doc, block),
      });
    }
  }
  for (const f of sqlFunctions(doc.text)) {
    checks.push({
      line: f.line,
      title: `${f.text}${f.result ? ` → ${f.result}` : ''}`,
      run: () => checkFunction(ctx, f),
    });
  }
  return checks.sort((a, b) => a.line - b.line);
}

/** A TypeScript call whose result the document shows, run on `ordo` (in a transaction when it uses `tx`). */
async function runShown(ctx: Context, call: ShownCall, expected: unknown): Promise<void> {
  const { ordo } = ctx;
  const run = (tx?: unknown) => runInNewContext(call.expr, { ordo, tx }) as Promise<unknown>;
  const actual = /\btx\b/.test(call.expr) ? await ordo.transaction((tx) => run(tx)) : await run();
  expect(actual).toEqual(expected);
}

/** A SQL statement and the result its comment shows; a table with a DEFAULT must take a row of defaults. */
async function runSql(ctx: Context, doc: Doc, statement: SqlStatement): Promise<void> {
  const result = await ctx.sql.query(statement.sql);
  if (statement.shown !== undefined) {
    expect(result.rows, 'one row of one column').toHaveLength(1);
    expect(result.fields).toHaveLength(1);
    const value = result.rows[0][result.fields[0]!.name];
    expect(value === null ? null : String(value)).toBe(sqlValue(doc.withYear(statement.shown)));
  }
  const table = /^CREATE TABLE (\w+)[\s\S]*\bDEFAULT\b/i.exec(statement.sql)?.[1];
  if (table) {
    await ctx.sql.query(`INSERT INTO ${table} DEFAULT VALUES`).catch((e: Error) => {
      throw new Error(
        `INSERT INTO ${table} DEFAULT VALUES (the ${doc.name} column default) fails: ${e.message}`,
      );
    });
  }
}

/**
 * Each `curl -X METHOD localhost:7070/path -H 'name: value' -d '…'` of a block, and the `# {…}`
 * answer shown after it.
 */
async function runCurl(ctx: Context, doc: Doc, block: Block): Promise<void> {
  const lines = block.code.replace(/\\\n/g, ' ').split('\n');
  let ran = 0;
  for (const [i, line] of lines.entries()) {
    if (!line.startsWith('curl ')) continue;
    const method = /-X (\w+)/.exec(line)?.[1] ?? 'GET';
    const url = /(?:localhost|127\.0\.0\.1):7070(\/\S*)/.exec(line)![1]!;
    const body = /-d '([^']*)'/.exec(line)?.[1];
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    for (const [, name, value] of line.matchAll(/-H '([^:']+):\s*([^']*)'/g))
      headers[name!.toLowerCase()] = value!;
    const reply = await ctx.app.inject({
      method: method as 'GET',
      url,
      headers,
      ...(body === undefined ? {} : { payload: body }),
    });
    expect(reply.statusCode, `${method} ${url}: ${reply.body}`).toBeLessThan(300);
    const shown = /^# (\{.*\}|\[.*\])$/.exec(lines[i + 1] ?? '')?.[1];
    if (shown !== undefined) expect(reply.json()).toEqual(JSON.parse(doc.withYear(shown)));
    ran++;
  }
  expect(ran).toBeGreaterThan(0);
}

interface FunctionInfo {
  /** Argument types as PostgreSQL prints them (`text`, `jsonb`, `text[]`). */
  types: string[];
  defaults: number;
  /** `bigint`, or `TABLE(a type, …)`. */
  result: string;
}

async function functionInfo(sql: pg.Pool, name: string): Promise<FunctionInfo[]> {
  const { rows } = await sql.query(
    `SELECT array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a (t, i)
                   ORDER BY i) AS types,
            p.pronargdefaults AS defaults, pg_get_function_result(p.oid) AS result
       FROM pg_proc p WHERE p.pronamespace = 'ordo'::regnamespace AND p.proname = $1`,
    [name],
  );
  return rows;
}

/** The column names of `TABLE(a bigint, "b" text)`; undefined for a single type. */
function resultColumns(result: string): string[] | undefined {
  const table = /^TABLE\((.*)\)$/.exec(result)?.[1];
  return table === undefined
    ? undefined
    : splitTopLevel(table).map((c) => c.split(' ')[0]!.replaceAll('"', ''));
}

const LITERAL = /^(?:'(?:[^']|'')*'|-?\d+(?:\.\d+)?|NULL|true|false)$/i;

/**
 * A SQL function as a document lists it: it exists in the schema; its arguments are as many as
 * it takes (those marked `default` have one, `x[]` is an array, `x jsonb` has that type); its
 * result is the type or the columns shown after →; an example with literal arguments runs.
 */
async function checkFunction(ctx: Context, f: SqlFunction): Promise<void> {
  const overloads = await functionInfo(ctx.sql, f.name);
  expect(overloads.length, `ordo.${f.name} exists`).toBeGreaterThan(0);
  const args = f.args ?? [];
  const fn = f.args
    ? overloads.find((o) => args.length >= o.types.length - o.defaults && args.length <= o.types.length)
    : overloads[0];
  expect(fn, `ordo.${f.name} takes ${args.length} arguments`).toBeDefined();
  const example = f.args !== undefined && args.every((a) => LITERAL.test(a));
  if (!example) {
    args.forEach((arg, i) => {
      const type = /^\w+(?:\[\])?\s+(?!default\b)(\w+)/i.exec(arg)?.[1];
      if (type) expect(fn!.types[i], `${f.name}: ${arg}`).toBe(type);
      if (arg.includes('[]')) expect(fn!.types[i], `${f.name}: ${arg}`).toMatch(/\[\]$/);
      if (/\bdefault\b/i.test(arg))
        expect(i, `${f.name}: ${arg} has a default`).toBeGreaterThanOrEqual(fn!.types.length - fn!.defaults);
    });
  }
  const columns = f.result && /^\(.*\)$/.test(f.result) ? splitTopLevel(f.result.slice(1, -1)) : undefined;
  if (columns) expect(resultColumns(fn!.result), `the columns of ordo.${f.name}`).toEqual(columns);
  else if (f.result) expect(fn!.result, `what ordo.${f.name} returns`).toBe(f.result);
  if (example) {
    const result = await ctx.sql.query(/^SELECT /i.test(f.text) ? f.text : `SELECT * FROM ordo.${f.text}`);
    if (columns) expect(result.fields.map((c) => c.name)).toEqual(columns);
  }
}

/** The syntax errors TypeScript finds in a block (types are not checked: samples use your names). */
function syntaxErrors(block: Block): string[] {
  const { diagnostics = [] } = ts.transpileModule(block.code, {
    reportDiagnostics: true,
    compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
  });
  return diagnostics.map((d) => {
    const line = d.file && d.start !== undefined ? d.file.getLineAndCharacterOfPosition(d.start).line : 0;
    return `line ${block.line + line}: ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`;
  });
}

describe('the README and the guides', () => {
  it('find the examples (SQL blocks, "From SQL" functions, shown results, curl)', () => {
    const blocks = documents.flatMap((doc) => doc.blocks);
    const sqlBlocks = blocks.filter((b) => b.lang === 'sql');
    expect(sqlBlocks.length).toBeGreaterThan(0);
    expect(sqlBlocks.flatMap(sqlStatements).some((s) => s.shown !== undefined)).toBe(true);
    expect(documents.flatMap((doc) => sqlFunctions(doc.text)).map((f) => f.name)).toEqual(
      expect.arrayContaining(['append', 'try_acquire', 'nextval']),
    );
    const titles = blocks.flatMap((block) => [
      ...shownCalls(block).map((c) => c.expr),
      ...(block.lang === 'sh' && block.code.includes('curl ') ? ['curl'] : []),
    ]);
    expect(titles.some((t) => t.startsWith('ordo.query('))).toBe(true);
    expect(titles.some((t) => t === 'curl')).toBe(true);
  });

  it('the README links every guide', () => {
    const linked = markdownLinks(readme.text).map((link) => resolve(dirname(readme.path), link.file ?? ''));
    expect(guides.map((g) => g.path).filter((path) => !linked.includes(path))).toEqual([]);
  });
});

for (const doc of documents) {
  describe(`${doc.name}, example by example in its order`, () => {
    const ctx = context();

    it('its TypeScript blocks parse', () => {
      expect(doc.blocks.filter((b) => b.lang === 'ts').flatMap(syntaxErrors)).toEqual([]);
    });

    for (const check of exampleChecks(doc, ctx)) it(`line ${check.line}: ${check.title}`, check.run);

    it('every #link names a heading', () => {
      const anchors = headingAnchors(doc.text);
      const links = markdownLinks(doc.text).filter((link) => link.file === undefined);
      expect(
        links.filter((link) => !anchors.includes(link.anchor!)).map((link) => `#${link.anchor}`),
      ).toEqual([]);
    });

    it('every link to a file of the repository names one that exists, and a heading in it', () => {
      const links = markdownLinks(doc.text).filter((link) => link.file !== undefined);
      if (doc === readme) expect(links.length).toBeGreaterThan(0);
      const missing = links
        .map((link) => ({ ...link, path: resolve(dirname(doc.path), link.file!) }))
        .filter(({ path, anchor }) => {
          if (!existsSync(path)) return true;
          if (anchor === undefined) return false;
          return !path.endsWith('.md') || !headingAnchors(readFileSync(path, 'utf8')).includes(anchor);
        })
        .map(({ file, anchor }) => `${file}${anchor === undefined ? '' : `#${anchor}`}`);
      expect(missing).toEqual([]);
    });
  });
}

/** Whether an ordo call succeeds; false when it is refused with invalid_argument. */
async function accepted(call: () => Promise<unknown>): Promise<boolean> {
  try {
    await call();
    return true;
  } catch (e) {
    if (e instanceof OrdoError && e.code === 'invalid_argument') return false;
    throw e;
  }
}

/** [below min, min, max, above max] accepted? (Nothing is below 0: these are counts and lengths.) */
async function bounds(
  min: number,
  max: number,
  accepts: (n: number) => Promise<boolean>,
): Promise<boolean[]> {
  const below = min > 0 && (await accepts(min - 1));
  return [below, await accepts(min), await accepts(max), await accepts(max + 1)];
}
const EXACTLY = [false, true, true, false];

/** Every document that matches `pattern`, with its match; fails, naming the pattern, when none does. */
function statements(pattern: RegExp): { doc: Doc; match: RegExpExecArray }[] {
  const found = documents.flatMap((doc) => {
    const match = pattern.exec(doc.text);
    return match ? [{ doc, match }] : [];
  });
  expect(found.length, `the README or a guide states ${pattern}`).toBeGreaterThan(0);
  return found;
}

/**
 * The numbers a phrase states (`10,000` is 10000); fails, naming the phrase, when no document
 * states it, or when two state different numbers.
 */
function stated(pattern: RegExp): number[] {
  const all = statements(pattern).map(({ doc, match }) => ({
    doc: doc.name,
    numbers: match.slice(1).map((n) => Number(n?.replaceAll(',', ''))),
  }));
  for (const other of all.slice(1))
    expect(other.numbers, `${other.doc} and ${all[0]!.doc} state ${pattern}`).toEqual(all[0]!.numbers);
  return all[0]!.numbers;
}

describe('the limits the README and the guides state are the code’s', () => {
  const ctx = context();

  it('tokens: their length', () => {
    const [min, max] = stated(/Tokens:[^.]*?token[^.]*?(\d+)\s*(?:–|to)\s*(\d+) characters/);
    const accepts = async (n: number) => accepted(async () => parseTokens(`${'a'.repeat(n)}:read`));
    return expect(bounds(min!, max!, accepts)).resolves.toEqual(EXACTLY);
  });

  it('HTTP next: count', async () => {
    const { app, httpOrdo } = ctx;
    const [min, max] = stated(/`\{ scope\?, count\? \((\d+)–(\d+)\)/);
    await httpOrdo.sequences.define({ name: 'limits_count' });
    const accepts = async (count: number) =>
      (await app.inject({ method: 'POST', url: '/v1/sequences/limits_count/next', payload: { count } }))
        .statusCode === 200;
    expect(await bounds(min!, max!, accepts)).toEqual(EXACTLY);
    const [minKey, maxKey] = stated(/header `Idempotency-Key` \((\d+)–(\d+) characters/);
    const key = async (n: number) =>
      (
        await app.inject({
          method: 'POST',
          url: '/v1/sequences/limits_count/next',
          headers: { 'idempotency-key': 'k'.repeat(n) },
          payload: {},
        })
      ).statusCode === 200;
    expect(await bounds(minKey!, maxKey!, key)).toEqual(EXACTLY);
  });

  it('HTTP: the largest headers', () => {
    const [kib] = stated(/headers at most (\d+) KiB/);
    // buildServer leaves Node's limit as it is.
    expect(kib! * 1024).toBe(maxHeaderSize);
  });

  it('HTTP: the largest body', async () => {
    const [kib] = stated(/a body over (\d+) KiB/);
    const status = async (bytes: number) => {
      const payload = `{"scope":"${'x'.repeat(bytes - 12)}"}`;
      expect(payload).toHaveLength(bytes);
      const url = '/v1/sequences/limits_count/next';
      return (
        await ctx.app.inject({
          method: 'POST',
          url,
          payload,
          headers: { 'content-type': 'application/json' },
        })
      ).statusCode;
    };
    expect(await status(kib! * 1024)).not.toBe(413);
    expect(await status(kib! * 1024 + 1)).toBe(413);
  });

  it('nextMany: count', async () => {
    const { ordo } = ctx;
    const [max] = stated(/`count` consecutive values \(at most ([\d,]+)\)/);
    expect(max).toBe(MAX_COUNT);
    await ordo.sequences.define({ name: 'limits_many' });
    expect(await bounds(1, max!, (n) => accepted(() => ordo.sequences.nextMany('limits_many', n)))).toEqual(
      EXACTLY,
    );
  });

  it('append: messages at once, and type', async () => {
    const { ordo } = ctx;
    const [max] = stated(/one statement \(at most ([\d,]+) messages\)/);
    expect(max).toBe(MAX_APPEND);
    const [min, maxType] = stated(/`type` (\d+)–(\d+) characters/);
    const accepts = (n: number) =>
      accepted(() => ordo.outbox.append('limits', { type: 'x'.repeat(n), data: 1 }));
    expect(await bounds(min!, maxType!, accepts)).toEqual(EXACTLY);
  });

  it('topic and subscription names', async () => {
    const { ordo } = ctx;
    const topic = (name: string) => accepted(() => ordo.outbox.append(name, { type: 't', data: 1 }));
    const found = statements(/Topic and subscription names are (\d+)–(\d+) letters, digits or `([^`]+)`(.*)/);
    for (const { match: m } of found) {
      expect(await bounds(Number(m[1]), Number(m[2]), (n) => topic('t'.repeat(n)))).toEqual(EXACTLY);
      // Any of the characters listed may start a name, unless the text says "not starting with `…`".
      const notFirst = /^, not start(?:ing)? with `([^`]+)`/.exec(m[4]!)?.[1]?.split(' ') ?? [];
      for (const c of m[3]!.split(' ')) {
        const refused = !(await topic(`${c}x`));
        expect(refused, `a topic starting with '${c}' is ${refused ? 'refused' : 'accepted'}`).toBe(
          notFirst.includes(c),
        );
      }
    }
  });

  it('subscribe: batchSize', async () => {
    const { ordo } = ctx;
    const [min, max] = stated(/`batchSize` \(([\d,]+)–([\d,]+), default/);
    const subs: Subscription[] = [];
    const accepts = (n: number) =>
      accepted(async () => {
        subs.push(
          await ordo.outbox.subscribe({
            name: `limits_${n}`,
            topic: 'limits',
            batchSize: n,
            handler: async () => {},
          }),
        );
      });
    expect(await bounds(min!, max!, accepts)).toEqual(EXACTLY);
    await Promise.all(subs.map((s) => s.stop()));
  });

  it('sequences: names, scopes and batch', async () => {
    const { ordo } = ctx;
    const [maxName] = stated(/Names are identifiers \([^)]*?, at most (\d+) characters\)/);
    const name = (n: number) => accepted(() => ordo.sequences.define({ name: 'n'.repeat(n) }));
    expect(await bounds(1, maxName!, name)).toEqual(EXACTLY);

    const [maxScope] = stated(/Scopes are any text up to (\d+) characters/);
    await ordo.sequences.define({ name: 'limits_scope' });
    const scope = (n: number) => accepted(() => ordo.nextval('limits_scope', { scope: 's'.repeat(n) }));
    expect(await bounds(0, maxScope!, scope)).toEqual(EXACTLY);

    const [min, max, byDefault] = stated(
      /`batch` \(values reserved at once, ([\d,]+) to ([\d,]+), default ([\d,]+)\)/,
    );
    const batch = (n: number) =>
      accepted(() => ordo.sequences.define({ name: `limits_batch_${n}`, kind: 'batched', batch: n }));
    expect(await bounds(min!, max!, batch)).toEqual(EXACTLY);
    expect((await ordo.sequences.define({ name: 'limits_batch', kind: 'batched' })).batch).toBe(byDefault);
  });

  it('formats: their length, the width W of {n:W}, and the longest text rendered', async () => {
    const { ordo } = ctx;
    const paragraphs = documents.flatMap((doc) =>
      doc.text.split('\n').filter((l) => l.startsWith('Format tokens:')),
    );
    expect(
      paragraphs.length,
      'the README or a guide has a paragraph starting "Format tokens:"',
    ).toBeGreaterThan(0);
    for (const [p, paragraph] of paragraphs.entries()) {
      const numbers = (pattern: RegExp) =>
        pattern
          .exec(paragraph)
          ?.slice(1)
          .map((n) => Number(n.replaceAll(',', '')));
      const [min, max] = numbers(/format is (\d+) to (\d+) characters/) ?? [];
      const [minW, maxW] = numbers(/W from (\d+) to (\d+)/) ?? [];
      const [rendered] = numbers(/render at most ([\d,]+) characters/) ?? [];
      expect(
        { length: [min, max], width: [minW, maxW], rendered },
        'the "Format tokens:" paragraph states "a format is 1 to N characters", "W from 1 to N" and "may render at most N characters"',
      ).toEqual({ length: [1, MAX_FORMAT_LENGTH], width: [1, 20], rendered: MAX_RENDERED_LENGTH });
      const width = (w: number) =>
        accepted(() => ordo.sequences.define({ name: `limits_width_${p}_${w}`, format: `{n:${w}}` }));
      expect(await bounds(minW!, maxW!, width)).toEqual(EXACTLY);
    }
  });
});

describe('the tables and lists of the README and the guides', () => {
  const ctx = context();

  it('the Errors table has every error code, with its HTTP status', () => {
    const tables = documents
      .map((doc) => ({ doc, rows: tableAfter(doc.text, '## Errors') }))
      .filter(({ rows }) => rows.length > 0);
    expect(tables.length, 'the README or a guide has an Errors table').toBeGreaterThan(0);
    for (const { doc, rows } of tables) {
      const listed = new Map<string, string>();
      for (const [codes, statuses] of rows) {
        const names = [...codes!.matchAll(/`(\w+)`/g)].map((m) => m[1]!);
        const numbers = statuses!.split('/').map((s) => s.trim());
        names.forEach((code, i) => listed.set(code, numbers[i] ?? numbers[0]!));
      }
      const actual = Object.keys(ERROR_CODES).map((code) => [code, listed.get(code) ?? 'missing']);
      // '—': not an answer over HTTP.
      const expected = Object.entries(ERROR_CODES).map(([code, status]) => [
        code,
        listed.get(code) === '—' ? '—' : String(status),
      ]);
      expect(actual, doc.name).toEqual(expected);
      expect(
        [...listed.keys()].filter((code) => !(code in ERROR_CODES)),
        `codes ${doc.name} lists that do not exist`,
      ).toEqual([]);
    }
  });

  it('the SQLSTATEs listed are those the SQL functions raise', async () => {
    const { rows } = await ctx.sql.query(
      `SELECT DISTINCT m[1] AS code FROM pg_proc p, regexp_matches(p.prosrc, '''(OX\\d{3})''', 'g') AS m
        WHERE p.pronamespace = 'ordo'::regnamespace ORDER BY 1`,
    );
    for (const { doc, match } of statements(/Errors from SQL carry SQLSTATE ([^\n]*)/)) {
      const listed = [...match[1]!.matchAll(/`(OX\d{3})`/g)].map((m) => m[1]).sort();
      expect(listed, doc.name).toEqual(rows.map((r) => r.code));
    }
  });

  it('every duration written "as SurrealDB writes them" is accepted by DEFINE SEQUENCE … TIMEOUT', async () => {
    for (const [n, { doc, match }] of statements(
      /Durations as SurrealDB writes them: ([^\n]*?)\. /,
    ).entries()) {
      const durations = [...match[1]!.matchAll(/`([^`]+)`/g)].map((m) => m[1]!);
      expect(durations.length, doc.name).toBeGreaterThan(0);
      const results = await ctx.ordo.query(
        durations.map((d, i) => `DEFINE SEQUENCE dur_${n}_${i} BATCH 10 TIMEOUT ${d}`).join(';'),
      );
      expect(results, doc.name).toEqual(durations.map(() => ({ result: null })));
    }
  });

  it('the HTTP 400 messages shown are the ones sent', async () => {
    const requests = [
      { method: 'PUT', url: '/v1/sequences/limits_400', payload: { timezone: 'UTC' } },
      { method: 'PUT', url: '/v1/sequences/limits_400', payload: { reset: 'yearly' } },
      {
        method: 'POST',
        url: '/v1/topics/t/messages',
        payload: { messages: [{ type: 'a', data: 1 }, { data: 1 }] },
      },
    ] as const;
    for (const { doc, match } of statements(/A 400 names the property and what is allowed: ([^\n]*?)\. /)) {
      const shown = [...match[1]!.matchAll(/`([^`]+)`/g)].map((m) => m[1]!);
      expect(shown, `${doc.name}: three examples, in the order of the requests above`).toHaveLength(
        requests.length,
      );
      for (const [i, request] of requests.entries()) {
        const reply = await ctx.app.inject(request);
        expect(reply.statusCode).toBe(400);
        const pattern = shown[i]!.split('…').map((part) => part.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'));
        expect(reply.json().message).toMatch(new RegExp(`^${pattern.join('.*')}$`));
      }
    }
  });
});
