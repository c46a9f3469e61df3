// A database that the ordo of 8080e8c built and used (its 42 migrations, before the SQL became a
// baseline and one file per function) upgrades in place: nothing re-created, nothing lost. It is
// filled through that version's SQL functions, as its nodes called them, then opened by today's
// code, which must leave a schema equal to a fresh install's and carry every piece of state on.
// A server of the file's own: outbox delivery depends on every transaction of the cluster.
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { promisify } from 'node:util';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BASELINE, loadMigrations } from '../src/db/migrations.js';
import { createOrdo, type Ordo } from '../src/index.js';
import { migrateLegacy } from './support/legacy-schema.js';
import { type RestartablePostgres, restartablePostgres } from './support/restartable-postgres.js';
import { sql } from './support/restore.js';
import { until } from './support/until.js';

const run = promisify(execFile);

let server: RestartablePostgres;
let oldUrl: string;
let freshUrl: string;
let old: pg.Pool;
const opened: Ordo[] = [];

const inDb = (url: string, name: string) => {
  const u = new URL(url);
  u.pathname = `/${name}`;
  return u.toString();
};

beforeAll(async () => {
  server = await restartablePostgres();
  await sql(server.url, 'CREATE DATABASE old_one');
  await sql(server.url, 'CREATE DATABASE fresh_one');
  oldUrl = inDb(server.url, 'old_one');
  freshUrl = inDb(server.url, 'fresh_one');
  old = new pg.Pool({ connectionString: oldUrl, max: 4 });
}, 120_000);
afterAll(async () => {
  await Promise.all(opened.map((o) => o.close().catch(() => undefined)));
  await old?.end();
  await server?.cleanup();
});

async function ordoOn(url: string): Promise<Ordo> {
  const o = await createOrdo({ databaseUrl: url, poolSize: 4 });
  opened.push(o);
  return o;
}

/**
 * `pg_dump --schema-only` of the schema `ordo`, without what ordo creates at run time for the
 * data it holds (each attachment's trigger function, each batched sequence's storage) and the
 * dump's random key.
 */
async function schemaDump(url: string): Promise<string> {
  const { stdout } = await run('/usr/bin/pg_dump', ['--schema-only', '-n', 'ordo', url], {
    maxBuffer: 64 * 1024 * 1024,
  });
  return stdout
    .split(/\n(?=--\n-- Name: )/)
    .filter((entry) => !/^--\n-- Name: (number_at_commit_|batched_)/.test(entry))
    .join('\n')
    .replace(/^\\(un)?restrict .*$/gm, '');
}

const q = async (text: string, values: unknown[] = []) => (await old.query(text, values)).rows;
const MAX = 9007199254740991;
const node = randomUUID();
const labels = (rows: { data: { label: string } }[]) => rows.map((r) => r.data.label);

