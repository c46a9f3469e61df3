import fc from 'fast-check';
import type pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { createOrdo, type Ordo, OrdoError } from '../src/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';

let db: TestDatabase;
let ordo: Ordo;
let sql: pg.Pool;
/** The quoted schema holding ordo's SQL functions ('"ordo"' unless ORDO_SCHEMA says otherwise). */
let S: string;

beforeAll(async () => {
  db = await freshDatabase();
  ordo = await createOrdo({ databaseUrl: db.url });
  sql = db.pool(25);
  S = `"${ordo.schema}"`;
});
afterAll(async () => {
  await ordo?.close();
  await db?.drop();
});

/** value and period of one call, for compact assertions. */
async function take(name: string, at: string, scope?: string) {
  const r = await ordo.sequences.next(name, scope === undefined ? { at } : { at, scope });
  return { value: r.value, period: r.period };
}

describe('periods follow the local calendar of the time zone', () => {
  it('23:30 UTC is already the next day in Tokyo', async () => {
    await ordo.sequences.define({
      name: 'p_tokyo',
      reset: 'day',
      timeZone: 'Asia/Tokyo',
      format: '{YYYY}{MM}{DD}-{n:3}',
    });
    const late = await ordo.sequences.next('p_tokyo', { at: '2026-03-01T23:30:00Z' });
    expect(late).toEqual({ value: 1, text: '20260302-001', period: '2026-03-02', scope: '' });

    const early = await ordo.sequences.next('p_tokyo', { at: '2026-03-01T14:59:00Z' });
    expect(early).toEqual({ value: 1, text: '20260301-001', period: '2026-03-01', scope: '' });

    // The same instant written with an offset, or as a Date, is the same period.
    expect(await take('p_tokyo', '2026-03-02T08:30:00+09:00')).toEqual({ value: 2, period: '2026-03-02' });
    const asDate = await ordo.sequences.next('p_tokyo', { at: new Date('2026-03-01T15:00:00Z') });
    expect(asDate).toMatchObject({ value: 3, period: '2026-03-02', text: '20260302-003' });
  });

  it('Paris spring-forward: midnight splits days, the skipped hour does not', async () => {
    await ordo.sequences.define({ name: 'p_paris_spring', reset: 'day', timeZone: 'Europe/Paris' });
    // 23:59:59 CET on the 28th, then midnight of the 29th.
    expect(await take('p_paris_spring', '2026-03-28T22:59:59Z')).toEqual({ value: 1, period: '2026-03-28' });
    expect(await take('p_paris_spring', '2026-03-28T23:00:00Z')).toEqual({ value: 1, period: '2026-03-29' });
    // 01:59 CET, then 03:00 CEST: one second apart in local wall time terms, same day.
    expect(await take('p_paris_spring', '2026-03-29T00:59:00Z')).toEqual({ value: 2, period: '2026-03-29' });
    expect(await take('p_paris_spring', '2026-03-29T01:00:00Z')).toEqual({ value: 3, period: '2026-03-29' });
    // The 29th has 23 hours: 22:00Z is already midnight of the 30th (CEST).
    expect(await take('p_paris_spring', '2026-03-29T21:59:59Z')).toEqual({ value: 4, period: '2026-03-29' });
    expect(await take('p_paris_spring', '2026-03-29T22:00:00Z')).toEqual({ value: 1, period: '2026-03-30' });
  });

  it('Paris fall-back: the 25-hour day is one period, 02:30 twice included', async () => {
    await ordo.sequences.define({
      name: 'p_paris_fall',
      reset: 'day',
      timeZone: 'Europe/Paris',
      format: '{DD}/{MM}-{n}',
    });
    // 02:30 CEST, then 02:30 CET an hour later.
    const first = await ordo.sequences.next('p_paris_fall', { at: '2026-10-25T00:30:00Z' });
    const second = await ordo.sequences.next('p_paris_fall', { at: '2026-10-25T01:30:00Z' });
    expect(first).toEqual({ value: 1, text: '25/10-1', period: '2026-10-25', scope: '' });
    expect(second).toEqual({ value: 2, text: '25/10-2', period: '2026-10-25', scope: '' });
    // 22:59:59Z is 23:59:59 CET, still the 25th; 23:00Z is midnight of the 26th.
    expect(await take('p_paris_fall', '2026-10-25T22:59:59Z')).toEqual({ value: 3, period: '2026-10-25' });
    const next = await ordo.sequences.next('p_paris_fall', { at: '2026-10-25T23:00:00Z' });
    expect(next).toEqual({ value: 1, text: '26/10-1', period: '2026-10-26', scope: '' });
  });

  it('ISO weeks run across the year end', async () => {
    await ordo.sequences.define({ name: 'p_week', reset: 'week', format: '{IYYY}-W{WW}-{n}' });
    const mon = await ordo.sequences.next('p_week', { at: '2026-12-28T00:00:00Z' });
    const thu = await ordo.sequences.next('p_week', { at: '2026-12-31T12:00:00Z' });
    const fri = await ordo.sequences.next('p_week', { at: '2027-01-01T00:00:00Z' });
    const sun = await ordo.sequences.next('p_week', { at: '2027-01-03T23:59:59Z' });
    expect([mon, thu, fri, sun]).toEqual([
      { value: 1, text: '2026-W53-1', period: '2026-12-28', scope: '' },
      { value: 2, text: '2026-W53-2', period: '2026-12-28', scope: '' },
      { value: 3, text: '2026-W53-3', period: '2026-12-28', scope: '' },
      { value: 4, text: '2026-W53-4', period: '2026-12-28', scope: '' },
    ]);
    const nextMon = await ordo.sequences.next('p_week', { at: '2027-01-04T00:00:00Z' });
    expect(nextMon).toEqual({ value: 1, text: '2027-W01-1', period: '2027-01-04', scope: '' });
  });

  it('{YYYY} is the calendar year and {IYYY} the ISO week-year', async () => {
    await ordo.sequences.define({ name: 'p_week_years', reset: 'week', format: '{YYYY}/{IYYY}-W{WW}-{n}' });
    // Monday 29 December 2025 belongs to ISO week 1 of 2026.
    const r = await ordo.sequences.next('p_week_years', { at: '2025-12-29T10:00:00Z' });
    expect(r).toEqual({ value: 1, text: '2025/2026-W01-1', period: '2025-12-29', scope: '' });
  });

  it('weeks start on Monday in the local time zone', async () => {
    await ordo.sequences.define({ name: 'p_week_tokyo', reset: 'week', timeZone: 'Asia/Tokyo' });
    // Sunday 2026-03-01 20:00 UTC is Monday 05:00 in Tokyo: a new week there.
    expect(await take('p_week_tokyo', '2026-03-01T14:59:59Z')).toEqual({ value: 1, period: '2026-02-23' });
    expect(await take('p_week_tokyo', '2026-03-01T20:00:00Z')).toEqual({ value: 1, period: '2026-03-02' });
  });

  it('a yearly reset happens at local midnight of 31 December', async () => {
    await ordo.sequences.define({
      name: 'p_year_paris',
      reset: 'year',
      timeZone: 'Europe/Paris',
      format: 'INV-{YYYY}-{n:6}',
    });
    const last = await ordo.sequences.next('p_year_paris', { at: '2026-12-31T22:59:59Z' });
    expect(last).toEqual({ value: 1, text: 'INV-2026-000001', period: '2026-01-01', scope: '' });
    const first = await ordo.sequences.next('p_year_paris', { at: '2026-12-31T23:00:00Z' });
    expect(first).toEqual({ value: 1, text: 'INV-2027-000001', period: '2027-01-01', scope: '' });
    // The old year can still be numbered (a late invoice dated in 2026) and continues at 2.
    const late = await ordo.sequences.next('p_year_paris', { at: '2026-06-15T12:00:00Z' });
    expect(late).toEqual({ value: 2, text: 'INV-2026-000002', period: '2026-01-01', scope: '' });
  });

  it('a monthly reset in Los Angeles follows Pacific time', async () => {
    await ordo.sequences.define({ name: 'p_month_la', reset: 'month', timeZone: 'America/Los_Angeles' });
    expect(await take('p_month_la', '2026-02-01T07:59:00Z')).toEqual({ value: 1, period: '2026-01-01' });
    expect(await take('p_month_la', '2026-02-01T08:00:00Z')).toEqual({ value: 1, period: '2026-02-01' });
    expect(await take('p_month_la', '2026-01-01T08:00:00Z')).toEqual({ value: 2, period: '2026-01-01' });
    // Daylight saving time: March 1st midnight is still PST (UTC-8), April 1st is PDT (UTC-7).
    expect(await take('p_month_la', '2026-04-01T06:59:59Z')).toEqual({ value: 1, period: '2026-03-01' });
    expect(await take('p_month_la', '2026-04-01T07:00:00Z')).toEqual({ value: 1, period: '2026-04-01' });
  });
});

