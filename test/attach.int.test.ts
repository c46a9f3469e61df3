import { spawn } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrateLegacy } from './support/legacy-schema.js';
import { createOrdo, type Ordo, OrdoError } from '../src/index.js';
import { freshDatabase, type OrdoDatabase, ordoDatabase, type TestDatabase } from './support/database.js';

let t: OrdoDatabase;
let db: TestDatabase;
let ordo: Ordo;
let sql: pg.Pool;
/** The quoted schema holding ordo's SQL functions. */
let S: string;

beforeAll(async () => {
  t = await ordoDatabase({ poolSize: 4, sqlPoolSize: 40 });
  ({ db, ordo, sql, S } = t);
});
afterAll(() => t?.close());

const range = (n: number) => Array.from({ length: n }, (_, i) => i + 1);

async function rejects(work: Promise<unknown>, code: string, message: RegExp): Promise<void> {
  const e = await work.then(
    () => undefined,
    (error: unknown) => error,
  );
  expect(e).toBeInstanceOf(OrdoError);
  expect((e as OrdoError).code).toBe(code);
  expect((e as OrdoError).message).toMatch(message);
}

/** Runs statements in one transaction on a connection of its own; commits unless told otherwise. */
async function transaction(statements: string[], end: 'COMMIT' | 'ROLLBACK' = 'COMMIT'): Promise<void> {
  const client = await sql.connect();
  try {
    await client.query('BEGIN');
    for (const s of statements) await client.query(s);
    await client.query(end);
  } catch (e) {
    await client.query('ROLLBACK').catch(() => undefined);
    throw e;
  } finally {
    client.release();
  }
}

/** psql on the test database, fed `input` on stdin. */
function psql(input: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn('psql', [db.url, '-X', '-q', '-v', 'ON_ERROR_STOP=1'], { stdio: 'pipe' });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (out += d));
    child.on('error', reject);
    child.on('exit', (code) =>
      code === 0 ? resolve(out) : reject(new Error(`psql exited ${code}: ${out}`)),
    );
    child.stdin.end(input);
  });
}

/**
 * A deferred trigger of the test's own on `table` that logs `expression` under `name` for each
 * row at commit, right after ordo numbered the row (deferred triggers of one row fire in the
 * order of their names, and ordo's sort first).
 */
async function logAtCommit(table: string, name: string, expression: string): Promise<void> {
  await sql.query(`
    CREATE TABLE IF NOT EXISTS commit_log (id bigserial PRIMARY KEY, name text NOT NULL, value text);
    CREATE FUNCTION log_${name}() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN INSERT INTO commit_log (name, value) VALUES ('${name}', (${expression})::text); RETURN NULL; END $$;
    CREATE CONSTRAINT TRIGGER zzzz_log_${name} AFTER INSERT ON ${table} DEFERRABLE INITIALLY DEFERRED
      FOR EACH ROW EXECUTE FUNCTION log_${name}();`);
}

async function logged(name: string): Promise<(string | null)[]> {
  const { rows } = await sql.query('SELECT value FROM commit_log WHERE name = $1 ORDER BY id', [name]);
  return rows.map((r) => r.value);
}

async function counter(sequence: string, scope = ''): Promise<number | null> {
  const { rows } = await sql.query(
    `SELECT max(value) AS v FROM ${S}.counters WHERE sequence = $1 AND scope = $2`,
    [sequence, scope],
  );
  return rows[0].v === null ? null : Number(rows[0].v);
}

