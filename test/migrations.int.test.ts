import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadMigrations } from '../src/db/migrations.js';
import { createOrdo, type Ordo } from '../src/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';

let db: TestDatabase;

beforeAll(async () => {
  db = await freshDatabase();
});
afterAll(async () => {
  await db?.drop();
});

describe('migrations', () => {
  it('20 clients starting at once on an empty database migrate exactly once', async () => {
    const clients = await Promise.all(
      Array.from({ length: 20 }, () => createOrdo({ databaseUrl: db.url, poolSize: 2 })),
    );
    try {
      const raw = db.pool();
      const { rows } = await raw.query(
        'SELECT version, count(*)::int AS n FROM ordo.migrations GROUP BY version ORDER BY version',
      );
      expect(rows).toEqual(loadMigrations().map((m) => ({ version: m.version, n: 1 })));
      const fns = await raw.query(
        "SELECT count(*)::int AS n FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'ordo' AND p.proname = 'take'",
      );
      expect(fns.rows[0].n).toBe(1);
      // Every one of them works.
      await clients[0]!.sequences.define({ name: 'shared' });
      const values = await Promise.all(clients.map((c) => c.nextval('shared')));
      expect(values.sort((a, b) => a - b)).toEqual(Array.from({ length: 20 }, (_, i) => i + 1));
    } finally {
      await Promise.all(clients.map((c) => c.close()));
    }
  });

  it('a custom schema holds its own tables and functions, independent of the default one', async () => {
    const billing = await createOrdo({ databaseUrl: db.url, schema: 'billing' });
    const plain = await createOrdo({ databaseUrl: db.url });
    try {
      await billing.sequences.define({ name: 'same_name', start: 100 });
      await plain.sequences.define({ name: 'same_name', start: 1 });
      expect(await billing.nextval('same_name')).toBe(100);
      expect(await plain.nextval('same_name')).toBe(1);
      const { rows } = await db.pool().query("SELECT billing.nextval('same_name') AS v");
      expect(Number(rows[0].v)).toBe(101);
      expect(billing.schema).toBe('billing');
    } finally {
      await billing.close();
      await plain.close();
    }
  });

  it('migrate: false works on an up-to-date schema', async () => {
    const ordo: Ordo = await createOrdo({ databaseUrl: db.url, migrate: false });
    try {
      expect(Array.isArray(await ordo.sequences.list())).toBe(true);
    } finally {
      await ordo.close();
    }
  });
});
