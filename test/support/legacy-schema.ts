// The schema as ordo left it before its SQL was split into a baseline and function files: the
// 42 migrations of main at 8080e8c, kept in test/fixtures/migrations-8080e8c/, applied as that
// version applied them. Upgrade tests build an old database with it, fill it, and hand it to
// today's migrate().
import { readdirSync, readFileSync } from 'node:fs';
import type pg from 'pg';
import { quoteIdent } from '../../src/db/migrations.js';
import { toOrdoError } from '../../src/errors.js';

const DIR = new URL('../fixtures/migrations-8080e8c/', import.meta.url);

const legacy = readdirSync(DIR)
  .map((file) => /^(\d{4})_([a-z0-9_]+)\.sql$/.exec(file))
  .filter((m): m is RegExpExecArray => m !== null)
  .map((m) => ({ version: Number(m[1]), name: m[2]!, sql: readFileSync(new URL(m[0], DIR), 'utf8') }))
  .sort((a, b) => a.version - b.version);

/** The last migration of 8080e8c: the version today's baseline stands for. */
export const LEGACY_NEWEST = legacy.at(-1)!.version;

/**
 * Brings `schema` to migration `upTo` (the newest of 8080e8c by default) with 8080e8c's
 * migrations, from wherever it stands: in one transaction, under the advisory lock that
 * version took, failing as it failed.
 */
export async function migrateLegacy(pool: pg.Pool, schema: string, upTo = LEGACY_NEWEST): Promise<void> {
  const s = quoteIdent(schema);
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    await client.query(`SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, [`ordo.migrate:${schema}`]);
    await client.query(`CREATE SCHEMA IF NOT EXISTS ${s}`);
    await client.query(
      `CREATE TABLE IF NOT EXISTS ${s}.migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
    );
    const { rows } = await client.query(`SELECT coalesce(max(version), 0) AS v FROM ${s}.migrations`);
    for (const m of legacy) {
      if (m.version <= rows[0].v || m.version > upTo) continue;
      await client.query(m.sql.replaceAll('{{schema}}', s).replaceAll('{{schema_name}}', schema));
      await client.query(`INSERT INTO ${s}.migrations (version, name) VALUES ($1, $2)`, [m.version, m.name]);
    }
    await client.query('COMMIT');
  } catch (e) {
    await client.query('ROLLBACK').catch(() => undefined);
    throw toOrdoError(e);
  } finally {
    client.release();
  }
}