describe('numbers written at commit', () => {
  it('32 writers, a quarter rolling back, four tenants: every committed row numbered 1..n per tenant', async () => {
    await ordo.sequences.define({ name: 'at_many', format: '{scope}-{n:5}' });
    await sql.query('CREATE TABLE many (id bigserial PRIMARY KEY, tenant text, number bigint, label text)');
    expect(
      await ordo.sequences.attach('at_many', {
        table: 'many',
        column: 'number',
        scopeColumn: 'tenant',
        textColumn: 'label',
      }),
    ).toBe(true);

    let rolledBack = 0;
    await Promise.all(
      Array.from({ length: 32 }, async (_, w) => {
        for (let i = 0; i < 15; i++) {
          const tenant = `t${(w + i) % 4}`;
          const rollback = (w * 15 + i) % 4 === 0;
          if (rollback) rolledBack++;
          await transaction(
            [
              `INSERT INTO many (tenant) VALUES ('${tenant}')`,
              // Other work while the transaction is open: no counter is locked meanwhile.
              `SELECT pg_sleep(${(w % 3) / 1000})`,
            ],
            rollback ? 'ROLLBACK' : 'COMMIT',
          );
        }
      }),
    );
    expect(rolledBack).toBe(120);
    const { rows } = await sql.query('SELECT tenant, number, label FROM many ORDER BY tenant, number');
    expect(rows).toHaveLength(32 * 15 - 120);
    expect(rows.filter((r) => r.number === null)).toEqual([]);
    for (const tenant of ['t0', 't1', 't2', 't3']) {
      const mine = rows.filter((r) => r.tenant === tenant);
      expect(mine.map((r) => Number(r.number))).toEqual(range(mine.length));
      expect(mine.map((r) => r.label)).toEqual(
        range(mine.length).map((n) => `${tenant}-${String(n).padStart(5, '0')}`),
      );
      expect(await counter('at_many', tenant)).toBe(mine.length);
    }
  });

  it('transactions numbering several tenants and sequences in opposite orders never deadlock at commit', async () => {
    await ordo.sequences.define({ name: 'at_cross_a' });
    await ordo.sequences.define({ name: 'at_cross_b' });
    await sql.query(`
      CREATE TABLE cross_a (tenant text, number bigint);
      CREATE TABLE cross_b (tenant text, number bigint);`);
    await ordo.sequences.attach('at_cross_a', { table: 'cross_a', column: 'number', scopeColumn: 'tenant' });
    await ordo.sequences.attach('at_cross_b', { table: 'cross_b', column: 'number', scopeColumn: 'tenant' });
    // Without a scope column, one counter per sequence.
    await ordo.sequences.define({ name: 'at_cross_c' });
    await ordo.sequences.define({ name: 'at_cross_d' });
    await sql.query('CREATE TABLE cross_c (number bigint); CREATE TABLE cross_d (number bigint)');
    await ordo.sequences.attach('at_cross_c', { table: 'cross_c', column: 'number' });
    await ordo.sequences.attach('at_cross_d', { table: 'cross_d', column: 'number' });
    const failures: string[] = [];
    await Promise.all(
      Array.from({ length: 12 }, async (_, w) => {
        for (let i = 0; i < 25; i++) {
          const tables = (w + i) % 2 === 0 ? ['cross_c', 'cross_d'] : ['cross_d', 'cross_c'];
          await transaction(tables.map((t) => `INSERT INTO ${t} DEFAULT VALUES`)).catch(
            (e: { code?: string }) => failures.push(e.code ?? String(e)),
          );
        }
      }),
    );
    for (const table of ['cross_c', 'cross_d']) {
      const { rows } = await sql.query(`SELECT number FROM ${table} ORDER BY number`);
      expect(rows.map((r) => Number(r.number))).toEqual(range(300));
    }
    await Promise.all(
      Array.from({ length: 12 }, async (_, w) => {
        for (let i = 0; i < 25; i++) {
          const forward = (w + i) % 2 === 0;
          const tenants = forward ? `('x'), ('y')` : `('y'), ('x')`;
          const tables = forward ? ['cross_a', 'cross_b'] : ['cross_b', 'cross_a'];
          await transaction(tables.map((t) => `INSERT INTO ${t} (tenant) VALUES ${tenants}`)).catch(
            (e: { code?: string }) => failures.push(e.code ?? String(e)),
          );
        }
      }),
    );
    expect(failures).toEqual([]);
    for (const table of ['cross_a', 'cross_b']) {
      for (const tenant of ['x', 'y']) {
        const { rows } = await sql.query(`SELECT number FROM ${table} WHERE tenant = $1 ORDER BY number`, [
          tenant,
        ]);
        expect(rows.map((r) => Number(r.number))).toEqual(range(300));
      }
    }
  });

  it('does not hold the counter while the transaction is open: a later transaction commits first and gets 1', async () => {
    await ordo.sequences.define({ name: 'at_order' });
    await sql.query('CREATE TABLE ordered (id bigserial PRIMARY KEY, who text, number bigint)');
    await ordo.sequences.attach('at_order', { table: 'ordered', column: 'number' });
    const slow = await sql.connect();
    try {
      await slow.query('BEGIN');
      await slow.query(`INSERT INTO ordered (who) VALUES ('slow')`);
      // With the number taken in the transaction this would wait for `slow` to end.
      await transaction([`INSERT INTO ordered (who) VALUES ('fast')`]);
      await slow.query('COMMIT');
    } finally {
      slow.release();
    }
    const { rows } = await sql.query('SELECT who, number FROM ordered ORDER BY number');
    expect(rows).toEqual([
      { who: 'fast', number: '1' },
      { who: 'slow', number: '2' },
    ]);
  });

  it('numbers a multi-row INSERT … SELECT, COPY and several statements in insertion order', async () => {
    await ordo.sequences.define({ name: 'at_bulk' });
    await sql.query('CREATE TABLE bulk (id bigserial PRIMARY KEY, tag text, number bigint)');
    await ordo.sequences.attach('at_bulk', { table: 'bulk', column: 'number' });
    await transaction([
      `INSERT INTO bulk (tag) SELECT 'select-' || i FROM generate_series(1, 500) AS i`,
      `INSERT INTO bulk (tag) VALUES ('values-1'), ('values-2')`,
    ]);
    const copied = range(300).map((i) => `copy-${i}`);
    await psql(`BEGIN;\nCOPY bulk (tag) FROM STDIN;\n${copied.join('\n')}\n\\.\nCOMMIT;\n`);
    // A plain psql session, autocommitted: numbered at its implicit commit.
    await psql(`INSERT INTO bulk (tag) VALUES ('psql');\n`);
    const { rows } = await sql.query('SELECT tag, number FROM bulk ORDER BY id');
    expect(rows.map((r) => Number(r.number))).toEqual(range(803));
    expect(rows.map((r) => r.tag)).toEqual([
      ...range(500).map((i) => `select-${i}`),
      'values-1',
      'values-2',
      ...copied,
      'psql',
    ]);
  });

  it('one INSERT across 20,000 scopes commits, each scope numbered 1; again, each numbered 2', async () => {
    // A lock per counter asked PostgreSQL's shared lock table for 20,000 locks ("out of shared
    // memory"), and each row searched a note of every counter before it (quadratic).
    await ordo.sequences.define({ name: 'at_scopes' });
    await sql.query('CREATE TABLE scoped (id bigserial PRIMARY KEY, tenant text, number bigint)');
    await ordo.sequences.attach('at_scopes', { table: 'scoped', column: 'number', scopeColumn: 'tenant' });
    const insert = `INSERT INTO scoped (tenant) SELECT 't' || i FROM generate_series(1, 20000) AS i`;
    await transaction([insert]);
    await transaction([insert]);
    const { rows } = await sql.query(
      'SELECT number, count(*)::int AS n, count(DISTINCT tenant)::int AS tenants FROM scoped GROUP BY number ORDER BY number',
    );
    expect(rows).toEqual([
      { number: '1', n: 20000, tenants: 20000 },
      { number: '2', n: 20000, tenants: 20000 },
    ]);
  });

  it('two counters of one lock stripe, numbered in opposite orders, never deadlock at commit', async () => {
    // Counters share 256 lock stripes; a commit of two counters locks their stripes, even when
    // both are in one: two tenants of one stripe must still be locked before either row.
    await ordo.sequences.define({ name: 'at_stripe' });
    await sql.query('CREATE TABLE striped (tenant text, number bigint)');
    await ordo.sequences.attach('at_stripe', { table: 'striped', column: 'number', scopeColumn: 'tenant' });
    const { rows: pair } = await sql.query(
      `SELECT a.t AS a, b.t AS b FROM (SELECT 's' || i AS t FROM generate_series(1, 1000) AS i) AS a
         JOIN (SELECT 's' || i AS t FROM generate_series(1, 1000) AS i) AS b
           ON a.t < b.t AND ${S}.counter_stripe('at_stripe', a.t) = ${S}.counter_stripe('at_stripe', b.t)
        LIMIT 1`,
    );
    const [x, y] = [pair[0].a as string, pair[0].b as string];
    const failures: string[] = [];
    await Promise.all(
      Array.from({ length: 12 }, async (_, w) => {
        for (let i = 0; i < 25; i++) {
          const order = (w + i) % 2 === 0 ? [x, y] : [y, x];
          await transaction([
            ...order.map((t) => `INSERT INTO striped (tenant) VALUES ('${t}')`),
            'SELECT pg_sleep(0.001)',
          ]).catch((e: { code?: string }) => failures.push(e.code ?? String(e)));
        }
      }),
    );
    expect(failures).toEqual([]);
    for (const tenant of [x, y]) {
      const { rows } = await sql.query('SELECT number FROM striped WHERE tenant = $1 ORDER BY number', [
        tenant,
      ]);
      expect(rows.map((r) => Number(r.number))).toEqual(range(300));
    }
  });

  it('inserted and deleted in one transaction consumes nothing; inserted then updated is numbered once', async () => {
    await ordo.sequences.define({ name: 'at_edit' });
    await sql.query('CREATE TABLE edits (id bigserial PRIMARY KEY, tag text, number bigint)');
    await ordo.sequences.attach('at_edit', { table: 'edits', column: 'number' });
    await transaction([
      `INSERT INTO edits (tag) VALUES ('gone')`,
      `DELETE FROM edits WHERE tag = 'gone'`,
      `INSERT INTO edits (tag) VALUES ('a')`,
      `UPDATE edits SET tag = 'a2' WHERE tag = 'a'`,
      `UPDATE edits SET tag = 'a3' WHERE tag = 'a2'`,
      `INSERT INTO edits (tag) VALUES ('b')`,
    ]);
    expect(await counter('at_edit')).toBe(2);
    const { rows } = await sql.query('SELECT tag, number FROM edits ORDER BY number');
    // A row updated after its insert is numbered at its last write, which came before 'b'.
    expect(rows).toEqual([
      { tag: 'a3', number: '1' },
      { tag: 'b', number: '2' },
    ]);
    // A later update of a numbered row changes nothing.
    await transaction([`UPDATE edits SET tag = 'b2' WHERE tag = 'b'`]);
    expect(await counter('at_edit')).toBe(2);
  });

  it('keeps a value given in the insert and consumes nothing for it; rows from before attach keep their null', async () => {
    await ordo.sequences.define({ name: 'at_given' });
    await sql.query('CREATE TABLE given (id bigserial PRIMARY KEY, number bigint)');
    await sql.query('INSERT INTO given (number) VALUES (NULL)');
    await ordo.sequences.attach('at_given', { table: 'given', column: 'number' });
    await transaction([
      'INSERT INTO given (number) VALUES (999)',
      'INSERT INTO given (number) VALUES (NULL)',
    ]);
    const { rows } = await sql.query('SELECT number FROM given ORDER BY id');
    expect(rows.map((r) => r.number)).toEqual([null, '999', '1']);
    expect(await counter('at_given')).toBe(1);
  });

  it('numbers every partition of a partitioned table, those created after attach too', async () => {
    await ordo.sequences.define({ name: 'at_parts' });
    await sql.query(`
      CREATE TABLE parts (region text NOT NULL, number bigint) PARTITION BY LIST (region);
      CREATE TABLE parts_eu PARTITION OF parts FOR VALUES IN ('eu');`);
    await ordo.sequences.attach('at_parts', { table: 'parts', column: 'number', scopeColumn: 'region' });
    await sql.query(`CREATE TABLE parts_us PARTITION OF parts FOR VALUES IN ('us')`);
    await transaction([`INSERT INTO parts (region) VALUES ('eu'), ('us'), ('eu'), ('us'), ('us')`]);
    const { rows } = await sql.query('SELECT region, number FROM parts ORDER BY region, number');
    expect(rows.map((r) => `${r.region}${r.number}`)).toEqual(['eu1', 'eu2', 'us1', 'us2', 'us3']);
    // One attachment, listed on the partitioned table; a partition cannot be numbered twice.
    expect(await ordo.sequences.attachments('at_parts')).toEqual([
      { sequence: 'at_parts', table: 'parts', column: 'number', scopeColumn: 'region', textColumn: null },
    ]);
    await rejects(
      ordo.sequences.attach('at_parts', { table: 'parts_eu', column: 'number' }),
      'invalid_argument',
      /numbered already through the partitioned table/,
    );
  });

  it('numbers tables of other schemas, with names that need quotes, through SQL as well', async () => {
    await ordo.sequences.define({ name: 'at_schema', format: 'B-{n}' });
    await sql.query(`CREATE SCHEMA "Billing"; CREATE TABLE "Billing"."Invoices" ("No" bigint, "Text" text)`);
    const { rows: attached } = await sql.query(
      `SELECT ${S}.attach_sequence('at_schema', '"Billing"."Invoices"', 'No', NULL, 'Text') AS ok`,
    );
    expect(attached[0].ok).toBe(true);
    await transaction([
      `INSERT INTO "Billing"."Invoices" DEFAULT VALUES`,
      `INSERT INTO "Billing"."Invoices" DEFAULT VALUES`,
    ]);
    const { rows } = await sql.query(`SELECT "No" AS n, "Text" AS t FROM "Billing"."Invoices" ORDER BY "No"`);
    expect(rows).toEqual([
      { n: '1', t: 'B-1' },
      { n: '2', t: 'B-2' },
    ]);
    expect(await ordo.sequences.attachments('at_schema')).toEqual([
      {
        sequence: 'at_schema',
        table: '"Billing"."Invoices"',
        column: 'No',
        scopeColumn: null,
        textColumn: 'Text',
      },
    ]);
  });

  it('a table renamed or moved to another schema is numbered still: by its own planned statement under the name it was attached with, by one built at commit under any other', async () => {
    await ordo.sequences.define({ name: 'at_renamed', format: 'R-{scope}-{n}' });
    await sql.query(`CREATE TABLE "Re named" (tenant text, number bigint, label text)`);
    await ordo.sequences.attach('at_renamed', {
      table: '"Re named"',
      column: 'number',
      scopeColumn: 'tenant',
      textColumn: 'label',
    });
    // The calls of the function that runs the statement built at commit, as this session counts
    // them (not flushed to the statistics yet, so from earlier transactions too): between the two
    // rows of one commit, 0 when the second was numbered by the planned statement, 1 when built.
    await logAtCommit(
      '"Re named"',
      'built',
      `coalesce(pg_stat_get_xact_function_calls('${S}.number_row'::regproc), 0)`,
    );
    const insert = (table: string) =>
      transaction(["SET LOCAL track_functions = 'pl'", `INSERT INTO ${table} (tenant) VALUES ('a'), ('b')`]);
    await insert('"Re named"');
    await sql.query('ALTER TABLE "Re named" RENAME TO renamed');
    await insert('renamed');
    await sql.query('CREATE SCHEMA moved; ALTER TABLE renamed SET SCHEMA moved');
    await insert('moved.renamed');
    // A new table under the old name is not numbered, and consumes nothing.
    await sql.query(`CREATE TABLE "Re named" (tenant text, number bigint, label text)`);
    await transaction([`INSERT INTO "Re named" (tenant) VALUES ('a')`]);
    expect((await sql.query('SELECT number FROM "Re named"')).rows).toEqual([{ number: null }]);
    await sql.query(
      'DROP TABLE "Re named"; ALTER TABLE moved.renamed SET SCHEMA public; ALTER TABLE renamed RENAME TO "Re named"',
    );
    await insert('"Re named"');

    const { rows } = await sql.query('SELECT tenant, number, label FROM "Re named" ORDER BY tenant, number');
    expect(rows.map((r) => `${r.tenant}${r.number}:${r.label}`)).toEqual([
      ...range(4).map((n) => `a${n}:R-a-${n}`),
      ...range(4).map((n) => `b${n}:R-b-${n}`),
    ]);
    const calls = (await logged('built')).map(Number);
    expect(range(4).map((i) => calls[2 * i - 1]! - calls[2 * i - 2]!)).toEqual([0, 1, 1, 0]);
    expect(await ordo.sequences.attachments('at_renamed')).toEqual([
      {
        sequence: 'at_renamed',
        table: '"Re named"',
        column: 'number',
        scopeColumn: 'tenant',
        textColumn: 'label',
      },
    ]);
  });

  it('detach drops the trigger function of an attachment; a dropped table leaves it until the next attach', async () => {
    await ordo.sequences.define({ name: 'at_dropped' });
    await sql.query('CREATE TABLE dropped_a (number bigint); CREATE TABLE dropped_b (number bigint)');
    // The function the attachment's deferred trigger calls.
    const functionOf = async (table: string): Promise<string> =>
      (
        await sql.query(
          `SELECT p.proname FROM pg_trigger AS t JOIN pg_proc AS p ON p.oid = t.tgfoid
            WHERE t.tgrelid = $1::regclass AND t.tgname = 'ordo_number_number'`,
          [table],
        )
      ).rows[0].proname;
    const exists = async (name: string): Promise<boolean> =>
      (
        await sql.query(
          'SELECT count(*)::int AS n FROM pg_proc WHERE proname = $1 AND pronamespace = $2::regnamespace',
          [name, S],
        )
      ).rows[0].n === 1;
    await ordo.sequences.attach('at_dropped', { table: 'dropped_a', column: 'number' });
    const a = await functionOf('dropped_a');
    expect(await exists(a)).toBe(true);
    await sql.query('DROP TABLE dropped_a');
    expect(await ordo.sequences.attachments('at_dropped')).toEqual([]);
    expect(await exists(a)).toBe(true);

    await ordo.sequences.attach('at_dropped', { table: 'dropped_b', column: 'number' });
    const b = await functionOf('dropped_b');
    expect(await exists(a)).toBe(false);
    expect(await exists(b)).toBe(true);
    await transaction(['INSERT INTO dropped_b DEFAULT VALUES']);
    expect((await sql.query('SELECT number FROM dropped_b')).rows).toEqual([{ number: '1' }]);
    expect(await ordo.sequences.detach('at_dropped', { table: 'dropped_b', column: 'number' })).toBe(true);
    expect(await exists(b)).toBe(false);
    const { rows } = await sql.query(`SELECT tgname FROM pg_trigger WHERE tgrelid = 'dropped_b'::regclass`);
    expect(rows).toEqual([]);
  });

  it('a numbered commit is durable where synchronous_commit is off', async () => {
    await ordo.sequences.define({ name: 'at_durable' });
    await sql.query('CREATE TABLE durable_rows (number bigint)');
    await ordo.sequences.attach('at_durable', { table: 'durable_rows', column: 'number' });
    await logAtCommit('durable_rows', 'durable', `current_setting('synchronous_commit')`);
    await transaction(['SET LOCAL synchronous_commit = off', 'INSERT INTO durable_rows DEFAULT VALUES']);
    // Read as the commit is written: a commit acknowledged and then lost in a crash would give its
    // number to the next row, after the application had read it.
    expect(await logged('durable')).toEqual(['on']);
  });

  it('a client killed with SIGKILL mid-transaction consumes nothing', async () => {
    await ordo.sequences.define({ name: 'at_killed' });
    await sql.query('CREATE TABLE killed (who text, number bigint)');
    await ordo.sequences.attach('at_killed', { table: 'killed', column: 'number' });
    const child = spawn('psql', [db.url, '-X', '-q'], {
      stdio: ['pipe', 'ignore', 'ignore'],
      env: { ...process.env, PGAPPNAME: 'ordo-killed' },
    });
    child.stdin.write(`BEGIN;\nINSERT INTO killed (who) VALUES ('killed');\n`);
    const open = async () =>
      (
        await sql.query(
          `SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = 'ordo-killed' AND state = 'idle in transaction'`,
        )
      ).rows[0].n;
    while ((await open()) === 0) await sleep(20);
    child.kill('SIGKILL');
    const gone = async () =>
      (
        await sql.query(
          `SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = 'ordo-killed'`,
        )
      ).rows[0].n;
    while ((await gone()) > 0) await sleep(20);
    await transaction([`INSERT INTO killed (who) VALUES ('alive')`]);
    const { rows } = await sql.query('SELECT who, number FROM killed');
    expect(rows).toEqual([{ who: 'alive', number: '1' }]);
  });

  it('a commit that cannot number its rows fails whole: nothing is written', async () => {
    await ordo.sequences.define({ name: 'at_full', maxValue: 2 });
    await sql.query('CREATE TABLE full_table (number bigint)');
    await ordo.sequences.attach('at_full', { table: 'full_table', column: 'number' });
    await transaction(['INSERT INTO full_table DEFAULT VALUES', 'INSERT INTO full_table DEFAULT VALUES']);
    const failed = await transaction(['INSERT INTO full_table DEFAULT VALUES']).then(
      () => undefined,
      (e: { code?: string }) => e.code,
    );
    expect(failed).toBe('OX002');
    // Through ordo.transaction, the failed commit is an OrdoError with its code.
    const viaOrdo = await ordo
      .transaction((tx) => tx.query('INSERT INTO full_table DEFAULT VALUES'))
      .catch((e: unknown) => e);
    expect(viaOrdo).toBeInstanceOf(OrdoError);
    expect((viaOrdo as OrdoError).code).toBe('sequence_exhausted');
    expect((await sql.query('SELECT count(*)::int AS n FROM full_table')).rows[0].n).toBe(2);
    expect(await counter('at_full')).toBe(2);
  });
});

