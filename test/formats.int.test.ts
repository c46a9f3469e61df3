// Formats are bounded by construction: what a definition allows renders in one pass, to a
// text of bounded length, from every client (library, statements, SQL).
import fc from 'fast-check';
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo } from '../src/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';

let db: TestDatabase;
let ordo: Ordo;
let sql: pg.Pool;

beforeAll(async () => {
  db = await freshDatabase();
  ordo = await createOrdo({ databaseUrl: db.url });
  sql = db.pool(2);
});

afterAll(async () => {
  await ordo?.close();
  await db?.drop();
});

const BOMBS = ['{n}-{n:{YYYY}{MM}{DD}}', '{n}-{n:{YYYY}{MM}{DD}{YY}}', '{n:{DD}}'];

/** define_sequence as another language would call it. */
const defineInSql = (name: string, format: string) =>
  sql.query(
    `SELECT * FROM ordo.define_sequence($1, 'gapless', 1, 1, 1, 9007199254740991, false, NULL, NULL, 'never', 'UTC', $2, 'create')`,
    [name, format],
  );

describe('a format that would expand itself', () => {
  it.each(BOMBS)(
    '%s is refused by define(), DEFINE SEQUENCE and SQL, and nothing is stored',
    async (format) => {
      await expect(ordo.sequences.define({ name: 'bomb', format })).rejects.toMatchObject({
        code: 'invalid_argument',
        message: expect.stringContaining("format has a stray '{'"),
      });
      // A statement with a bad format parses, and fails alone: the others of the text run.
      expect(await ordo.query(`DEFINE SEQUENCE bomb GAPLESS FORMAT '${format}'; INFO FOR DB`)).toEqual([
        { error: expect.stringContaining("a stray '{'"), code: 'invalid_argument' },
        {
          result: expect.objectContaining({
            sequences: expect.not.objectContaining({ bomb: expect.anything() }),
          }),
        },
      ]);
      await expect(defineInSql('bomb', format)).rejects.toMatchObject({
        code: 'OX003',
        message: expect.stringContaining("format has a stray '{'"),
      });
      expect(await ordo.sequences.get('bomb')).toBeNull();
    },
  );

  it('a definition stored before formats were checked renders its text once, never expanded', async () => {
    await ordo.sequences.define({ name: 'legacy', format: '{n}' });
    // As an older ordo could have stored it: the new check holds for new rows only (NOT VALID).
    await sql.query('ALTER TABLE ordo.sequences DROP CONSTRAINT sequences_format_bounded');
    await sql.query(`UPDATE ordo.sequences SET format = $1 WHERE name = 'legacy'`, [BOMBS[0]]);
    await sql.query(
      'ALTER TABLE ordo.sequences ADD CONSTRAINT sequences_format_bounded CHECK (ordo.check_format(format)) NOT VALID',
    );
    const issued = await ordo.sequences.next('legacy', { at: '2026-11-23T12:00:00Z' });
    expect(issued.text).toBe('1-{n:20261123}');
    const many = await ordo.sequences.nextMany('legacy', 40, { at: '2026-11-23T12:00:00Z' });
    expect(many.map((i) => i.text.length)).toEqual(many.map((i) => `${i.value}-{n:20261123}`.length));
    // Changing it now goes through the check.
    await expect(
      ordo.sequences.define({ name: 'legacy', format: BOMBS[1]!, overwrite: true }),
    ).rejects.toMatchObject({ code: 'invalid_argument' });
  });

  it('the rendered length is bounded: five {scope} are refused in SQL as in the library', async () => {
    const five = `${'{scope}'.repeat(5)}{n}`;
    await expect(ordo.sequences.define({ name: 'wide', format: five })).rejects.toMatchObject({
      message: expect.stringContaining('may render up to 1020 characters'),
    });
    await expect(defineInSql('wide', five)).rejects.toMatchObject({
      code: 'OX003',
      message: expect.stringContaining('may render up to 1020 characters'),
    });
    const four = `${'{scope}'.repeat(4)}{n:20}`;
    await ordo.sequences.define({ name: 'wide', format: four });
    const scope = 's'.repeat(200);
    const { text } = await ordo.sequences.next('wide', { scope });
    expect(text).toBe(`${scope.repeat(4)}${'1'.padStart(20, '0')}`);
  });
});

/** What render() must give, token by token, for a date already in the sequence's zone. */
function reference(format: string, v: number, scope: string, local: Date): string {
  const pad = (n: number, w: number) => String(n).padStart(w, '0');
  const year = local.getUTCFullYear();
  // ISO week: the week (Monday first) holding the year's first Thursday is week 1.
  const day = (local.getUTCDay() + 6) % 7;
  const thursday = new Date(local);
  thursday.setUTCDate(local.getUTCDate() - day + 3);
  const isoYear = thursday.getUTCFullYear();
  const week = 1 + Math.floor((thursday.getTime() - Date.UTC(isoYear, 0, 1)) / (7 * 86_400_000));
  return format.replace(/\{[^{}]*\}/g, (token) => {
    if (token === '{YYYY}') return pad(year, 4);
    if (token === '{YY}') return pad(year % 100, 2);
    if (token === '{MM}') return pad(local.getUTCMonth() + 1, 2);
    if (token === '{DD}') return pad(local.getUTCDate(), 2);
    if (token === '{WW}') return pad(week, 2);
    if (token === '{IYYY}') return pad(isoYear, 4);
    if (token === '{scope}') return scope;
    if (token === '{n}') return String(v);
    const width = Number(token.slice(3, -1));
    return (v < 0 ? '-' : '') + String(Math.abs(v)).padStart(width, '0');
  });
}

describe('render()', () => {
  const token = fc.constantFrom(
    '{YYYY}',
    '{YY}',
    '{MM}',
    '{DD}',
    '{WW}',
    '{IYYY}',
    '{scope}',
    '{n}',
    '{n:1}',
    '{n:6}',
    '{n:20}',
  );
  const literal = fc.string({
    unit: fc.constantFrom('A', '-', '/', ' ', 'é', '%', '_', '\\', "'", 'n', ':'),
    maxLength: 4,
  });
  const format = fc
    .tuple(fc.array(fc.oneof(token, literal), { maxLength: 8 }), token)
    .map(([pieces, last]) => [...pieces, last].join(''))
    .filter((f) => f.length <= 200 && /\{n(:\d+)?\}/.test(f));

  it('renders every valid format token by token, as the reference does', async () => {
    await fc.assert(
      fc.asyncProperty(
        format,
        fc.integer({ min: -1_000_000, max: 2 ** 53 - 1 }),
        fc.string({ maxLength: 12 }).filter((s) => !/[\uD800-\uDFFF]/.test(s) && !s.includes('\0')),
        fc.date({
          min: new Date('1901-01-01T00:00:00Z'),
          max: new Date('2199-12-31T00:00:00Z'),
          noInvalidDate: true,
        }),
        async (f, v, scope, at) => {
          const { rows } = await sql.query(
            `SELECT ordo.render($1, $2, $3, ($4::timestamptz AT TIME ZONE 'UTC')) AS text, ordo.check_format($1) AS ok`,
            [f, v, scope, at.toISOString()],
          );
          expect(rows[0].ok).toBe(true);
          expect(rows[0].text).toBe(reference(f, v, scope, at));
        },
      ),
      { numRuns: 300 },
    );
  });
});