describe('the period of a local time', () => {
  /** The first day of the period holding `local` (a wall-clock time, read as UTC fields). */
  function periodOf(reset: string, yearStart: number, local: Date): string {
    const day = (y: number, m: number, d: number) => new Date(Date.UTC(y, m, d)).toISOString().slice(0, 10);
    const [y, m, d] = [local.getUTCFullYear(), local.getUTCMonth(), local.getUTCDate()];
    switch (reset) {
      case 'never':
        return '-infinity';
      case 'day':
        return day(y, m, d);
      case 'week':
        // ISO weeks start on Monday (getUTCDay: 0 is Sunday).
        return day(y, m, d - ((local.getUTCDay() + 6) % 7));
      case 'month':
        return day(y, m, 1);
      default:
        return day(m + 1 >= yearStart ? y : y - 1, yearStart - 1, 1);
    }
  }

  it('period_start() is the first day of the local day, week, month or (fiscal) year, for any time', async () => {
    const definition = fc.oneof(
      fc.constantFrom('never', 'day', 'week', 'month').map((reset) => ({ reset, yearStart: 1 })),
      fc.integer({ min: 1, max: 12 }).map((yearStart) => ({ reset: 'year', yearStart })),
    );
    const local = fc.date({
      min: new Date('1901-01-01T00:00:00Z'),
      max: new Date('2199-12-31T23:59:59.999Z'),
      noInvalidDate: true,
    });
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.tuple(definition, local), { minLength: 1, maxLength: 200 }),
        async (cases) => {
          const { rows } = await sql.query(
            `SELECT ${S}.period_start(c.reset, c.year_start, c.local)::text AS period
             FROM unnest($1::text[], $2::integer[], $3::timestamp[]) WITH ORDINALITY AS c (reset, year_start, local, i)
            ORDER BY c.i`,
            [
              cases.map(([def]) => def.reset),
              cases.map(([def]) => def.yearStart),
              cases.map(([, at]) => at.toISOString().replace('T', ' ').replace('Z', '')),
            ],
          );
          expect(rows.map((r) => r.period)).toEqual(
            cases.map(([def, at]) => periodOf(def.reset, def.yearStart, at)),
          );
        },
      ),
      { numRuns: 50 },
    );
  });
});