describe('a database of 8080e8c, filled by its functions, upgraded by today’s code', () => {
  let permitId: string;
  let rangeLast: number;
  let upgraded: Ordo;
  let slow: pg.PoolClient;

  beforeAll(async () => {
    await migrateLegacy(old, 'ordo');

    // Gapless: a counter in two periods, an idempotent take, and a table numbered at commit.
    await q(`SELECT * FROM ordo.define_sequence('invoice', 'gapless', 1, 1, 1, ${MAX}, false, NULL, NULL,
                                                'day', 'UTC', 'INV-{n:4}', 'create', 1)`);
    for (const day of ['2026-11-27', '2026-11-27', '2026-11-27', '2026-11-28', '2026-11-28']) {
      await q(`SELECT ordo.nextval('invoice', 'acme', $1::timestamptz)`, [`${day}T10:00:00Z`]);
    }
    await q(`SELECT * FROM ordo.take_once('invoice', 'acme', '2026-11-28T11:00:00Z', 1, 'retry-me')`);
    await q(`SELECT * FROM ordo.define_sequence('at_commit', 'gapless', 1, 1, 1, ${MAX}, false, NULL, NULL,
                                                'never', 'UTC', 'C-{scope}-{n}', 'create', 1)`);
    await q('CREATE TABLE public.invoices (tenant text NOT NULL, number bigint, text text, label text)');
    await q(`SELECT ordo.attach_sequence('at_commit', 'public.invoices', 'number', 'tenant', 'text')`);
    await q(
      `INSERT INTO public.invoices (tenant, label) VALUES ('t1', 'old-1'), ('t1', 'old-2'), ('t2', 'old-3')`,
    );

    // Batched: a node holds a range.
    await q(`SELECT * FROM ordo.define_sequence('ids', 'batched', 1, 1, 1, ${MAX}, false, 100, 5000,
                                                'never', 'UTC', NULL, 'create')`);
    rangeLast = Number((await q(`SELECT last FROM ordo.reserve('ids', $1, 1000)`, [node]))[0].last);

    // Outbox: a round half done, a batch leased and not acknowledged, messages not yet read, a
    // transaction that committed after a later one (commit order), and a dead letter.
    await q(`SELECT * FROM ordo.create_subscription('billing', 'orders', 'beginning')`);
    await q(`SELECT * FROM ordo.create_subscription('audit', 'orders', 'beginning')`);
    for (const l of ['m1', 'm2', 'm3', 'm4', 'm5']) {
      await q(`SELECT ordo.append('orders', 'placed', jsonb_build_object('label', $1::text))`, [l]);
    }
    const first = await q(
      `SELECT data, version::bigint FROM ordo.receive_any('billing', 'old-node', 3, 60000, 10)`,
    );
    expect(labels(first)).toEqual(['m1', 'm2', 'm3']);
    await q(`SELECT ordo.ack('billing', 0, 'old-node', $1, 60000)`, [first[0].version]);
    const leased = await q(`SELECT data FROM ordo.receive('billing', 0, 'old-node', 1, 1000)`);
    expect(labels(leased)).toEqual(['m4']);
    // Open across the upgrade: appended before m6, committed after it was delivered.
    slow = await old.connect();
    await slow.query('BEGIN');
    await slow.query(`SELECT ordo.append('orders', 'placed', '{"label": "m7"}')`);
    await q(`SELECT ordo.append('orders', 'placed', '{"label": "m6"}')`);
    const audit = await q(`SELECT version::bigint FROM ordo.receive_any('audit', 'old-audit', 1, 60000, 10)`);
    expect(
      (
        await q(
          `SELECT * FROM ordo.nack('audit', 0, 'old-audit', $1, 'refused', 1, true, ARRAY[0]::bigint[])`,
          [audit[0].version],
        )
      )[0].outcome,
    ).toBe('parked');

    // Throttles: a running permit on a key with a limit of its own.
    await q(`SELECT * FROM ordo.define_throttle('FOO', NULL, NULL, NULL, 5, 60000, false, 'create')`);
    await q(`SELECT * FROM ordo.set_key_limits('FOO', 'tenant-1', NULL, NULL, NULL, 1)`);
    permitId = (await q(`SELECT permit_id FROM ordo.try_acquire('FOO', 'tenant-1', 'old-node')`))[0]
      .permit_id;
    expect(permitId).toBeTruthy();

    upgraded = await ordoOn(oldUrl);
  }, 120_000);

  it('leaves a schema equal to a fresh install’s (pg_dump --schema-only), the migrations of 8080e8c kept', async () => {
    await ordoOn(freshUrl);
    const [upgradedSchema, freshSchema] = await Promise.all([schemaDump(oldUrl), schemaDump(freshUrl)]);
    expect(upgradedSchema).toContain('CREATE FUNCTION ordo.take_value(');
    expect(upgradedSchema).toBe(freshSchema);
    // The 42 of 8080e8c, and those after the baseline.
    const versions = await q('SELECT count(*)::int AS n, max(version) AS newest FROM ordo.migrations');
    const after = loadMigrations().filter((m) => m.version > BASELINE);
    expect(versions).toEqual([{ n: 42 + after.length, newest: loadMigrations().at(-1)!.version }]);
  });

  it('gapless numbers go on in both periods without gap or duplicate, and a retried key gets its number again', async () => {
    const next = (day: string) =>
      upgraded.sequences.next('invoice', { scope: 'acme', at: `${day}T12:00:00Z` });
    expect(await next('2026-11-27')).toMatchObject({ value: 4, text: 'INV-0004' });
    expect(await next('2026-11-28')).toMatchObject({ value: 4, text: 'INV-0004' });
    const again = await upgraded.sequences.next('invoice', {
      scope: 'acme',
      at: '2026-11-28T11:00:00Z',
      idempotencyKey: 'retry-me',
    });
    expect(again.value).toBe(3);
  });

  it('the table attached at commit keeps numbering from its counters, through its own trigger function', async () => {
    await q(`INSERT INTO public.invoices (tenant, label) VALUES ('t1', 'new-1'), ('t2', 'new-2')`);
    expect(await q('SELECT label, number::int, text FROM public.invoices ORDER BY label')).toEqual([
      { label: 'new-1', number: 3, text: 'C-t1-3' },
      { label: 'new-2', number: 2, text: 'C-t2-2' },
      { label: 'old-1', number: 1, text: 'C-t1-1' },
      { label: 'old-2', number: 2, text: 'C-t1-2' },
      { label: 'old-3', number: 1, text: 'C-t2-1' },
    ]);
    expect(await upgraded.sequences.attachments('at_commit')).toMatchObject([
      { table: 'invoices', column: 'number', scopeColumn: 'tenant', textColumn: 'text' },
    ]);
  });

  it('a batched sequence hands out nothing of the range the old node holds', async () => {
    const values = await upgraded.sequences.nextMany('ids', 250);
    expect(new Set(values.map((v) => v.value)).size).toBe(250);
    expect(Math.min(...values.map((v) => v.value))).toBeGreaterThan(rangeLast);
    expect((await upgraded.sequences.ranges('ids')).map((r) => r.nodeId)).toContain(node);
  });

  it('pending messages are delivered once each after the old lease lapses, an appender open across the upgrade in commit order; the dead letter stays', async () => {
    const seen: string[] = [];
    const sub = await upgraded.outbox.subscribe({
      name: 'billing',
      topic: 'orders',
      handler: async (messages) => {
        for (const m of messages) seen.push((m.data as { label: string }).label);
      },
    });
    try {
      await until('three messages delivered', () => seen.length >= 3, 20_000);
      await new Promise((r) => setTimeout(r, 300));
      expect(seen).toEqual(['m4', 'm5', 'm6']);
      await slow.query('COMMIT');
      slow.release();
      await until('the fourth message delivered', () => seen.length >= 4);
      await new Promise((r) => setTimeout(r, 300));
      expect(seen).toEqual(['m4', 'm5', 'm6', 'm7']);
      expect(await sub.lag()).toMatchObject({ messagesBehind: 0 });
    } finally {
      await sub.stop();
    }
    expect(
      (await upgraded.outbox.deadLetters('audit')).map((d) => (d.data as { label: string }).label),
    ).toEqual(['m1']);
  });

  it('the running permit holds its key’s own limit and ends normally', async () => {
    expect(await upgraded.throttles.acquire('FOO', { key: 'tenant-1' })).toMatchObject({
      granted: false,
    });
    expect(await upgraded.throttles.complete(permitId)).toMatchObject({ outcome: 'completed' });
    const again = await upgraded.throttles.acquire('FOO', { key: 'tenant-1' });
    expect(again).toMatchObject({ granted: true });
  });
});
