import { readdirSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type pg from 'pg';
import { OrdoError, toOrdoError } from '../errors.js';

export interface Migration {
  version: number;
  name: string;
  sql: string;
}

const MIGRATIONS_DIR = fileURLToPath(new URL('../../sql/migrations/', import.meta.url));
const FILE = /^(\d{4})_([a-z0-9_]+)\.sql$/;
/** How long a starting process waits for another one's migration (or for DDL locks). */
const LOCK_TIMEOUT = '60s';
const MIN_SERVER_VERSION = 130000;

let cached: Migration[] | undefined;

/** The migrations shipped with this version of ordo, in order. */
export function loadMigrations(): Migration[] {
  cached ??= readdirSync(MIGRATIONS_DIR)
    .map((file) => FILE.exec(file))
    .filter((m): m is RegExpExecArray => m !== null)
    .map((m) => ({
      version: Number(m[1]),
      name: m[2]!,
      sql: readFileSync(`${MIGRATIONS_DIR}${m[0]}`, 'utf8'),
    }))
    .sort((a, b) => a.version - b.version);
  return cached;
}

export function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

export interface MigrateResult {
  applied: number[];
  version: number;
}

/**
 * Brings `schema` up to the newest migration. Safe when many processes start at once: the
 * work happens in one transaction under a transaction-scoped advisory lock, so exactly one
 * process applies each migration and the others find it done. `upTo` stops after that
 * migration: the schema an older ordo left, which the upgrade tests start from.
 */
export async function migrate(
  pool: pg.Pool,
  schema: string,
  apply = true,
  upTo?: number,
): Promise<MigrateResult> {
  const migrations = loadMigrations();
  const newest = migrations.at(-1)?.version ?? 0;
  const latest = Math.min(upTo ?? newest, newest);
  const client = await pool.connect().catch((e: unknown) => {
    throw toOrdoError(e);
  });
  try {
    await checkServer(client);
    const current = await currentVersion(client, schema);
    refuseNewer(current, newest, schema);
    if (current >= latest) return { applied: [], version: current };
    if (!apply) {
      throw new OrdoError(
        'schema_outdated',
        `The ordo schema "${schema}" is at migration ${current} but this version of ordo needs ${latest}; run \`ordo migrate\` or start with migrate: true`,
      );
    }
    const s = quoteIdent(schema);
    await client.query('BEGIN');
    try {
      await client.query(`SET LOCAL lock_timeout = '${LOCK_TIMEOUT}'`);
      await client.query('SELECT pg_advisory_xact_lock(hashtextextended($1, 0))', [`ordo.migrate:${schema}`]);
      await client.query(`CREATE SCHEMA IF NOT EXISTS ${s}`);
      await client.query(
        `CREATE TABLE IF NOT EXISTS ${s}.migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
      );
      const locked = await currentVersion(client, schema);
      refuseNewer(locked, newest, schema);
      const applied: number[] = [];
      for (const m of migrations) {
        if (m.version <= locked || m.version > latest) continue;
        // {{schema}}: the quoted identifier; {{schema_name}}: the bare name, for texts such as
        // NOTIFY channels (a validated identifier, so it cannot break out of a literal).
        await client.query(m.sql.replaceAll('{{schema}}', s).replaceAll('{{schema_name}}', schema));
        await client.query(`INSERT INTO ${s}.migrations (version, name) VALUES ($1, $2)`, [
          m.version,
          m.name,
        ]);
        applied.push(m.version);
      }
      await client.query('COMMIT');
      return { applied, version: Math.max(locked, latest) };
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

async function currentVersion(client: pg.PoolClient, schema: string): Promise<number> {
  const { rows } = await client.query('SELECT to_regclass($1) IS NOT NULL AS present', [
    `${quoteIdent(schema)}.migrations`,
  ]);
  if (!rows[0].present) return 0;
  const res = await client.query(
    `SELECT coalesce(max(version), 0) AS v FROM ${quoteIdent(schema)}.migrations`,
  );
  return res.rows[0].v as number;
}

function refuseNewer(current: number, latest: number, schema: string): void {
  if (current > latest) {
    throw new OrdoError(
      'schema_too_new',
      `The ordo schema "${schema}" is at migration ${current}, newer than this version of ordo knows (${latest}); upgrade ordo before using this database`,
    );
  }
}