describe('never, scopes and formats', () => {
  it("reset 'never' has no period and numbers across years", async () => {
    await ordo.sequences.define({ name: 'p_never', format: '{YYYY}-{n}' });
    const a = await ordo.sequences.next('p_never', { at: '2025-12-31T23:59:59Z' });
    const b = await ordo.sequences.next('p_never', { at: '2026-01-01T00:00:00Z' });
    const c = await ordo.sequences.next('p_never', { at: '2031-07-01T00:00:00Z' });
    expect([a, b, c]).toEqual([
      { value: 1, text: '2025-1', period: null, scope: '' },
      { value: 2, text: '2026-2', period: null, scope: '' },
      { value: 3, text: '2031-3', period: null, scope: '' },
    ]);
  });

  it('scopes number independently', async () => {
    await ordo.sequences.define({ name: 'p_scoped', reset: 'year' });
    const at = '2026-05-05T05:05:05Z';
    expect(await take('p_scoped', at, 'a')).toEqual({ value: 1, period: '2026-01-01' });
    expect(await take('p_scoped', at, 'b')).toEqual({ value: 1, period: '2026-01-01' });
    expect(await take('p_scoped', at, 'a')).toEqual({ value: 2, period: '2026-01-01' });
    expect(await take('p_scoped', at)).toEqual({ value: 1, period: '2026-01-01' });
    expect(await take('p_scoped', at, 'b')).toEqual({ value: 2, period: '2026-01-01' });
    const r = await ordo.sequences.next('p_scoped', { at, scope: 'a' });
    expect(r.scope).toBe('a');
    expect(r.value).toBe(3);
  });

  it('renders {YY} {MM} {DD} {scope} {n} and {n:W}', async () => {
    await ordo.sequences.define({ name: 'p_fmt', format: '{YY}{MM}{DD}/{scope}/{n}/{n:3}' });
    const r = await ordo.sequences.next('p_fmt', { at: '2027-04-09T12:00:00Z', scope: 'acme' });
    expect(r).toEqual({ value: 1, text: '270409/acme/1/001', period: null, scope: 'acme' });
  });

  it('{n:W} pads but never truncates', async () => {
    await ordo.sequences.define({ name: 'p_wide', start: 1234, format: '#{n:3}' });
    expect((await ordo.sequences.next('p_wide', { at: '2026-01-01T00:00:00Z' })).text).toBe('#1234');
    await ordo.sequences.define({ name: 'p_pad', start: 7, format: '#{n:5}' });
    expect((await ordo.sequences.next('p_pad', { at: '2026-01-01T00:00:00Z' })).text).toBe('#00007');
  });

  it('respects start and increment, in every period', async () => {
    await ordo.sequences.define({ name: 'p_step', start: 100, increment: 10, reset: 'day' });
    const day1 = '2026-06-01T12:00:00Z';
    expect(await ordo.nextval('p_step', { at: day1 })).toBe(100);
    expect(await ordo.nextval('p_step', { at: day1 })).toBe(110);
    expect(await ordo.nextval('p_step', { at: day1 })).toBe(120);
    const many = await ordo.sequences.nextMany('p_step', 3, { at: day1 });
    expect(many.map((r) => r.value)).toEqual([130, 140, 150]);
    expect(await ordo.nextval('p_step', { at: '2026-06-02T12:00:00Z' })).toBe(100);
  });

  it('a scope containing tokens is rendered literally', async () => {
    await ordo.sequences.define({ name: 'p_literal', reset: 'year', format: '{scope}:{n:2}' });
    const scope = '{n}{YYYY}{n:4}{scope}';
    const r = await ordo.sequences.next('p_literal', { at: '2026-02-02T00:00:00Z', scope });
    expect(r).toEqual({ value: 1, text: '{n}{YYYY}{n:4}{scope}:01', period: '2026-01-01', scope });
  });
});