describe('attach and detach', () => {
  it('says what to change for a missing table or column, a wrong column, a batched or missing sequence', async () => {
    await ordo.sequences.define({ name: 'at_bad' });
    await ordo.sequences.define({ name: 'at_batched', kind: 'batched' });
    await sql.query(`
      CREATE TABLE shapes (id serial, number bigint, word text, required bigint NOT NULL, defaulted bigint DEFAULT 0,
                           ident bigint GENERATED BY DEFAULT AS IDENTITY, amount double precision);
      CREATE VIEW shapes_view AS SELECT * FROM shapes;`);
    const attach = (o: Record<string, unknown>, name = 'at_bad') =>
      ordo.sequences.attach(name, { table: 'shapes', column: 'number', ...o } as never);
    await rejects(
      attach({ table: 'nowhere' }),
      'invalid_argument',
      /The table 'nowhere' does not exist: give its name as schema\.table/,
    );
    await rejects(attach({ table: 'a b c' }), 'invalid_argument', /does not exist/);
    await rejects(attach({ table: 'shapes_view' }), 'invalid_argument', /is not a table/);
    await rejects(
      attach({ column: 'missing' }),
      'invalid_argument',
      /The table shapes has no column 'missing' \(the numbered column\)/,
    );
    await rejects(
      attach({ scopeColumn: 'missing' }),
      'invalid_argument',
      /no column 'missing' \(the scope column\)/,
    );
    await rejects(
      attach({ textColumn: 'missing' }),
      'invalid_argument',
      /no column 'missing' \(the text column\)/,
    );
    await rejects(
      attach({ column: 'word' }),
      'invalid_argument',
      /is text: it must be bigint, integer, smallint or numeric/,
    );
    await rejects(attach({ column: 'amount' }), 'invalid_argument', /double precision: it must be bigint/);
    await rejects(
      attach({ textColumn: 'number' }),
      'invalid_argument',
      /is bigint: it must be text or varchar/,
    );
    await rejects(attach({ column: 'required' }), 'invalid_argument', /NOT NULL.*DROP NOT NULL/);
    await rejects(attach({ column: 'defaulted' }), 'invalid_argument', /has a default/);
    await rejects(attach({ column: 'ident' }), 'invalid_argument', /identity/);
    await rejects(attach({ column: 'id' }), 'invalid_argument', /NOT NULL|default/);
    await rejects(attach({}, 'at_batched'), 'invalid_argument', /batched: only a gapless sequence/);
    await rejects(attach({}, 'nope'), 'sequence_not_found', /The sequence 'nope' does not exist/);
    await rejects(attach({ tabel: 'shapes' }), 'invalid_argument', /has no option 'tabel'/);
    await rejects(attach({ column: '' }), 'invalid_argument', /column must be a text of 1 to 63/);
    await rejects(
      ordo.sequences.detach('at_bad', { table: 'nowhere', column: 'number' }),
      'invalid_argument',
      /does not exist/,
    );
    // Nothing was attached by any of these.
    expect(await ordo.sequences.attachments('at_bad')).toEqual([]);
  });

  it('attach twice: the same is a no-op, another sequence on the same column is refused', async () => {
    await ordo.sequences.define({ name: 'at_twice' });
    await ordo.sequences.define({ name: 'at_other' });
    await sql.query('CREATE TABLE twice (number bigint, tenant text)');
    const same = { table: 'twice', column: 'number', scopeColumn: 'tenant' };
    expect(await ordo.sequences.attach('at_twice', same)).toBe(true);
    expect(await ordo.sequences.attach('at_twice', same)).toBe(false);
    await rejects(
      ordo.sequences.attach('at_other', same),
      'invalid_argument',
      /numbered by the sequence 'at_twice' already.*detach it first/,
    );
    await rejects(
      ordo.sequences.attach('at_twice', { table: 'twice', column: 'number' }),
      'invalid_argument',
      /already/,
    );
    await transaction(['INSERT INTO twice DEFAULT VALUES']);
    expect((await sql.query('SELECT number FROM twice')).rows).toEqual([{ number: '1' }]);
    // Two attaches racing: one creates, the other finds it.
    await sql.query('CREATE TABLE racing (number bigint)');
    const raced = await Promise.all(
      range(6).map(() => ordo.sequences.attach('at_twice', { table: 'racing', column: 'number' })),
    );
    expect(raced.filter(Boolean)).toHaveLength(1);
  });

  it('a sequence that numbers a table cannot be removed until detached', async () => {
    await ordo.sequences.define({ name: 'at_removed' });
    await sql.query('CREATE TABLE removed (number bigint)');
    await ordo.sequences.attach('at_removed', { table: 'removed', column: 'number' });
    await rejects(
      ordo.sequences.remove('at_removed'),
      'invalid_argument',
      /numbers removed\(number\) at commit: detach it first/,
    );
    await rejects(
      ordo.sequences.detach('at_order', { table: 'removed', column: 'number' }),
      'invalid_argument',
      /numbered by the sequence 'at_removed', not 'at_order'/,
    );
    expect(await ordo.sequences.detach('at_removed', { table: 'removed', column: 'number' })).toBe(true);
    expect(await ordo.sequences.detach('at_removed', { table: 'removed', column: 'number' })).toBe(false);
    expect(await ordo.sequences.remove('at_removed')).toBe(true);
  });

  it('detach with a transaction open: waits for it, and its rows are numbered as it commits', async () => {
    await ordo.sequences.define({ name: 'at_detach' });
    await sql.query('CREATE TABLE detached (who text, number bigint)');
    await ordo.sequences.attach('at_detach', { table: 'detached', column: 'number' });
    const open = await sql.connect();
    try {
      await open.query('BEGIN');
      await open.query(`INSERT INTO detached (who) VALUES ('open')`);
      let done = false;
      const detaching = ordo.sequences
        .detach('at_detach', { table: 'detached', column: 'number' })
        .then((r) => {
          done = true;
          return r;
        });
      await sleep(300);
      expect(done).toBe(false);
      await open.query('COMMIT');
      expect(await detaching).toBe(true);
    } finally {
      open.release();
    }
    await transaction([`INSERT INTO detached (who) VALUES ('after')`]);
    const { rows } = await sql.query('SELECT who, number FROM detached ORDER BY who');
    expect(rows).toEqual([
      { who: 'after', number: null },
      { who: 'open', number: '1' },
    ]);
    // A dropped table takes its attachment with it.
    await ordo.sequences.attach('at_detach', { table: 'detached', column: 'number' });
    await sql.query('DROP TABLE detached');
    expect(await ordo.sequences.attachments('at_detach')).toEqual([]);
  });
});

