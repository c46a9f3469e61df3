// The README's examples run as a reader would run them: its SQL blocks and TypeScript blocks, in
// the README's order, as one program on a fresh database (test/readme.int.test.ts checks each
// result they show, one call at a time); and examples/quickstart.ts runs as `npm run example`.
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { runInNewContext } from 'node:vm';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo, type OrdoOptions } from '../src/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { fencedBlocks } from './support/readme.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const README = process.env.ORDO_README ?? join(ROOT, 'README.md');

let db: TestDatabase;
const clients: Ordo[] = [];

beforeAll(async () => {
  db = await freshDatabase();
});
afterAll(async () => {
  await Promise.all(clients.map((c) => c.close()));
  await db?.drop();
});

/**
 * The README's `sql` and `ts` blocks as one JavaScript program: the TypeScript as written, without
 * its `import` lines (the names are given to the program), each SQL block sent where it stands.
 */
function readmeProgram(markdown: string): string {
  const source = fencedBlocks(markdown)
    .filter((b) => b.lang === 'ts' || b.lang === 'sql')
    .map((b) =>
      b.lang === 'sql'
        ? `await runSql(${JSON.stringify(b.code)});`
        : b.code.replace(/^import .* from 'ordo';$/gm, ''),
    )
    .join('\n');
  const { outputText } = ts.transpileModule(source, {
    compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
  });
  return `(async () => {\n${outputText}\n})()`;
}

describe("the README's examples, one after another as written", () => {
  it('run on a fresh database and write what they say', async () => {
    const sql = db.pool(2);
    const program = readmeProgram(readFileSync(README, 'utf8'));
    expect(program).toContain('createOrdo(');
    await runInNewContext(program, {
      createOrdo: async (options: OrdoOptions) => {
        const ordo = await createOrdo(options);
        clients.push(ordo);
        return ordo;
      },
      process: { env: { DATABASE_URL: db.url } },
      runSql: (text: string) => sql.query(text),
      console,
    });
    expect(clients).toHaveLength(1);
    const count = async (table: string) =>
      Number((await sql.query(`SELECT count(*) FROM ${table}`)).rows[0].count);
    expect({ invoices: await count('invoices'), orders: await count('orders') }).toEqual({
      invoices: 1,
      orders: 1,
    });
    expect((await sql.query('SELECT count(*) FROM ordo.messages')).rows[0].count).toBe('1');
  });
});

describe('examples/quickstart.ts (npm run example)', () => {
  it('runs to its end and prints a rollback given back, a burst, and a new year', async () => {
    const own = await freshDatabase();
    const { ORDO_DATABASE_URL: _url, ORDO_SCHEMA: _schema, ...env } = process.env;
    const r = spawnSync(
      process.execPath,
      [
        '--import',
        pathToFileURL(join(ROOT, 'node_modules/tsx/dist/loader.mjs')).href,
        join(ROOT, 'examples/quickstart.ts'),
      ],
      {
        cwd: ROOT,
        env: { ...env, DATABASE_URL: own.url },
        encoding: 'utf8',
        timeout: 60_000,
      },
    );
    await own.drop();
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout.split('\n').filter(Boolean)).toEqual([
      expect.stringMatching(/^rolled back (INV-\d{4}-000001), then issued \1: the same number, no gap$/),
      expect.stringMatching(/^globex: INV-\d{4}-000001, INV-\d{4}-000002, .*INV-\d{4}-000005$/),
      'first invoice of 2031 for acme: INV-2031-000001 (period 2031-01-01)',
    ]);
  });
});
