import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Ordo } from '../src/index.js';
import { buildServer } from '../src/server/app.js';
import { type OrdoDatabase, ordoDatabase } from './support/database.js';

let t: OrdoDatabase;
let ordo: Ordo;
let sql: pg.Pool;
let S: string;

beforeAll(async () => {
  t = await ordoDatabase();
  ({ ordo, sql, S } = t);
});
afterAll(() => t?.close());

describe('fiscal years: reset yearly from any month, in the time zone', () => {
  it('India (April, Asia/Kolkata): 31 March 23:59:59 local is the old year, one second later the new one', async () => {
    const d = await ordo.sequences.define({
      name: 'fy_india',
      reset: 'year',
      yearStart: 4,
      timeZone: 'Asia/Kolkata',
      format: 'INV/{FY}-{FYE}/{n:4}',
    });
    expect(d).toMatchObject({ reset: 'year', yearStart: 4 });
    // 18:29:59 UTC is 23:59:59 IST (+05:30).
    expect(await ordo.sequences.next('fy_india', { at: '2027-03-31T18:29:59Z' })).toEqual({
      value: 1,
      text: 'INV/2026-2027/0001',
      period: '2026-04-01',
      scope: '',
    });
    expect(await ordo.sequences.next('fy_india', { at: '2026-04-01T00:00:00+05:30' })).toMatchObject({
      value: 2,
      period: '2026-04-01',
    });
    expect(await ordo.sequences.next('fy_india', { at: '2027-03-31T18:30:00Z' })).toEqual({
      value: 1,
      text: 'INV/2027-2028/0001',
      period: '2027-04-01',
      scope: '',
    });
    // 31 March 2026 belongs to the fiscal year that began in April 2025.
    expect(await ordo.sequences.next('fy_india', { at: '2026-03-31T12:00:00+05:30' })).toMatchObject({
      value: 1,
      text: 'INV/2025-2026/0001',
      period: '2025-04-01',
    });
  });

  it('US federal (October): {FYE} names the year it ends; standalone, coalesced and SQL calls agree', async () => {
    await ordo.sequences.define({
      name: 'fy_us',
      reset: 'year',
      yearStart: 10,
      timeZone: 'America/New_York',
      format: 'FY{FYE}-{n}',
    });
    const inOld = '2026-10-01T03:59:59Z'; // 23:59:59 on 30 September in New York
    const inNew = '2026-10-01T04:00:00Z';
    const issued = await Promise.all(
      Array.from({ length: 40 }, (_, i) => ordo.sequences.next('fy_us', { at: i % 2 ? inOld : inNew })),
    );
    const olds = issued.filter((x) => x.period === '2025-10-01');
    const news = issued.filter((x) => x.period === '2026-10-01');
    expect(olds.map((x) => x.value).sort((a, b) => a - b)).toEqual(
      Array.from({ length: 20 }, (_, i) => i + 1),
    );
    expect(news.map((x) => x.value).sort((a, b) => a - b)).toEqual(
      Array.from({ length: 20 }, (_, i) => i + 1),
    );
    expect(olds.every((x) => x.text.startsWith('FY2026-'))).toBe(true);
    expect(news.every((x) => x.text.startsWith('FY2027-'))).toBe(true);
    const { rows } = await sql.query(`SELECT ${S}.nextval_text('fy_us', '', $1) AS t`, [inNew]);
    expect(rows[0].t).toBe('FY2027-21');
  });

  it('numbers at commit by fiscal year', async () => {
    await ordo.sequences.define({
      name: 'fy_commit',
      reset: 'year',
      yearStart: 7,
      timeZone: 'Australia/Sydney',
      format: '{FY}/{n}',
    });
    await sql.query('CREATE TABLE fy_docs (number bigint, label text)');
    await ordo.sequences.attach('fy_commit', { table: 'fy_docs', column: 'number', textColumn: 'label' });
    for (const at of ['2026-06-30T13:59:59Z', '2026-06-30T14:00:00Z']) {
      const c = await sql.connect();
      try {
        await c.query('BEGIN');
        await c.query('INSERT INTO fy_docs DEFAULT VALUES');
        await c.query(`SET LOCAL ordo.commit_at = '${at}'`);
        await c.query('COMMIT');
      } finally {
        c.release();
      }
    }
    const { rows } = await sql.query('SELECT label FROM fy_docs ORDER BY ctid');
    // Sydney is at +10:00 in winter: 14:00 UTC on 30 June is midnight on 1 July.
    expect(rows.map((r) => r.label)).toEqual(['2025/1', '2026/1']);
  });

  it('yearStart 1 is the calendar year, {FY} = {FYE} = {YYYY}; a redefinition moves the year start', async () => {
    await ordo.sequences.define({ name: 'fy_plain', reset: 'year', format: '{FY}{FYE}{YYYY}-{n}' });
    expect((await ordo.sequences.next('fy_plain', { at: '2026-05-05T00:00:00Z' })).text).toBe(
      '202620262026-1',
    );
    const d = await ordo.sequences.define({
      name: 'fy_plain',
      reset: 'year',
      yearStart: 5,
      format: '{FY}-{n}',
      overwrite: true,
    });
    expect(d.yearStart).toBe(5);
    expect(await ordo.sequences.next('fy_plain', { at: '2026-04-30T23:59:59Z' })).toMatchObject({
      text: '2025-1',
      period: '2025-05-01',
    });
    expect((await ordo.sequences.get('fy_plain'))!.yearStart).toBe(5);
  });

  it('refuses a year start that is not a month, or without yearly reset, from every client', async () => {
    const refused = async (o: Record<string, unknown>, message: RegExp) => {
      await expect(ordo.sequences.define({ name: 'fy_bad', ...o } as never)).rejects.toMatchObject({
        code: 'invalid_argument',
        message: expect.stringMatching(message),
      });
    };
    await refused({ reset: 'year', yearStart: 13 }, /yearStart must be a whole number from 1 to 12/);
    await refused({ reset: 'year', yearStart: 0 }, /yearStart must be a whole number from 1 to 12/);
    await refused({ reset: 'year', yearStart: 4.5 }, /yearStart must be a whole number/);
    await refused({ reset: 'month', yearStart: 4 }, /yearStart needs reset: 'year' \(got reset 'month'\)/);
    await refused({ yearStart: 4 }, /yearStart needs reset: 'year'/);
    await refused({ kind: 'batched', yearStart: 4 }, /yearStart applies to gapless sequences only/);
    await refused({ format: '{FY}-{n}-{FYY}' }, /unknown token \{FYY\}/);
    expect(await ordo.sequences.get('fy_bad')).toBeNull();

    const define = (yearStart: number, reset: string) =>
      sql.query(
        `SELECT r.outcome, (r.definition).* FROM ${S}.define_sequence('fy_sql', 'gapless', 1, 1, 1, 9007199254740991, false, NULL, NULL, $2, 'UTC', NULL, 'create', $1) AS r`,
        [yearStart, reset],
      );
    await expect(define(13, 'year')).rejects.toMatchObject({
      code: 'OX003',
      message: expect.stringMatching(/from 1 \(January\) to 12/),
    });
    await expect(define(4, 'day')).rejects.toMatchObject({
      code: 'OX003',
      message: expect.stringMatching(/reset 'year' only/),
    });
    await expect(sql.query(`SELECT ${S}.check_format('{FYX}-{n}')`)).rejects.toMatchObject({ code: 'OX003' });
    expect((await define(4, 'year')).rows[0]).toMatchObject({ outcome: 'created', year_start: 4 });

    const app = await buildServer(ordo);
    try {
      const ok = await app.inject({
        method: 'PUT',
        url: '/v1/sequences/fy_http',
        payload: { reset: 'year', yearStart: 4 },
      });
      expect(ok.statusCode).toBe(200);
      expect(ok.json()).toMatchObject({ yearStart: 4 });
      const bad = await app.inject({
        method: 'PUT',
        url: '/v1/sequences/fy_http2',
        payload: { reset: 'year', yearStart: 13 },
      });
      expect(bad.statusCode).toBe(400);
      expect(bad.json()).toMatchObject({ code: 'invalid_argument' });
    } finally {
      await app.close();
    }
  });
});