describe('the period is the one of the commit', () => {
  it('an invoice committed at 00:00:01 on 1 January is in the new year, the instant is the same for every row', async () => {
    await ordo.sequences.define({
      name: 'at_year',
      reset: 'year',
      timeZone: 'Europe/Paris',
      format: 'INV-{YYYY}-{n:4}',
    });
    await sql.query('CREATE TABLE yearly (who text, number bigint, label text)');
    await ordo.sequences.attach('at_year', { table: 'yearly', column: 'number', textColumn: 'label' });
    const at = (instant: string) => `SET LOCAL ordo.commit_at = '${instant}'`;
    await transaction([`INSERT INTO yearly (who) VALUES ('a'), ('b')`, at('2026-12-31T22:59:59Z')]);
    // 23:00:01 UTC is 00:00:01 on 1 January 2027 in Paris.
    await transaction([`INSERT INTO yearly (who) VALUES ('c'), ('d')`, at('2026-12-31T23:00:01Z')]);
    const { rows } = await sql.query('SELECT who, number, label FROM yearly ORDER BY who');
    expect(rows.map((r) => r.label)).toEqual([
      'INV-2026-0001',
      'INV-2026-0002',
      'INV-2027-0001',
      'INV-2027-0002',
    ]);
    const bad = await transaction([`INSERT INTO yearly (who) VALUES ('e')`, at('tomorrow-ish')]).then(
      () => undefined,
      (e: { code?: string; message?: string }) => e,
    );
    expect(bad).toMatchObject({
      code: 'OX003',
      message: expect.stringMatching(/ordo\.commit_at must be a timestamp/),
    });
    expect((await sql.query(`SELECT count(*)::int AS n FROM yearly`)).rows[0].n).toBe(4);
  });

  it('daily periods across the Paris DST change follow the local calendar at commit', async () => {
    await ordo.sequences.define({
      name: 'at_dst',
      reset: 'day',
      timeZone: 'Europe/Paris',
      format: '{YYYY}{MM}{DD}-{n}',
    });
    await sql.query('CREATE TABLE dst (number bigint, label text)');
    await ordo.sequences.attach('at_dst', { table: 'dst', column: 'number', textColumn: 'label' });
    // 25 October 2026: midnight is 22:00 UTC the day before (CEST), the next midnight 23:00 UTC (CET).
    for (const instant of [
      '2026-10-24T21:59:59Z',
      '2026-10-24T22:00:00Z',
      '2026-10-25T00:30:00Z',
      '2026-10-25T01:30:00Z',
      '2026-10-25T22:59:59Z',
      '2026-10-25T23:00:00Z',
    ]) {
      await transaction(['INSERT INTO dst DEFAULT VALUES', `SET LOCAL ordo.commit_at = '${instant}'`]);
    }
    const { rows } = await sql.query('SELECT label FROM dst ORDER BY ctid');
    expect(rows.map((r) => r.label)).toEqual([
      '20261024-1',
      '20261025-1',
      '20261025-2',
      '20261025-3',
      '20261025-4',
      '20261026-1',
    ]);
  });

  it('without a given instant, the database clock at commit decides (not the start of the transaction)', async () => {
    await ordo.sequences.define({
      name: 'at_clock',
      reset: 'day',
      timeZone: 'UTC',
      format: '{YYYY}-{MM}-{DD}/{n}',
    });
    await sql.query(`
      CREATE TABLE clocked (number bigint, label text, started timestamptz);
      CREATE TABLE clocked_instants (numbered_at timestamptz, started timestamptz);
      -- The user's own trigger at commit, after ordo's (same event: alphabetical order), sees
      -- the instant the commit was numbered as of.
      CREATE FUNCTION record_instant() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        INSERT INTO clocked_instants VALUES (current_setting('ordo.commit_at')::timestamptz, now());
        RETURN NULL;
      END $$;
      CREATE CONSTRAINT TRIGGER zz_record AFTER INSERT ON clocked DEFERRABLE INITIALLY DEFERRED
        FOR EACH ROW EXECUTE FUNCTION record_instant();`);
    await ordo.sequences.attach('at_clock', { table: 'clocked', column: 'number', textColumn: 'label' });
    await transaction([`INSERT INTO clocked (started) VALUES (now())`, 'SELECT pg_sleep(0.2)']);
    const after = (await sql.query('SELECT clock_timestamp() AS at')).rows[0].at as Date;
    const { rows } = await sql.query(
      `SELECT label, to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS today FROM clocked`,
    );
    expect(rows[0].label).toBe(`${rows[0].today}/1`);
    const [instant] = (await sql.query('SELECT * FROM clocked_instants')).rows;
    // Numbered as of the commit: at least the 200 ms slept after the transaction's start.
    expect(instant.numbered_at.getTime()).toBeGreaterThanOrEqual(instant.started.getTime() + 200);
    expect(instant.numbered_at.getTime()).toBeLessThanOrEqual(after.getTime());
  });
});

