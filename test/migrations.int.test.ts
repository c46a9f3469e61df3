import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  BASELINE,
  compareVersions,
  loadFunctions,
  loadMigrations,
  migrate,
  ORDO_VERSION,
} from '../src/db/migrations.js';
import { createOrdo, type Ordo, OrdoError } from '../src/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { LEGACY_NEWEST, migrateLegacy } from './support/legacy-schema.js';

const NEWEST = loadMigrations().at(-1)!.version;

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

  it('0031 (8080e8c) refuses a definition whose year starts in another month without a yearly reset, and applies once it is fixed', async () => {
    const old = await freshDatabase();
    try {
      const pool = old.pool(2);
      await migrateLegacy(pool, 'ordo', 30);
      await pool.query(`SELECT * FROM ordo.define_sequence('fiscal', 'gapless', 1, 1, 1, 9007199254740991, false, 1,
                          NULL, 'year', 'UTC', NULL, 'create', 4)`);
      // Nothing ordo writes: a hand-made change of the reset alone.
      await pool.query(`UPDATE ordo.sequences SET reset = 'month' WHERE name = 'fiscal'`);
      const refused = await migrateLegacy(pool, 'ordo').then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(refused).toBeInstanceOf(OrdoError);
      expect((refused as OrdoError).message).toContain('fiscal (reset month, year_start 4)');
      const version = await pool.query('SELECT max(version) AS v FROM ordo.migrations');
      expect(version.rows[0].v).toBe(30);

      await pool.query(`UPDATE ordo.sequences SET year_start = 1 WHERE name = 'fiscal'`);
      await migrateLegacy(pool, 'ordo');
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

  it('20 clients starting at once on a database of 8080e8c apply its functions exactly once, in one transaction', async () => {
    const old = await freshDatabase();
    try {
      await migrateLegacy(old.pool(1), 'ordo');
      expect(LEGACY_NEWEST).toBe(BASELINE);
      const clients = await Promise.all(
        Array.from({ length: 20 }, () => createOrdo({ databaseUrl: old.url, poolSize: 2 })),
      );
      try {
        const raw = old.pool();
        const { rows } = await raw.query(
          'SELECT count(*)::int AS n, count(DISTINCT xmin::text)::int AS transactions FROM ordo.installed_functions',
        );
        expect(rows).toEqual([{ n: loadFunctions().length, transactions: 1 }]);
        const versions = await raw.query('SELECT count(*)::int AS n FROM ordo.migrations');
        // The 42 of 8080e8c, and those after the baseline.
        expect(versions.rows[0].n).toBe(
          BASELINE + loadMigrations().filter((m) => m.version > BASELINE).length,
        );
        await clients[0]!.sequences.define({ name: 'shared' });
        const values = await Promise.all(clients.map((c) => c.nextval('shared')));
        expect(values.sort((a, b) => a - b)).toEqual(Array.from({ length: 20 }, (_, i) => i + 1));
      } finally {
        await Promise.all(clients.map((c) => c.close()));
      }
    } finally {
      await old.drop();
    }
  });

  it('a schema a development build left before the baseline is refused, and nothing is written', async () => {
    const old = await freshDatabase();
    try {
      const pool = old.pool(1);
      await migrateLegacy(pool, 'ordo', 30);
      for (const apply of [true, false]) {
        const refused = await migrate(pool, 'ordo', apply).then(
          () => undefined,
          (e: unknown) => e,
        );
        expect(refused).toBeInstanceOf(OrdoError);
        expect(refused).toMatchObject({ code: 'schema_outdated' });
        expect((refused as OrdoError).message).toContain(`at migration 30`);
        expect((refused as OrdoError).message).toContain(`from migration ${BASELINE} on`);
      }
      const { rows } = await pool.query(
        "SELECT max(version) AS v, to_regclass('ordo.installed_functions') AS functions FROM ordo.migrations",
      );
      expect(rows).toEqual([{ v: 30, functions: null }]);
    } finally {
      await old.drop();
    }
  });

  it('a function file whose text changed is applied again, alone; migrate: false refuses until it is', async () => {
    const pool = db.pool(1);
    await migrate(pool, 'ordo');
    const [file] = loadFunctions().filter((f) => f.file === 'gapless/take_value');
    expect(file).toBeDefined();
    // What a database whose take_value() is another version's looks like.
    await pool.query(`UPDATE ordo.installed_functions SET checksum = 'older' WHERE file = $1`, [file!.file]);
    await pool.query(`CREATE OR REPLACE FUNCTION ordo.take_value(seq_name text, seq_scope text DEFAULT '', at timestamptz DEFAULT NULL)
                      RETURNS text[] LANGUAGE sql AS $$ SELECT ARRAY['-1'] $$`);
    const refused = await migrate(pool, 'ordo', false).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(refused).toMatchObject({ code: 'schema_outdated' });
    expect((refused as OrdoError).message).toContain('SQL functions');
    expect(await migrate(pool, 'ordo')).toEqual({ applied: [], functions: [file!.file], version: NEWEST });
    const ordo = await createOrdo({ databaseUrl: db.url, poolSize: 1 });
    try {
      await ordo.sequences.define({ name: 'after_change', ifNotExists: true });
      const value = await ordo.transaction((tx) => ordo.sequences.next('after_change', { tx }));
      expect(value.value).toBe(1);
    } finally {
      await ordo.close();
    }
    expect(await migrate(pool, 'ordo')).toEqual({ applied: [], functions: [], version: NEWEST });
  });

  it('functions a newer ordo applied are not replaced by this one, which runs on them', async () => {
    const other = await freshDatabase();
    try {
      const pool = other.pool(1);
      await migrate(pool, 'ordo');
      const newer = ORDO_VERSION.replace(/^(\d+)/, (major) => String(Number(major) + 1));
      expect(compareVersions(newer, ORDO_VERSION)).toBe(1);
      await pool.query(
        `UPDATE ordo.installed_functions SET ordo_version = $1, checksum = 'newer' WHERE file = 'gapless/take'`,
        [newer],
      );
      expect(await migrate(pool, 'ordo', false)).toEqual({ applied: [], functions: [], version: NEWEST });
      expect(await migrate(pool, 'ordo')).toEqual({ applied: [], functions: [], version: NEWEST });
      const { rows } = await pool.query(
        `SELECT checksum, ordo_version FROM ordo.installed_functions WHERE file = 'gapless/take'`,
      );
      expect(rows).toEqual([{ checksum: 'newer', ordo_version: newer }]);
    } finally {
      await other.drop();
    }
  });

  it('compareVersions orders major.minor.patch numerically and ignores a pre-release suffix', () => {
    expect(compareVersions('0.10.0', '0.9.9')).toBe(1);
    expect(compareVersions('1.0.0', '1.0.0-beta.1')).toBe(0);
    expect(compareVersions('0.1.0', '0.1.1')).toBe(-1);
  });
});
