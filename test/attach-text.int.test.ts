// A number's text is rendered in two steps: its template (render_template(): every token but
// the number) before the counter is taken, and the number filled in (render_fill()) while it is
// held; render() is the same two steps in one. Whatever the format, period, time zone, fiscal
// year, scope and value, the text numbering at commit writes, and the texts that take_value()
// (next({ tx })), take() of several values and take_many() (coalesced calls) give, are exactly
// what render() gives for the same value, scope and instant.
import fc from 'fast-check';
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FORMAT_TOKENS, type Ordo, type ResetPeriod } from '../src/index.js';
import { type OrdoDatabase, ordoDatabase } from './support/database.js';

let t: OrdoDatabase;
let ordo: Ordo;
let sql: pg.Pool;

beforeAll(async () => {
  t = await ordoDatabase({ poolSize: 2, sqlPoolSize: 2 });
  ({ ordo, sql } = t);
});
afterAll(() => t?.close());

interface Case {
  format: string;
  reset: ResetPeriod;
  yearStart: number;
  timeZone: string;
  start: number;
  scope: string;
  at: Date;
}

/** A value, the scope it was taken for and the text it was given, as some taker gave them. */
interface Issued {
  through: string;
  value: string;
  scope: string;
  text: string;
}

let runs = 0;

/** Every taker's texts for one definition, each beside what render() gives for its value. */
async function issuedAndRendered(c: Case): Promise<{ issued: Issued[]; rendered: string[] }> {
  const n = ++runs;
  const name = `text_${n}`;
  const table = `texts_${n}`;
  // Two scopes: each counter's first number is decided by take(), its next ones by take_value().
  const scopes = [c.scope, `${c.scope}{n}`];
  await ordo.sequences.define({
    name,
    format: c.format,
    reset: c.reset,
    yearStart: c.reset === 'year' ? c.yearStart : undefined,
    timeZone: c.timeZone,
    start: c.start,
    minValue: -1000,
  });
  await sql.query(`CREATE TABLE ${table} (id bigserial PRIMARY KEY, tenant text, number bigint, label text)`);
  await ordo.sequences.attach(name, { table, column: 'number', scopeColumn: 'tenant', textColumn: 'label' });

  const at = c.at.toISOString();
  const issued: Issued[] = [];
  const client = await sql.connect();
  try {
    await client.query('BEGIN');
    await client.query(`SELECT set_config('ordo.commit_at', $1, true)`, [at]);
    await client.query(
      `INSERT INTO ${table} (tenant) SELECT s FROM unnest($1::text[]) AS s, generate_series(1, 3)`,
      [scopes],
    );
    await client.query('COMMIT');

    await client.query('BEGIN');
    for (const scope of scopes) {
      const { rows } = await client.query('SELECT ordo.take_value($1, $2, $3) AS r', [name, scope, at]);
      issued.push({ through: 'take_value', value: rows[0].r[0], scope, text: rows[0].r[1] });
    }
    const { rows: several } = await client.query(
      'SELECT t.value::text AS value, t.text FROM ordo.take($1, $2, $3, 3) AS t',
      [name, scopes[0], at],
    );
    for (const r of several)
      issued.push({ through: 'take', value: r.value, scope: scopes[0]!, text: r.text });
    const { rows: batched } = await client.query(
      `SELECT m.request, m.value::text AS value, m.text
         FROM ordo.take_many(ARRAY[$1, $1], $2::text[], ARRAY[$3, $3]::timestamptz[], ARRAY[2, 1]) AS m`,
      [name, scopes, at],
    );
    for (const r of batched) {
      issued.push({ through: 'take_many', value: r.value, scope: scopes[r.request - 1]!, text: r.text });
    }
    await client.query('COMMIT');
  } catch (e) {
    await client.query('ROLLBACK').catch(() => undefined);
    throw e;
  } finally {
    client.release();
  }
  const { rows: committed } = await sql.query(
    `SELECT number::text AS value, tenant AS scope, label AS text FROM ${table} ORDER BY id`,
  );
  for (const r of committed) issued.unshift({ through: 'at commit', ...r });

  const { rows } = await sql.query(
    `SELECT ordo.render(d.format, v.value, v.scope, $2::timestamptz AT TIME ZONE d.time_zone, d.year_start) AS text
       FROM unnest($3::bigint[], $4::text[]) WITH ORDINALITY AS v(value, scope, i)
       JOIN ordo.sequences AS d ON d.name = $1
      ORDER BY v.i`,
    [name, at, issued.map((i) => i.value), issued.map((i) => i.scope)],
  );
  await sql.query(`DROP TABLE ${table}`);
  return { issued, rendered: rows.map((r) => r.text as string) };
}