describe('cycle', () => {
  it('wraps to the start after maxValue', async () => {
    await ordo.sequences.define({ name: 'p_cycle', start: 1, maxValue: 3, cycle: true });
    const values: number[] = [];
    for (let i = 0; i < 5; i++) values.push(await ordo.nextval('p_cycle'));
    expect(values).toEqual([1, 2, 3, 1, 2]);
  });

  it('nextMany across the wrap gives the same order as one by one', async () => {
    await ordo.sequences.define({ name: 'p_cycle_many', start: 1, maxValue: 3, cycle: true });
    const fresh = await ordo.sequences.nextMany('p_cycle_many', 5);
    expect(fresh.map((r) => r.value)).toEqual([1, 2, 3, 1, 2]);
    // Continues from 2, wrapping again in the middle of the batch.
    const more = await ordo.sequences.nextMany('p_cycle_many', 4);
    expect(more.map((r) => r.value)).toEqual([3, 1, 2, 3]);
    expect(await ordo.nextval('p_cycle_many')).toBe(1);
  });

  it('wraps to minValue with an increment', async () => {
    await ordo.sequences.define({
      name: 'p_cycle_min',
      start: 5,
      minValue: 0,
      maxValue: 9,
      increment: 2,
      cycle: true,
    });
    const many = await ordo.sequences.nextMany('p_cycle_min', 7);
    expect(many.map((r) => r.value)).toEqual([5, 7, 9, 0, 2, 4, 6]);
  });

  it('without cycle, the end is sequence_exhausted and nothing is skipped', async () => {
    await ordo.sequences.define({ name: 'p_nocycle', start: 1, maxValue: 2 });
    expect(await ordo.nextval('p_nocycle')).toBe(1);
    const err = await ordo.sequences.nextMany('p_nocycle', 2).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OrdoError);
    expect((err as OrdoError).code).toBe('sequence_exhausted');
    expect(await ordo.nextval('p_nocycle')).toBe(2);
  });
});