/**
 * A connection of its own, with the session settings given (DateStyle, TimeZone …): release it
 * with release(true), so that no other test gets its settings.
 */
async function session(settings: Record<string, string> = {}): Promise<pg.PoolClient> {
  const client = await sql.connect();
  for (const [name, value] of Object.entries(settings)) {
    await client.query(`SELECT set_config($1, $2, false)`, [name, value]);
  }
  return client;
}

/** Runs until PostgreSQL shows `pid` waiting for a lock. */
async function waitingForLock(pid: number): Promise<void> {
  for (let i = 0; i < 250; i++) {
    const { rows } = await sql.query(
      `SELECT count(*)::int AS n FROM pg_locks WHERE pid = $1 AND NOT granted`,
      [pid],
    );
    if (rows[0].n > 0) return;
    await sleep(20);
  }
  throw new Error(`pid ${pid} never waited`);
}

interface Failure {
  code?: string;
  table?: string;
  message?: string;
}

describe('REPEATABLE READ and SERIALIZABLE', () => {
  /**
   * Inserts one row per transaction at `isolation`, retrying every failed one as PostgreSQL
   * asks for 40001; returns the failures.
   */
  async function writers(table: string, isolation: string, count: number, each: number): Promise<Failure[]> {
    const failures: Failure[] = [];
    await Promise.all(
      Array.from({ length: count }, async () => {
        for (let done = 0; done < each;) {
          await transaction([
            `SET TRANSACTION ISOLATION LEVEL ${isolation}`,
            `INSERT INTO ${table} DEFAULT VALUES`,
            'SELECT pg_sleep(0.005)',
          ]).then(
            () => done++,
            (e: Failure) => failures.push({ code: e.code, table: e.table, message: e.message }),
          );
        }
      }),
    );
    return failures;
  }

  const refusal =
    /The sequence '(\w+)' numbers (\w+) at commit, and another transaction numbered the same counter \(scope ''\) after this (REPEATABLE READ|SERIALIZABLE) transaction took its snapshot.*Retry the transaction.*READ COMMITTED/;

  it('8 writers at REPEATABLE READ on one counter: commits that lost the race fail with 40001 saying why, retries number 1..n', async () => {
    await ordo.sequences.define({ name: 'at_rr' });
    await sql.query('CREATE TABLE rr (number bigint)');
    await ordo.sequences.attach('at_rr', { table: 'rr', column: 'number' });
    const failures = await writers('rr', 'REPEATABLE READ', 8, 10);
    // Under this load nearly every commit races another: PostgreSQL refuses to update the
    // counter a later commit changed, as it refuses any such update at REPEATABLE READ.
    expect(failures.length).toBeGreaterThan(0);
    for (const f of failures) {
      expect(f).toMatchObject({ code: '40001', table: 'counters', message: expect.stringMatching(refusal) });
    }
    const { rows } = await sql.query('SELECT number FROM rr ORDER BY number');
    expect(rows.map((r) => Number(r.number))).toEqual(range(80));
    expect(await counter('at_rr')).toBe(80);
  });

  it('SERIALIZABLE too; a transaction that nobody raced commits, however many rows it numbers', async () => {
    await ordo.sequences.define({ name: 'at_ser' });
    await sql.query('CREATE TABLE ser (number bigint)');
    await ordo.sequences.attach('at_ser', { table: 'ser', column: 'number' });
    const failures = await writers('ser', 'SERIALIZABLE', 4, 5);
    for (const f of failures) expect(f).toMatchObject({ code: '40001', table: 'counters' });
    // Alone on the counter, a bulk insert at either level is numbered in one go.
    await transaction([
      'SET TRANSACTION ISOLATION LEVEL SERIALIZABLE',
      'INSERT INTO ser SELECT FROM generate_series(1, 300)',
    ]);
    await transaction([
      'SET TRANSACTION ISOLATION LEVEL REPEATABLE READ',
      'INSERT INTO ser SELECT FROM generate_series(1, 300)',
    ]);
    const { rows } = await sql.query('SELECT number FROM ser ORDER BY number');
    expect(rows.map((r) => Number(r.number))).toEqual(range(620));
  });

  it('SERIALIZABLE, one INSERT across more tenants than the commit keeps noted, each tenant in rounds: every row numbered, in order', async () => {
    // 0028 notes the last 64 counters a commit numbered: 100 tenants coming round in turn are
    // never in the note, so every row is numbered through the subtransaction, as a first row is.
    await ordo.sequences.define({ name: 'at_ser_many' });
    await sql.query('CREATE TABLE ser_many (id bigserial, tenant text, number bigint)');
    await ordo.sequences.attach('at_ser_many', {
      table: 'ser_many',
      column: 'number',
      scopeColumn: 'tenant',
    });
    await transaction([
      'SET TRANSACTION ISOLATION LEVEL SERIALIZABLE',
      `INSERT INTO ser_many (tenant) SELECT 't' || t FROM generate_series(1, 3) AS r, generate_series(1, 100) AS t ORDER BY r, t`,
    ]);
    const { rows } = await sql.query(
      'SELECT tenant, array_agg(number ORDER BY id) AS numbers FROM ser_many GROUP BY tenant ORDER BY tenant',
    );
    expect(rows).toHaveLength(100);
    for (const r of rows) expect(r.numbers.map(Number)).toEqual([1, 2, 3]);
    expect(await counter('at_ser_many', 't77')).toBe(3);
  });

  it('names the counter raced (a scope) and consumes nothing; through ordo.transaction it is serialization_failure (409)', async () => {
    await ordo.sequences.define({ name: 'at_rr_scoped' });
    await sql.query('CREATE TABLE rr_scoped (tenant text, number bigint)');
    await ordo.sequences.attach('at_rr_scoped', {
      table: 'rr_scoped',
      column: 'number',
      scopeColumn: 'tenant',
    });
    const e = await ordo
      .transaction(async (tx) => {
        await tx.query('SET TRANSACTION ISOLATION LEVEL REPEATABLE READ');
        await tx.query(`INSERT INTO rr_scoped (tenant) VALUES ('a'), ('b'), ('b')`);
        // Another transaction numbers b's counter after this one's snapshot.
        await transaction([`INSERT INTO rr_scoped (tenant) VALUES ('b')`]);
      })
      .catch((x: unknown) => x);
    expect(e).toBeInstanceOf(OrdoError);
    expect(e).toMatchObject({ code: 'serialization_failure', httpStatus: 409 });
    expect((e as OrdoError).message).toMatch(
      /The sequence 'at_rr_scoped' numbers rr_scoped at commit, and another transaction numbered the same counter \(scope 'b'\) after this REPEATABLE READ transaction/,
    );
    // a's number went back with the rest of the transaction.
    expect(await counter('at_rr_scoped', 'a')).toBeNull();
    expect(await counter('at_rr_scoped', 'b')).toBe(1);
    // The retry commits.
    await ordo.transaction(async (tx) => {
      await tx.query('SET TRANSACTION ISOLATION LEVEL REPEATABLE READ');
      await tx.query(`INSERT INTO rr_scoped (tenant) VALUES ('a'), ('b'), ('b')`);
    });
    const { rows } = await sql.query('SELECT tenant, number FROM rr_scoped ORDER BY tenant, number');
    expect(rows.map((r) => `${r.tenant}${r.number}`)).toEqual(['a1', 'b1', 'b2', 'b3']);
  });
});

