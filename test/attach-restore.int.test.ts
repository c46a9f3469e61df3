// Numbering at commit across a dump and restore into a new cluster (issue #13): the restored
// table goes on numbering from its counters, tables attached there are numbered beside it, and
// detach and attach keep working with the restored attachments' trigger functions. PostgreSQL
// servers of this file's own (test/support/restore.ts).
import { describe, expect, it } from 'vitest';
import { dump, restore, restoreServers, sql } from './support/restore.js';

const servers = restoreServers();

/** The rows of invoices as 'tenant number label', in order. */
async function invoices(url: string): Promise<string[]> {
  const { rows } = await sql(url, 'SELECT tenant, number, label FROM invoices ORDER BY tenant, number');
  return rows.map((r) => `${r.tenant} ${r.number} ${r.label}`);
}

/** ordo's trigger functions numbering at commit, by name. */
async function numberingFunctions(url: string): Promise<string[]> {
  const { rows } = await sql(
    url,
    `SELECT proname FROM pg_proc WHERE pronamespace = 'ordo'::regnamespace AND proname LIKE 'number\\_at\\_commit\\_%' ORDER BY 1`,
  );
  return rows.map((r) => r.proname);
}

describe('dump and restore into a new cluster', () => {
  it('a table numbered at commit goes on from its counters; attach and detach work beside it', async () => {
    const { old, restored, ordoOn } = servers;
    const a = await ordoOn(old.url);
    await a.sequences.define({ name: 'invoice', format: 'F-{scope}-{n:3}' });
    await sql(
      old.url,
      `CREATE TABLE invoices (tenant text NOT NULL, number bigint, label text);
       CREATE TABLE gone (number bigint)`,
    );
    await a.sequences.attach('invoice', {
      table: 'invoices',
      column: 'number',
      scopeColumn: 'tenant',
      textColumn: 'label',
    });
    // An attachment whose table is dropped leaves its function in the dump.
    await a.sequences.attach('invoice', { table: 'gone', column: 'number' });
    await sql(old.url, `INSERT INTO invoices (tenant) VALUES ('a'), ('b'), ('a'); DROP TABLE gone`);
    const fromOld = await numberingFunctions(old.url);
    expect(fromOld).toHaveLength(2);

    await restore(await dump(old.url, restored, 'attach'), restored.url);

    const b = await ordoOn(restored.url);
    expect(await b.sequences.attachments('invoice')).toEqual([
      {
        sequence: 'invoice',
        table: 'invoices',
        column: 'number',
        scopeColumn: 'tenant',
        textColumn: 'label',
      },
    ]);
    await sql(restored.url, `INSERT INTO invoices (tenant) VALUES ('b'), ('a')`);
    expect(await invoices(restored.url)).toEqual([
      'a 1 F-a-001',
      'a 2 F-a-002',
      'a 3 F-a-003',
      'b 1 F-b-001',
      'b 2 F-b-002',
    ]);

    // A table attached in the new cluster: its own function; the dropped table's goes.
    await sql(restored.url, 'CREATE TABLE credits (tenant text NOT NULL, number bigint)');
    await b.sequences.attach('invoice', { table: 'credits', column: 'number', scopeColumn: 'tenant' });
    const here = await numberingFunctions(restored.url);
    expect(here).toHaveLength(2);
    expect(here.filter((f) => fromOld.includes(f))).toHaveLength(1);
    await sql(
      restored.url,
      `INSERT INTO credits (tenant) VALUES ('a'); INSERT INTO invoices (tenant) VALUES ('a')`,
    );
    const { rows: credits } = await sql(restored.url, 'SELECT number FROM credits');
    expect(credits).toEqual([{ number: '4' }]);
    expect((await invoices(restored.url)).at(3)).toBe('a 5 F-a-005');

    // Detached, each drops its own function, and the other table stays numbered.
    expect(await b.sequences.detach('invoice', { table: 'credits', column: 'number' })).toBe(true);
    await sql(restored.url, `INSERT INTO invoices (tenant) VALUES ('b')`);
    expect((await invoices(restored.url)).at(-1)).toBe('b 3 F-b-003');
    expect(await b.sequences.detach('invoice', { table: 'invoices', column: 'number' })).toBe(true);
    expect(await numberingFunctions(restored.url)).toEqual([]);
  });
});