describe('SQL surface', () => {
  it('nextval and nextval_text from plain SQL', async () => {
    await ordo.sequences.define({
      name: 'p_sql',
      reset: 'month',
      timeZone: 'Europe/Paris',
      format: 'S-{n:4}',
    });
    // Without at: the database's now(). Scope 'now' is kept apart from the dated calls below.
    const a = await sql.query(`SELECT ${S}.nextval('p_sql', 'now') AS v`);
    expect(a.rows[0].v).toBe('1'); // bigint comes back as text from pg
    const b = await sql.query(`SELECT ${S}.nextval('p_sql', 'now') AS v`);
    expect(b.rows[0].v).toBe('2');
    const other = await sql.query(`SELECT ${S}.nextval('p_sql', 'other') AS v`);
    expect(other.rows[0].v).toBe('1');

    const at = '2026-01-31T23:30:00Z'; // already February in Paris
    const t1 = await sql.query(`SELECT ${S}.nextval_text('p_sql', 's', $1::timestamptz) AS t`, [at]);
    const t2 = await sql.query(`SELECT ${S}.nextval_text('p_sql', 's', $1::timestamptz) AS t`, [at]);
    expect([t1.rows[0].t, t2.rows[0].t]).toEqual(['S-0001', 'S-0002']);
    const n = await sql.query(`SELECT ${S}.nextval('p_sql', 's', $1::timestamptz) AS v`, [at]);
    expect(n.rows[0].v).toBe('3');
    // The library sees the same counter.
    expect(await ordo.sequences.next('p_sql', { scope: 's', at })).toEqual({
      value: 4,
      text: 'S-0004',
      period: '2026-02-01',
      scope: 's',
    });
    // A value taken in a rolled-back SQL transaction is given back.
    const c = await sql.connect();
    try {
      await c.query('BEGIN');
      const r = await c.query(`SELECT ${S}.nextval('p_sql', 's', $1::timestamptz) AS v`, [at]);
      expect(r.rows[0].v).toBe('5');
      await c.query('ROLLBACK');
    } finally {
      c.release();
    }
    expect(await ordo.nextval('p_sql', { scope: 's', at })).toBe(5);
  });

  it("an unknown sequence raises OX001 'The sequence ... does not exist'", async () => {
    const err = await sql.query(`SELECT ${S}.nextval('nope', 's')`).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'OX001', message: "The sequence 'nope' does not exist" });
    const errText = await sql
      .query(`SELECT ${S}.nextval_text('nope', '', '2026-01-01T00:00:00Z')`)
      .catch((e: unknown) => e);
    expect(errText).toMatchObject({ code: 'OX001', message: "The sequence 'nope' does not exist" });
    const viaApi = await ordo.nextval('nope').catch((e: unknown) => e);
    expect(viaApi).toBeInstanceOf(OrdoError);
    expect(viaApi).toMatchObject({
      code: 'sequence_not_found',
      message: "The sequence 'nope' does not exist",
    });
  });

  it('as a column DEFAULT, concurrent transactions with rollbacks leave no gap', async () => {
    await ordo.sequences.define({ name: 'ticket' });
    await ordo.sequences.define({ name: 'ticket_txt', format: 'T-{n:4}' });
    await sql.query(`CREATE TABLE tickets (
      id bigint PRIMARY KEY DEFAULT ${S}.nextval('ticket'),
      code text NOT NULL UNIQUE DEFAULT ${S}.nextval_text('ticket_txt'),
      label text
    )`);

    const workers = 20;
    // Every worker on a connection of its own, all checked out before any starts.
    const clients = await Promise.all(Array.from({ length: workers }, () => sql.connect()));
    let outcomes: { i: number; id: number; code: string; committed: boolean }[];
    try {
      outcomes = await Promise.all(
        clients.map(async (c, i) => {
          const rollback = i % 3 === 2;
          await c.query('BEGIN');
          try {
            const { rows } = await c.query('INSERT INTO tickets (label) VALUES ($1) RETURNING id, code', [
              `w${i}`,
            ]);
            // Hold the counter's lock a little so that other inserts queue behind this one.
            await c.query('SELECT pg_sleep(0.01)');
            await c.query(rollback ? 'ROLLBACK' : 'COMMIT');
            return { i, id: Number(rows[0].id), code: rows[0].code as string, committed: !rollback };
          } catch (e) {
            await c.query('ROLLBACK').catch(() => undefined);
            throw e;
          }
        }),
      );
    } finally {
      for (const c of clients) c.release();
    }

    const committed = outcomes.filter((o) => o.committed);
    const k = committed.length;
    expect(k).toBe(14);
    const expectedIds = Array.from({ length: k }, (_, j) => j + 1);
    const expectedCodes = expectedIds.map((n) => `T-${String(n).padStart(4, '0')}`);

    const { rows } = await sql.query('SELECT id, code, label FROM tickets ORDER BY id');
    expect(rows.map((r) => Number(r.id))).toEqual(expectedIds);
    expect(rows.map((r) => r.code).sort()).toEqual(expectedCodes);
    // Exactly the committed workers' rows, with the id and code each was told.
    expect(rows.map((r) => r.label).sort()).toEqual(committed.map((o) => `w${o.i}`).sort());
    for (const o of committed) {
      expect(rows.find((r) => r.label === `w${o.i}`)).toMatchObject({ id: String(o.id), code: o.code });
    }
    // The next insert takes k + 1: rolled-back numbers were given back, not burnt.
    const after = await sql.query('INSERT INTO tickets (label) VALUES ($1) RETURNING id, code', ['after']);
    expect(after.rows[0]).toEqual({ id: String(k + 1), code: `T-${String(k + 1).padStart(4, '0')}` });
  });
});