describe('no deadlock, whoever writes and however the session is set', () => {
  it('commits inserting straight into partitions, in opposite orders, a partition attached later too', async () => {
    await ordo.sequences.define({ name: 'at_part_cross' });
    await sql.query(`
      CREATE TABLE pcross (region text NOT NULL, number bigint) PARTITION BY LIST (region);
      CREATE TABLE pcross_eu PARTITION OF pcross FOR VALUES IN ('eu');`);
    await ordo.sequences.attach('at_part_cross', {
      table: 'pcross',
      column: 'number',
      scopeColumn: 'region',
    });
    await sql.query(`
      CREATE TABLE pcross_us (region text NOT NULL, number bigint);
      ALTER TABLE pcross ATTACH PARTITION pcross_us FOR VALUES IN ('us');`);
    const failures: string[] = [];
    await Promise.all(
      Array.from({ length: 12 }, async (_, w) => {
        for (let i = 0; i < 25; i++) {
          const order = (w + i) % 2 === 0 ? ['eu', 'us'] : ['us', 'eu'];
          await transaction(
            order
              .map((r) => `INSERT INTO pcross_${r} (region) VALUES ('${r}')`)
              .concat('SELECT pg_sleep(0.001)'),
          ).catch((e: { code?: string }) => failures.push(e.code ?? String(e)));
        }
      }),
    );
    expect(failures).toEqual([]);
    for (const region of ['eu', 'us']) {
      const { rows } = await sql.query('SELECT number FROM pcross WHERE region = $1 ORDER BY number', [
        region,
      ]);
      expect(rows.map((r) => Number(r.number))).toEqual(range(300));
    }
  });

  it('two sessions with different DateStyles lock the same counters', async () => {
    await ordo.sequences.define({ name: 'at_style_a', reset: 'day' });
    await ordo.sequences.define({ name: 'at_style_b', reset: 'day' });
    await sql.query('CREATE TABLE style_a (number bigint); CREATE TABLE style_b (number bigint)');
    await ordo.sequences.attach('at_style_a', { table: 'style_a', column: 'number' });
    await ordo.sequences.attach('at_style_b', { table: 'style_b', column: 'number' });
    const iso = await session({ DateStyle: 'ISO, MDY' });
    const dmy = await session({ DateStyle: 'SQL, DMY' });
    try {
      const statements = [
        `SET LOCAL ordo.commit_at = '2026-01-02T10:00:00Z'`,
        'INSERT INTO style_a DEFAULT VALUES',
        'INSERT INTO style_b DEFAULT VALUES',
      ];
      for (const s of ['BEGIN', ...statements]) await iso.query(s);
      // What the first row numbered at commit does: lock every counter the commit needs.
      await iso.query(`SELECT ${S}.lock_pending_counters()`);
      for (const s of ['BEGIN', ...statements.reverse()]) await dmy.query(s);
      const pid = (await dmy.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
      const locking = dmy.query(`SELECT ${S}.lock_pending_counters()`);
      await waitingForLock(pid);
      await iso.query('COMMIT');
      await locking;
      await dmy.query('COMMIT');
    } finally {
      iso.release(true);
      dmy.release(true);
    }
    for (const table of ['style_a', 'style_b']) {
      expect((await sql.query(`SELECT number FROM ${table} ORDER BY number`)).rows).toEqual([
        { number: '1' },
        { number: '2' },
      ]);
    }
  });
});

describe('a sequence is not changed under its attachments', () => {
  it('a removal waits for an attach in flight, then refuses', async () => {
    await ordo.sequences.define({ name: 'at_race_remove' });
    await sql.query('CREATE TABLE race_remove (number bigint)');
    const attaching = await sql.connect();
    try {
      await attaching.query('BEGIN');
      await attaching.query(`SELECT ${S}.attach_sequence('at_race_remove', 'race_remove', 'number')`);
      let settled = false;
      const removing = ordo.sequences.remove('at_race_remove').finally(() => (settled = true));
      removing.catch(() => undefined);
      await sleep(300);
      expect(settled).toBe(false);
      await attaching.query('COMMIT');
      await rejects(removing, 'invalid_argument', /numbers race_remove\(number\) at commit: detach it first/);
    } finally {
      attaching.release();
    }
    await transaction(['INSERT INTO race_remove DEFAULT VALUES']);
    expect((await sql.query('SELECT number FROM race_remove')).rows).toEqual([{ number: '1' }]);
  });

  it('an attached sequence cannot become batched, also when the attach is in flight; detached, it can', async () => {
    await ordo.sequences.define({ name: 'at_kind' });
    await sql.query('CREATE TABLE kind_a (number bigint); CREATE TABLE kind_b (number bigint)');
    await ordo.sequences.attach('at_kind', { table: 'kind_a', column: 'number' });
    await rejects(
      ordo.sequences.define({ name: 'at_kind', kind: 'batched', overwrite: true }),
      'invalid_argument',
      /The sequence 'at_kind' numbers kind_a\(number\) at commit: it cannot become batched; detach it first/,
    );
    const [q] = await ordo.query('DEFINE SEQUENCE OVERWRITE at_kind BATCH 10');
    expect(q).toMatchObject({ code: 'invalid_argument' });
    await ordo.sequences.detach('at_kind', { table: 'kind_a', column: 'number' });

    const attaching = await sql.connect();
    try {
      await attaching.query('BEGIN');
      await attaching.query(`SELECT ${S}.attach_sequence('at_kind', 'kind_b', 'number')`);
      const redefining = ordo.sequences.define({ name: 'at_kind', kind: 'batched', overwrite: true });
      redefining.catch(() => undefined);
      await sleep(200);
      await attaching.query('COMMIT');
      await rejects(
        redefining,
        'invalid_argument',
        /numbers kind_b\(number\) at commit: it cannot become batched/,
      );
    } finally {
      attaching.release();
    }
    await transaction(['INSERT INTO kind_b DEFAULT VALUES']);
    expect((await sql.query('SELECT number FROM kind_b')).rows).toEqual([{ number: '1' }]);
    // Other changes of an attached sequence are allowed; detached, it may change kind.
    await ordo.sequences.define({ name: 'at_kind', format: 'K-{n}', overwrite: true });
    await ordo.sequences.detach('at_kind', { table: 'kind_b', column: 'number' });
    expect(await ordo.sequences.define({ name: 'at_kind', kind: 'batched', overwrite: true })).toMatchObject({
      kind: 'batched',
    });
  });
});

describe('session settings do not change numbers', () => {
  it('the instant of a commit reads back the same whatever DateStyle and TimeZone say', async () => {
    // 'Postgres' prints time zone abbreviations; IST is Israel's (+02) in PostgreSQL's default
    // set, so Kolkata's IST (+05:30) printed and read back was another instant.
    const c = await session({ DateStyle: 'Postgres, DMY', TimeZone: 'Asia/Kolkata' });
    try {
      await c.query('BEGIN');
      // Compared as numbers: node-pg cannot read timestamps printed the 'Postgres' way.
      const epoch = `SELECT extract(epoch FROM ${S}.commit_instant())::text AS at`;
      const first = (await c.query(epoch)).rows[0].at;
      const again = (await c.query(epoch)).rows[0].at;
      expect(again).toBe(first);
      const kept = (await c.query(`SELECT current_setting('ordo.commit_at') AS t`)).rows[0].t;
      expect(kept).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/);
      await c.query('ROLLBACK');
    } finally {
      c.release(true);
    }
  });

  it('a scope column is text, varchar, an integer or a uuid: a date, a timestamp or a float is refused', async () => {
    await ordo.sequences.define({ name: 'at_scope_types' });
    await sql.query(`
      CREATE DOMAIN tenant_code AS text;
      CREATE TABLE scope_types (number bigint, d date, ts timestamptz, f double precision, n numeric,
                                v varchar(20), i integer, b bigint, u uuid, t tenant_code)`);
    for (const [column, type] of [
      ['d', 'date'],
      ['ts', 'timestamp with time zone'],
      ['f', 'double precision'],
      ['n', 'numeric'],
    ]) {
      await rejects(
        ordo.sequences.attach('at_scope_types', {
          table: 'scope_types',
          column: 'number',
          scopeColumn: column,
        }),
        'invalid_argument',
        new RegExp(
          `The column ${column} of scope_types \\(the scope column\\) is ${type}: it must be text, varchar, smallint, integer, bigint or uuid`,
        ),
      );
    }
    for (const column of ['v', 'i', 'b', 'u', 't']) {
      expect(
        await ordo.sequences.attach('at_scope_types', {
          table: 'scope_types',
          column: 'number',
          scopeColumn: column,
        }),
      ).toBe(true);
      await ordo.sequences.detach('at_scope_types', { table: 'scope_types', column: 'number' });
    }
  });
});