/** Each issued text beside render()'s, labelled by its taker, so that a failure names it. */
const pairs = ({ issued, rendered }: { issued: Issued[]; rendered: string[] }) => ({
  issued: issued.map((i) => `${i.through} ${i.value}: ${i.text}`),
  rendered: issued.map((i, k) => `${i.through} ${i.value}: ${rendered[k]}`),
});

describe('the text written at commit is what render() gives', () => {
  // Every token of the grammar, {n:W} at its narrowest, a middle and its widest width.
  const token = fc.constantFrom(...FORMAT_TOKENS.filter((t) => t !== '{n:W}'), '{n:1}', '{n:5}', '{n:20}');
  const literal = fc.string({
    unit: fc.constantFrom('A', '-', '/', ' ', 'é', '%', '_', '\\', "'", 'n', ':', '$', '1'),
    maxLength: 4,
  });
  const format = fc
    .tuple(fc.array(fc.oneof(token, literal), { maxLength: 8 }), fc.constantFrom('{n}', '{n:5}', '{n:20}'))
    .map(([pieces, last]) => [...pieces, last].join(''))
    .filter((f) => f.length <= 200 && (f.match(/\{scope\}/g) ?? []).length <= 3);
  const scope = fc.oneof(
    fc.constantFrom('', 'tenant-1', '{n}', '{scope}', '%s', '{n:5}{'),
    fc.string({ maxLength: 10 }).filter((s) => !/[\uD800-\uDFFF]/.test(s) && !s.includes('\0')),
  );
  const definitionAndCall = fc.record({
    format,
    reset: fc.constantFrom<ResetPeriod>('never', 'day', 'week', 'month', 'year'),
    yearStart: fc.integer({ min: 1, max: 12 }),
    timeZone: fc.constantFrom(
      'UTC',
      'Europe/Berlin',
      'America/St_Johns',
      'Asia/Kathmandu',
      'Pacific/Kiritimati',
    ),
    start: fc.integer({ min: -4, max: 99_999 }),
    scope,
    at: fc.date({
      min: new Date('1901-01-01T00:00:00Z'),
      max: new Date('2199-12-31T00:00:00Z'),
      noInvalidDate: true,
    }),
  });

  it('for any format, period, zone, fiscal year, scope and value, from every taker', async () => {
    await fc.assert(
      fc.asyncProperty(definitionAndCall, async (c) => {
        const result = await issuedAndRendered(c);
        expect(result.issued).toHaveLength(6 + 2 + 3 + 3);
        const { issued, rendered } = pairs(result);
        expect(issued).toEqual(rendered);
      }),
      { numRuns: 60 },
    );
  });

  it('several number tokens, negative values and a scope made of tokens', async () => {
    const result = await issuedAndRendered({
      format: '{n}/{scope}/{n:3}-{FY}{FYE}{n:20}',
      reset: 'year',
      yearStart: 4,
      timeZone: 'Asia/Kathmandu',
      start: -2,
      scope: '{n}{scope}',
      at: new Date('2026-03-31T20:00:00Z'),
    });
    const { issued, rendered } = pairs(result);
    expect(issued).toEqual(rendered);
    // 2026-04-01 in Kathmandu: the fiscal year 2026–2027; the commit numbered -2, -1, 0 per scope.
    expect(issued).toContain(`at commit -2: -2/{n}{scope}/-002-20262027-${'2'.padStart(20, '0')}`);
    expect(issued).toContain(`at commit 0: 0/{n}{scope}{n}/000-20262027${'0'.padStart(20, '0')}`);
  });
});