describe('the Node clock is never trusted', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it('without at, the period comes from the database clock', async () => {
    await ordo.sequences.define({ name: 'p_clock', reset: 'year', format: '{YYYY}-{n}' });
    vi.useFakeTimers({ toFake: ['Date'] });
    vi.setSystemTime(new Date('1999-06-15T12:00:00Z'));
    expect(new Date().getUTCFullYear()).toBe(1999); // the fake clock is in effect

    const r = await ordo.sequences.next('p_clock');
    const v = await ordo.nextval('p_clock');
    const many = await ordo.sequences.nextMany('p_clock', 2);
    vi.useRealTimers();

    const { rows } = await sql.query(
      `SELECT date_trunc('year', now() AT TIME ZONE 'UTC')::date::text AS period,
              extract(year FROM now() AT TIME ZONE 'UTC')::int AS year`,
    );
    const { period, year } = rows[0] as { period: string; year: number };
    expect(period).not.toBe('1999-01-01');
    expect(r).toEqual({ value: 1, text: `${year}-1`, period, scope: '' });
    expect(v).toBe(2);
    expect(many).toEqual([
      { value: 3, text: `${year}-3`, period, scope: '' },
      { value: 4, text: `${year}-4`, period, scope: '' },
    ]);
    // Nothing was counted in 1999.
    const old = await sql.query(`SELECT count(*)::int AS n FROM ${S}.counters WHERE sequence = 'p_clock'`);
    expect(old.rows[0].n).toBe(1);
  });
});