describe('detach waits a bounded time for the table', () => {
  it('an idle reader holds the table: detach gives up after lockTimeout, changing nothing', async () => {
    await ordo.sequences.define({ name: 'at_reader' });
    await sql.query('CREATE TABLE read_only (number bigint)');
    await ordo.sequences.attach('at_reader', { table: 'read_only', column: 'number' });
    const reader = await sql.connect();
    try {
      await reader.query('BEGIN');
      await reader.query('SELECT * FROM read_only');
      const started = Date.now();
      await rejects(
        ordo.sequences.detach('at_reader', { table: 'read_only', column: 'number', lockTimeout: '300ms' }),
        'timeout',
        /detach did not get read_only within 300 ms: a transaction is reading or writing it.*Nothing was changed; retry when that transaction has ended/,
      );
      expect(Date.now() - started).toBeLessThan(3000);
      // Readers arriving meanwhile were not queued for longer than that.
      expect((await sql.query('SELECT count(*)::int AS n FROM read_only')).rows[0].n).toBe(0);
      expect(await ordo.sequences.attachments('at_reader')).toHaveLength(1);
      await rejects(
        ordo.sequences.detach('at_reader', { table: 'read_only', column: 'number', lockTimeout: 0 }),
        'invalid_argument',
        /lockTimeout must be a duration from 1ms/,
      );
      await reader.query('COMMIT');
    } finally {
      reader.release();
    }
    expect(await ordo.sequences.detach('at_reader', { table: 'read_only', column: 'number' })).toBe(true);
    // No trigger of ordo is left on the table.
    const { rows } = await sql.query(`SELECT tgname FROM pg_trigger WHERE tgrelid = 'read_only'::regclass`);
    expect(rows).toEqual([]);
  });

  it('from SQL, the caller keeps its own lock_timeout', async () => {
    await ordo.sequences.define({ name: 'at_sql_detach' });
    await sql.query('CREATE TABLE sql_detach (number bigint)');
    await ordo.sequences.attach('at_sql_detach', { table: 'sql_detach', column: 'number' });
    const out = await psql(
      `SET lock_timeout = '7s';\nSELECT ${S}.detach_sequence('at_sql_detach', 'sql_detach', 'number');\nSHOW lock_timeout;\n`,
    );
    expect(out).toContain('7s');
    expect(await ordo.sequences.attachments('at_sql_detach')).toEqual([]);
  });
});

