// createOrdo({ prepare: true }) sends ordo's statements on node-postgres as named prepared
// statements: parsed and planned once per connection. They must give what the unnamed ones
// give, through callers' transactions that commit and roll back on many connections, and be
// prepared only where asked and only on node-postgres. (Through a pooler in transaction mode
// they fail with prepared_statement_missing: test/pgbouncer.int.test.ts.)
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo, OrdoError } from '../src/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { duplicates, range } from './support/drawer.js';

let db: TestDatabase;
let prepared: Ordo;
let unnamed: Ordo;

beforeAll(async () => {
  db = await freshDatabase('ordo_prepared');
  prepared = await createOrdo({ databaseUrl: db.url, prepare: true });
  unnamed = await createOrdo({ databaseUrl: db.url });
  await prepared.sequences.define({ name: 'invoice', reset: 'day', format: 'INV-{YYYY}-{n:4}' });
});
afterAll(async () => {
  await prepared?.close();
  await unnamed?.close();
  await db?.drop();
});

/** The names of the statements prepared on the session of `client`. */
async function preparedOn(client: pg.ClientBase): Promise<string[]> {
  const { rows } = await client.query('SELECT name FROM pg_prepared_statements ORDER BY name');
  return rows.map((r) => r.name as string);
}

describe('prepare: true', () => {
  it('8 clients, 30 transactions each on 4 scopes, a quarter rolled back: committed numbers exactly 1..n per scope, each client preparing the take once', async () => {
    const pool = db.pool(8);
    const committed = new Map<string, number[]>();
    const clients = await Promise.all(range(1, 8).map(() => pool.connect()));
    try {
      await Promise.all(
        clients.map(async (client, w) => {
          for (let i = 0; i < 30; i++) {
            const scope = `t${(w + i) % 4}`;
            await client.query('BEGIN');
            const issued = await prepared.sequences.next('invoice', { scope, tx: client });
            expect(issued.text).toMatch(/^INV-\d{4}-\d{4}$/);
            if (i % 4 === 3) {
              await client.query('ROLLBACK');
            } else {
              await client.query('COMMIT');
              committed.set(scope, [...(committed.get(scope) ?? []), issued.value]);
            }
          }
        }),
      );
      // At most two statements per connection, whatever the number of calls: take_value once the
      // sequence is known gapless, take() before. Every client names a text alike.
      const all = new Set<string>();
      for (const client of clients) {
        const names = await preparedOn(client);
        expect(names.length).toBeGreaterThanOrEqual(1);
        expect(names.length).toBeLessThanOrEqual(2);
        for (const n of names) all.add(n);
      }
      expect(all.size).toBeLessThanOrEqual(2);
      for (const n of all) expect(n).toMatch(/^ordo_[0-9a-f]{24}$/);
    } finally {
      for (const c of clients) c.release();
    }
    for (const [scope, values] of committed) {
      expect(duplicates(values), scope).toEqual([]);
      expect(
        [...values].sort((a, b) => a - b),
        scope,
      ).toEqual(range(1, values.length));
    }
    const { rows } = await db
      .pool(1)
      .query(`SELECT scope, value FROM ordo.counters WHERE sequence = 'invoice' ORDER BY scope`);
    expect(rows.map((r) => [r.scope, Number(r.value)])).toEqual(
      [...committed].sort(([a], [b]) => a.localeCompare(b)).map(([scope, v]) => [scope, v.length]),
    );
  });

  it("ordo's own pool prepares its statements too: standalone numbers, a transaction of ordo's, an outbox append", async () => {
    const pool = new pg.Pool({ connectionString: db.url, max: 1 });
    const ordo = await createOrdo({ pool, prepare: true });
    try {
      await ordo.sequences.define({ name: 'own', ifNotExists: true });
      const values = await Promise.all(range(1, 20).map(() => ordo.sequences.next('own')));
      expect(values.map((v) => v.value).sort((a, b) => a - b)).toEqual(range(1, 20));
      const inTx = await ordo.transaction((tx) => ordo.sequences.next('own', { tx }));
      expect(inTx.value).toBe(21);
      await ordo.outbox.append('prepared', { type: 'T', data: { n: 1 } });
      const names = (await pool.query('SELECT name FROM pg_prepared_statements')).rows.map((r) => r.name);
      expect(names.length).toBeGreaterThanOrEqual(3);
      expect(names.every((n: string) => /^ordo_[0-9a-f]{24}$/.test(n))).toBe(true);
    } finally {
      await ordo.close();
      await pool.end();
    }
  });

  it('prepares nothing on a connection that is not node-postgres: a { query } of your own runs as given', async () => {
    const client = await db.pool(1).connect();
    try {
      const own = { query: (text: string, values?: unknown[]) => client.query(text, values) };
      await client.query('BEGIN');
      const issued = await prepared.sequences.next('invoice', { scope: 'own', tx: own });
      await client.query('COMMIT');
      expect(issued.value).toBe(1);
      expect(await preparedOn(client)).toEqual([]);
    } finally {
      client.release();
    }
  });
});

describe('prepare: false (the default)', () => {
  it('sends every statement unnamed: nothing is prepared on the caller’s connection', async () => {
    const client = await db.pool(1).connect();
    try {
      for (let i = 0; i < 3; i++) {
        await client.query('BEGIN');
        await unnamed.sequences.next('invoice', { scope: 'unnamed', tx: client });
        await client.query('COMMIT');
      }
      expect(await preparedOn(client)).toEqual([]);
    } finally {
      client.release();
    }
  });

  it('refuses a prepare that is not true or false, saying what to give', async () => {
    const refused = await createOrdo({ databaseUrl: db.url, prepare: 'yes' as unknown as boolean }).catch(
      (e: unknown) => e,
    );
    expect(refused).toBeInstanceOf(OrdoError);
    expect(refused).toMatchObject({
      code: 'invalid_argument',
      message: 'prepare must be true or false (got "yes")',
    });
  });
});
