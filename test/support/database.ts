import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { inject } from 'vitest';

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
