import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import type pg from 'pg';
import { OrdoError, toOrdoError } from '../errors.js';

/**
 * ordo's schema comes from two kinds of SQL file (sql/README.md):
 * - migrations (sql/migrations/NNNN_name.sql): tables, indexes, types and data moves, applied once
 *   each, in order, recorded in the schema's `migrations` table;
 * - functions (sql/functions/<group>/<name>.sql): every SQL function, current, one file per name,
 *   applied whenever the file's text differs from what the schema's `installed_functions` table
 *   records for it.
 * Both are applied in one transaction under an advisory lock, migrations first: a function's
 * signature may name a table's row type. A migration that needs a function before it runs (a
 * CHECK, a view or a trigger that calls one) names it in a `--! needs: name, name` line.
 */
export interface Migration {
  version: number;
  name: string;
  sql: string;
  /** The function files applied before this migration runs (by name). */
  needs: string[];
}

export interface FunctionFile {
  /** The file's path under sql/functions/, without `.sql`: `gapless/take_value`. */
  file: string;
  sql: string;
  checksum: string;
}

const SQL_DIR = new URL('../../sql/', import.meta.url);
const MIGRATION_FILE = /^(\d{4})_([a-z0-9_]+)\.sql$/;
const FUNCTION_FILE = /^[a-z0-9_]+\.sql$/;
/**
 * The first migration: the schema of the migrations made before the first release, squashed.
 * A database at an earlier version was made by a development build no release can upgrade.
 */
export const BASELINE = 42;
/** How long a starting process waits for another one's migration (or for DDL locks). */
const LOCK_TIMEOUT = '60s';
const MIN_SERVER_VERSION = 130000;
/** Recorded with each function applied: an older ordo never replaces a newer one's functions. */
export const ORDO_VERSION: string = JSON.parse(
  readFileSync(new URL('../../package.json', import.meta.url), 'utf8'),
).version;

let migrations: Migration[] | undefined;
let functions: FunctionFile[] | undefined;

/** The migrations shipped with this version of ordo, in order. */
export function loadMigrations(): Migration[] {
  const dir = new URL('migrations/', SQL_DIR);
  migrations ??= readdirSync(dir)
    .map((file) => MIGRATION_FILE.exec(file))
    .filter((m): m is RegExpExecArray => m !== null)
    .map((m) => {
      const sql = readFileSync(new URL(m[0], dir), 'utf8');
      const needs = [...sql.matchAll(/^--! needs:(.*)$/gm)].flatMap((n) =>
        n[1]!.split(',').map((name) => name.trim()),
      );
      return { version: Number(m[1]), name: m[2]!, sql, needs };
    })
    .sort((a, b) => a.version - b.version);
  return migrations;
}

/** The function files shipped with this version of ordo, by path. */
export function loadFunctions(): FunctionFile[] {
  const dir = new URL('functions/', SQL_DIR);
  functions ??= readdirSync(dir, { withFileTypes: true })
    .filter((group) => group.isDirectory())
    .flatMap((group) =>
      readdirSync(new URL(`${group.name}/`, dir))
        .filter((file) => FUNCTION_FILE.test(file))
        .map((file) => {
          const sql = readFileSync(new URL(`${group.name}/${file}`, dir), 'utf8');
          return {
            file: `${group.name}/${file.slice(0, -'.sql'.length)}`,
            sql,
            checksum: createHash('sha256').update(sql).digest('hex'),
          };
        }),
    )
    .sort((a, b) => a.file.localeCompare(b.file));
  return functions;
}

export function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

export interface MigrateResult {
  /** The migrations applied, by version. */
  applied: number[];
  /** The function files applied, by path. */
  functions: string[];
  version: number;
}

/** What a schema holds: its migration, and the checksum and ordo version of each function file. */
interface SchemaState {
  version: number;
  installed: Map<string, { checksum: string; ordoVersion: string }>;
}

/**
 * Brings `schema` up to this version of ordo: its migrations, then its functions. Safe when many
 * processes start at once: the work happens in one transaction under a transaction-scoped
 * advisory lock, so exactly one process applies each file and the others find it done.
 */
