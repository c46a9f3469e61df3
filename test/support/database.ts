import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { inject } from 'vitest';
import { hearClientErrors } from '../../src/db/clients.js';
import { createOrdo, type Ordo } from '../../src/index.js';

export const baseUrl = (): string => inject('databaseUrl');

export interface TestDatabase {
  name: string;
  url: string;
  /** A pool on this database, ended by drop(). */
  pool(max?: number): pg.Pool;
  drop(): Promise<void>;
}

/** A database of its own for one test file, so no file sees another's leftovers. */
export async function freshDatabase(prefix = 'ordo_t'): Promise<TestDatabase> {
  const name = `${prefix}_${randomBytes(5).toString('hex')}`;
  await admin((c) => c.query(`CREATE DATABASE ${name}`));
  const url = new URL(baseUrl());
  url.pathname = `/${name}`;
  const pools: pg.Pool[] = [];
  return {
    name,
    url: url.toString(),
    pool(max = 10) {
      const p = new pg.Pool({ connectionString: url.toString(), max });
      p.on('error', () => undefined);
      hearClientErrors(p);
      pools.push(p);
      return p;
    },
    async drop() {
      await Promise.all(pools.map((p) => p.end().catch(() => undefined)));
      await admin((c) => c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`));
    },
  };
}

async function admin<T>(fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: baseUrl() });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

export interface OrdoDatabase {
  db: TestDatabase;
  ordo: Ordo;
  /** A pool of its own on the database, for what the test does around ordo. */
  sql: pg.Pool;
  /** The quoted schema holding ordo's tables and SQL functions. */
  S: string;
  /** Closes ordo and drops the database. */
  close(): Promise<void>;
}

/** A database of its own with ordo on it: what most test files start from. */
export async function ordoDatabase(
  options: { poolSize?: number; sqlPoolSize?: number } = {},
): Promise<OrdoDatabase> {
  const db = await freshDatabase();
  // A database whose file never got an ordo (a migration that fails) is dropped all the same.
  const ordo = await createOrdo({ databaseUrl: db.url, poolSize: options.poolSize }).catch(async (e) => {
    await db.drop().catch(() => undefined);
    throw e;
  });
  return {
    db,
    ordo,
    sql: db.pool(options.sqlPoolSize ?? 4),
    S: `"${ordo.schema}"`,
    async close() {
      try {
        await ordo.close();
      } finally {
        await db.drop();
      }
    },
  };
}
