import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadMigrations, migrate } from '../src/db/migrations.js';
import { createOrdo, type Ordo, OrdoError } from '../src/index.js';
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

  it('0031 refuses a definition whose year starts in another month without a yearly reset, and applies once it is fixed', async () => {
    const old = await freshDatabase();
    try {
      const pool = old.pool(2);
      await migrate(pool, 'ordo', true, 30);
      await pool.query(`SELECT * FROM ordo.define_sequence('fiscal', 'gapless', 1, 1, 1, 9007199254740991, false, 1,
                          NULL, 'year', 'UTC', NULL, 'create', 4)`);
      // Nothing ordo writes: a hand-made change of the reset alone.
      await pool.query(`UPDATE ordo.sequences SET reset = 'month' WHERE name = 'fiscal'`);
      const refused = await createOrdo({ databaseUrl: old.url, poolSize: 1 }).then(
        async (o) => (await o.close(), undefined),
        (e: unknown) => e,
      );
      expect(refused).toBeInstanceOf(OrdoError);
      expect((refused as OrdoError).message).toContain('fiscal (reset month, year_start 4)');
      const version = await pool.query('SELECT max(version) AS v FROM ordo.migrations');
      expect(version.rows[0].v).toBe(30);

      await pool.query(`UPDATE ordo.sequences SET year_start = 1 WHERE name = 'fiscal'`);
      const ordo = await createOrdo({ databaseUrl: old.url, poolSize: 1 });
      try {
        expect(await ordo.sequences.next('fiscal', { at: '2026-05-20T00:00:00Z' })).toMatchObject({
          value: 1,
          period: '2026-05-01',
        });
      } finally {
        await ordo.close();
      }
    } finally {
      await old.drop();
    }
  });
});
