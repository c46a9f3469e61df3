import { spawn } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Ordo, OrdoError } from '../src/index.js';
import { type OrdoDatabase, ordoDatabase, type TestDatabase } from './support/database.js';

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
    await sql.query('CREATE TABLE clocked (number bigint, label text, started timestamptz)');
    await ordo.sequences.attach('at_clock', { table: 'clocked', column: 'number', textColumn: 'label' });
    await transaction([`INSERT INTO clocked (started) VALUES (now())`, 'SELECT pg_sleep(0.05)']);
    const { rows } = await sql.query(
      `SELECT label, to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS today FROM clocked`,
    );
    expect(rows[0].label).toBe(`${rows[0].today}/1`);
  });
});