export async function migrate(pool: pg.Pool, schema: string, apply = true): Promise<MigrateResult> {
  const client = await pool.connect().catch((e: unknown) => {
    throw toOrdoError(e);
  });
  try {
    await checkServer(client);
    const seen = await readState(client, schema);
    checkVersion(seen.version, schema);
    if (!outdated(seen)) return { applied: [], functions: [], version: seen.version };
    if (!apply) {
      throw new OrdoError(
        'schema_outdated',
        seen.version < newest()
          ? `The ordo schema "${schema}" is at migration ${seen.version} but this version of ordo needs ${newest()}; run \`ordo migrate\` or start with migrate: true`
          : `The SQL functions of the ordo schema "${schema}" are not those of this version of ordo (${ORDO_VERSION}); run \`ordo migrate\` or start with migrate: true`,
      );
    }
    const s = quoteIdent(schema);
    await client.query('BEGIN');
    try {
      await client.query(`SET LOCAL lock_timeout = '${LOCK_TIMEOUT}'`);
      // A function's body is checked when it first runs: files are applied in path order, and a
      // SQL function may call one that a later file defines.
      await client.query('SET LOCAL check_function_bodies = off');
      await client.query('SELECT pg_advisory_xact_lock(hashtextextended($1, 0))', [`ordo.migrate:${schema}`]);
      await client.query(`CREATE SCHEMA IF NOT EXISTS ${s}`);
      await client.query(
        `CREATE TABLE IF NOT EXISTS ${s}.migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
      );
      await client.query(
        `CREATE TABLE IF NOT EXISTS ${s}.installed_functions (file text PRIMARY KEY, checksum text NOT NULL, ordo_version text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
      );
      const state = await readState(client, schema);
      checkVersion(state.version, schema);
      const run = (sql: string) =>
        // {{schema}}: the quoted identifier; {{schema_name}}: the bare name, for texts such as
        // NOTIFY channels (a validated identifier, so it cannot break out of a literal).
        client.query(sql.replaceAll('{{schema}}', s).replaceAll('{{schema_name}}', schema));
      const appliedFunctions: string[] = [];
      const applyFunction = async (f: FunctionFile) => {
        if (!functionOutdated(state, f)) return;
        await run(f.sql);
        await client.query(
          `INSERT INTO ${s}.installed_functions (file, checksum, ordo_version) VALUES ($1, $2, $3)
           ON CONFLICT (file) DO UPDATE SET checksum = EXCLUDED.checksum, ordo_version = EXCLUDED.ordo_version, applied_at = now()`,
          [f.file, f.checksum, ORDO_VERSION],
        );
        state.installed.set(f.file, { checksum: f.checksum, ordoVersion: ORDO_VERSION });
        appliedFunctions.push(f.file);
      };
      const applied: number[] = [];
      for (const m of loadMigrations()) {
        if (m.version <= state.version) continue;
        for (const name of m.needs) await applyFunction(functionNamed(name));
        await run(m.sql);
        await client.query(`INSERT INTO ${s}.migrations (version, name) VALUES ($1, $2)`, [
          m.version,
          m.name,
        ]);
        applied.push(m.version);
      }
      if (!newerFunctions(state)) {
        for (const f of loadFunctions()) await applyFunction(f);
        // A file no longer shipped was dropped by a migration, its function with it.
        await client.query(`DELETE FROM ${s}.installed_functions WHERE file <> ALL($1::text[])`, [
          loadFunctions().map((f) => f.file),
        ]);
      }
      await client.query('COMMIT');
      return { applied, functions: appliedFunctions, version: Math.max(state.version, newest()) };
    } catch (e) {
      await client.query('ROLLBACK').catch(() => undefined);
      throw e;
    }
  } catch (e) {
    throw toOrdoError(e);
  } finally {
    client.release();
  }
}

function newest(): number {
  return loadMigrations().at(-1)?.version ?? 0;
}

function functionNamed(name: string): FunctionFile {
  const f = loadFunctions().find((x) => x.file.endsWith(`/${name}`));
  if (!f)
    throw new Error(`a migration needs the function ${name}, which no file under sql/functions/ defines`);
  return f;
}

function outdated(state: SchemaState): boolean {
  return (
    state.version < newest() ||
    (!newerFunctions(state) && loadFunctions().some((f) => functionOutdated(state, f)))
  );
}

function functionOutdated(state: SchemaState, f: FunctionFile): boolean {
  return state.installed.get(f.file)?.checksum !== f.checksum;
}

/**
 * Whether a newer ordo applied the schema's functions. Its processes and this one's share the
 * migration (a newer migration is refused), so its functions serve this version too; applying
 * this version's would take back its fixes at every start of an older process.
 */
function newerFunctions(state: SchemaState): boolean {
  return [...state.installed.values()].some((i) => compareVersions(i.ordoVersion, ORDO_VERSION) > 0);
}

/** Orders `major.minor.patch` versions; a pre-release or build suffix is ignored. */
export function compareVersions(a: string, b: string): number {
  const parts = (v: string) =>
    v
      .split(/[-+]/)[0]!
      .split('.')
      .map((n) => Number(n) || 0);
  const [x, y] = [parts(a), parts(b)];
  for (let i = 0; i < Math.max(x.length, y.length); i++) {
    const d = (x[i] ?? 0) - (y[i] ?? 0);
    if (d !== 0) return Math.sign(d);
  }
  return 0;
}

async function checkServer(client: pg.PoolClient): Promise<void> {
  const { rows } = await client.query("SELECT current_setting('server_version_num')::int AS v");
  const version = rows[0].v as number;
  if (version < MIN_SERVER_VERSION) {
    throw new OrdoError(
      'unsupported_server',
      `ordo needs PostgreSQL 13 or newer (it uses xid8 and pg_snapshot functions); this server is ${Math.floor(version / 10000)}`,
    );
  }
}

async function readState(client: pg.PoolClient, schema: string): Promise<SchemaState> {
  const s = quoteIdent(schema);
  const { rows } = await client.query(
    'SELECT to_regclass($1) IS NOT NULL AS migrations, to_regclass($2) IS NOT NULL AS functions',
    [`${s}.migrations`, `${s}.installed_functions`],
  );
  const state: SchemaState = { version: 0, installed: new Map() };
  if (rows[0].migrations) {
    const res = await client.query(`SELECT coalesce(max(version), 0) AS v FROM ${s}.migrations`);
    state.version = res.rows[0].v as number;
  }
  if (rows[0].functions) {
    const res = await client.query(`SELECT file, checksum, ordo_version FROM ${s}.installed_functions`);
    for (const r of res.rows)
      state.installed.set(r.file, { checksum: r.checksum, ordoVersion: r.ordo_version });
  }
  return state;
}

function checkVersion(current: number, schema: string): void {
  const latest = newest();
  if (current > latest) {
    throw new OrdoError(
      'schema_too_new',
      `The ordo schema "${schema}" is at migration ${current}, newer than this version of ordo knows (${latest}); upgrade ordo before using this database`,
    );
  }
  if (current > 0 && current < BASELINE) {
    throw new OrdoError(
      'schema_outdated',
      `The ordo schema "${schema}" is at migration ${current}, made by a development build of ordo before its first release; this version upgrades from migration ${BASELINE} on. Recreate the schema, or bring it to migration ${BASELINE} with ordo at commit 8080e8c first`,
    );
  }
}