describe('attachments made before 0013, upgraded by 8080e8c and then today', () => {
  it('keep numbering after the upgrade, noted by the new row trigger, and detach drops what they had', async () => {
    const old = await freshDatabase();
    const pool = old.pool(16);
    let upgraded: Ordo | undefined;
    try {
      // The schema as ordo left it before 0013, with an attachment made by its functions.
      await migrateLegacy(pool, 'ordo', 12);
      await pool.query(`
        SELECT * FROM ordo.define_sequence('old_parts', 'gapless', 1, 1, 1, 9007199254740991, false, 1, NULL,
                                           'never', 'UTC', NULL, 'create', 1);
        CREATE TABLE old_parts (region text NOT NULL, number bigint) PARTITION BY LIST (region);
        CREATE TABLE old_parts_eu PARTITION OF old_parts FOR VALUES IN ('eu');
        CREATE TABLE old_parts_us PARTITION OF old_parts FOR VALUES IN ('us');
        SELECT ordo.attach_sequence('old_parts', 'old_parts', 'number', 'region');
        INSERT INTO old_parts (region) VALUES ('eu'), ('us');`);

      await migrateLegacy(pool, 'ordo');
      upgraded = await createOrdo({ databaseUrl: old.url, poolSize: 2 });
      expect(await upgraded.sequences.attachments('old_parts')).toEqual([
        {
          sequence: 'old_parts',
          table: 'old_parts',
          column: 'number',
          scopeColumn: 'region',
          textColumn: null,
        },
      ]);
      // Straight into the partitions, in opposite orders: no deadlock.
      const failures: string[] = [];
      await Promise.all(
        Array.from({ length: 8 }, async (_, w) => {
          for (let i = 0; i < 20; i++) {
            const order = (w + i) % 2 === 0 ? ['eu', 'us'] : ['us', 'eu'];
            const client = await pool.connect();
            try {
              await client.query('BEGIN');
              for (const r of order)
                await client.query(`INSERT INTO old_parts_${r} (region) VALUES ('${r}')`);
              await client.query('SELECT pg_sleep(0.001)');
              await client.query('COMMIT');
            } catch (e) {
              failures.push((e as { code?: string }).code ?? String(e));
              await client.query('ROLLBACK').catch(() => undefined);
            } finally {
              client.release();
            }
          }
        }),
      );
      expect(failures).toEqual([]);
      for (const region of ['eu', 'us']) {
        const { rows } = await pool.query('SELECT number FROM old_parts WHERE region = $1 ORDER BY number', [
          region,
        ]);
        expect(rows.map((r) => Number(r.number))).toEqual(range(161));
      }
      expect(await upgraded.sequences.detach('old_parts', { table: 'old_parts', column: 'number' })).toBe(
        true,
      );
      const { rows } = await pool.query(
        `SELECT tgname FROM pg_trigger WHERE tgrelid IN ('old_parts'::regclass, 'old_parts_eu'::regclass, 'old_parts_us'::regclass)`,
      );
      expect(rows).toEqual([]);
    } finally {
      await upgraded?.close();
      await old.drop();
    }
  });
});
