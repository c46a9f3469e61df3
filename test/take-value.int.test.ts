// take_value() is take() for one value, in a statement with no set-returning function or join
// to plan, and next({ tx }) sends it. It must give exactly what take(…, 1) gives: the same
// value, text and period, for every format token, reset, time zone, fiscal year, increment,
// cycle and exhaustion, and the same errors. Each series of calls runs twice in a transaction
// rolled back, once through each function, from the same counters.
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, fromRawSql, type Ordo } from '../src/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';

let db: TestDatabase;
let ordo: Ordo;
let pool: pg.Pool;

beforeAll(async () => {
  db = await freshDatabase('ordo_take_value');
  ordo = await createOrdo({ databaseUrl: db.url });
  pool = db.pool(2);
});
afterAll(async () => {
  await ordo?.close();
  await db?.drop();
});

interface Call {
  name: string;
  scope?: string | null;
  /** null: the transaction's now(). */
  at?: string | null;
}

type Outcome = { value: string; text: string; period: string | null } | { error: string; message: string };

const THROUGH = {
  take: `SELECT t.value::text AS value, t.text, t.period
           FROM ordo.take($1, $2, coalesce($3::timestamptz, now()), 1) AS t`,
  take_value: `SELECT r[1] AS value, r[2] AS text, r[3] AS period
                 FROM (SELECT ordo.take_value($1, $2, $3) AS r) AS issued`,
} as const;

/** The calls in order, each in a savepoint (an error leaves the others going), then rolled back. */
async function outcomes(through: keyof typeof THROUGH, calls: Call[]): Promise<Outcome[]> {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const out: Outcome[] = [];
    for (const c of calls) {
      await client.query('SAVEPOINT call');
      try {
        const { rows } = await client.query(THROUGH[through], [
          c.name,
          c.scope === undefined ? '' : c.scope,
          c.at ?? null,
        ]);
        expect(rows).toHaveLength(1);
        out.push(rows[0]);
        await client.query('RELEASE SAVEPOINT call');
      } catch (e) {
        const error = e as { code?: string; message: string };
        if (!error.code) throw e;
        out.push({ error: error.code, message: error.message });
        await client.query('ROLLBACK TO SAVEPOINT call');
      }
    }
    return out;
  } finally {
    await client.query('ROLLBACK');
    client.release();
  }
}

async function same(calls: Call[]): Promise<Outcome[]> {
  const fast = await outcomes('take_value', calls);
  expect(fast).toEqual(await outcomes('take', calls));
  return fast;
}

const values = (out: Outcome[]) => out.map((o) => ('value' in o ? Number(o.value) : o.error));

describe('take_value() gives what take() gives', () => {
  it('every format token, across local midnights, weeks, months and fiscal years, in several zones', async () => {
    const defs = [
      { name: 'tv_never', format: null },
      { name: 'tv_day', reset: 'day', timeZone: 'Europe/Paris', format: '{YYYY}{MM}{DD}-{n:4}' },
      { name: 'tv_week', reset: 'week', timeZone: 'America/New_York', format: '{IYYY}-W{WW}-{n}' },
      { name: 'tv_month', reset: 'month', timeZone: 'Asia/Kolkata', format: '{scope}/{YY}{MM}/{n:2}' },
      { name: 'tv_year', reset: 'year', timeZone: 'Pacific/Auckland', format: 'INV-{YYYY}-{n:6}' },
      {
        name: 'tv_fiscal',
        reset: 'year',
        yearStart: 4,
        timeZone: 'Europe/London',
        format: '{FY}/{FYE}-{n:3}',
      },
    ] as const;
    for (const d of defs) await ordo.sequences.define({ ...d, format: d.format ?? undefined });
    const instants = [
      '2025-12-31T22:59:59Z',
      '2025-12-31T23:00:00Z',
      '2026-01-01T10:59:59Z',
      '2026-01-01T11:00:00Z',
      '2026-03-31T23:30:00Z',
      '2026-04-01T00:00:00Z',
      '2026-12-27T12:00:00Z',
      '2026-12-28T05:00:00Z',
      '0001-01-01T00:00:00Z',
      '9999-12-31T23:59:59Z',
    ];
    const scopes = ['', 'acme', 'a,b', '"quoted"', '{n}', 'back\\slash', 'NULL', 'é 😀', ' {scope} '];
    const calls: Call[] = [];
    for (const d of defs) {
      for (const at of instants) for (const scope of scopes) calls.push({ name: d.name, scope, at });
      // A second round: the rows exist, so the upsert updates.
      for (const at of instants) calls.push({ name: d.name, scope: 'acme', at });
      calls.push({ name: d.name, scope: 'acme', at: null }, { name: d.name, scope: 'acme', at: null });
    }
    const out = await same(calls);
    expect(out.every((o) => 'value' in o)).toBe(true);
    expect(out).toContainEqual({ value: '1', text: '20260101-0001', period: '2026-01-01' });
    expect(out).toContainEqual({ value: '2', text: '"quoted"/2604/02', period: '2026-04-01' });
    expect(out).toContainEqual({ value: '1', text: '2025/2026-001', period: '2025-04-01' });
  });

  it('start, increment, minimum, maximum, cycle and exhaustion', async () => {
    await ordo.sequences.define({ name: 'tv_step', start: 10, increment: 5, maxValue: 30 });
    await ordo.sequences.define({ name: 'tv_cycle', minValue: 1, maxValue: 3, cycle: true });
    await ordo.sequences.define({
      name: 'tv_negative',
      start: -5,
      minValue: -5,
      maxValue: 5,
      increment: 3,
      cycle: true,
      reset: 'day',
    });
    const big = 9007199254740991;
    await ordo.sequences.define({ name: 'tv_wide', start: -big, minValue: -big, increment: big });
    const seven = (name: string): Call[] => Array.from({ length: 7 }, () => ({ name, scope: 's' }));
    const step = await same(seven('tv_step'));
    expect(values(step)).toEqual([10, 15, 20, 25, 30, 'OX002', 'OX002']);
    expect(values(await same(seven('tv_cycle')))).toEqual([1, 2, 3, 1, 2, 3, 1]);
    expect(values(await same(seven('tv_negative')))).toEqual([-5, -2, 1, 4, -5, -2, 1]);
    expect(values(await same(seven('tv_wide')))).toEqual([-big, 0, big, 'OX002', 'OX002', 'OX002', 'OX002']);
  });

  it('an increment only SQL can define, too large for the arithmetic: take() decides', async () => {
    await pool.query(
      `SELECT ordo.define_sequence('tv_huge', 'gapless', 1, 4611686018427387904, 1, 9007199254740991,
         false, NULL, NULL, 'never', 'UTC', NULL, 'create', 1)`,
    );
    const out = await same([{ name: 'tv_huge' }, { name: 'tv_huge' }]);
    expect(values(out)).toEqual([1, 'OX002']);
  });

  it('the same errors: no such sequence, a batched one, a null scope', async () => {
    await ordo.sequences.define({ name: 'tv_batched', kind: 'batched' });
    await ordo.sequences.define({ name: 'tv_ok' });
    const out = await same([
      { name: 'tv_missing' },
      { name: 'tv_batched' },
      { name: 'tv_ok', scope: null },
      { name: 'tv_ok' },
    ]);
    expect(values(out)).toEqual(['OX001', 'OX004', 'OX003', 1]);
  });

  it('makes the commit durable, as the statement around take() does', async () => {
    await ordo.sequences.define({ name: 'tv_durable' });
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      await client.query('SET LOCAL synchronous_commit = off');
      await client.query(`SELECT ordo.take_value('tv_durable')`);
      expect((await client.query('SHOW synchronous_commit')).rows[0].synchronous_commit).toBe('on');
    } finally {
      await client.query('ROLLBACK');
      client.release();
    }
  });
});

describe('next({ tx }) through take_value()', () => {
  it('gives what it gave through take(): numbers, texts with any scope, periods, errors', async () => {
    await ordo.sequences.define({
      name: 'tv_next',
      reset: 'month',
      timeZone: 'Europe/Paris',
      format: '{scope}:{YYYY}-{MM}:{n:3}',
      maxValue: 3,
    });
    const scope = 'a,"b"\\{c} NULL';
    const at = '2026-06-30T22:30:00Z'; // 1 July in Paris
    const issued = await ordo.transaction(async (tx) => [
      await ordo.sequences.next('tv_next', { tx, scope, at }),
      await ordo.sequences.next('tv_next', { tx, scope, at }),
      await ordo.sequences.next('tv_next', { tx, scope: '', at }),
    ]);
    expect(issued).toEqual([
      { value: 1, text: `${scope}:2026-07:001`, period: '2026-07-01', scope },
      { value: 2, text: `${scope}:2026-07:002`, period: '2026-07-01', scope },
      { value: 1, text: ':2026-07:001', period: '2026-07-01', scope: '' },
    ]);
    await expect(
      ordo.transaction(async (tx) => {
        await ordo.sequences.next('tv_next', { tx, scope, at });
        return ordo.sequences.next('tv_next', { tx, scope, at });
      }),
    ).rejects.toMatchObject({ code: 'sequence_exhausted' });
    await expect(ordo.transaction((tx) => ordo.sequences.next('tv_nowhere', { tx }))).rejects.toMatchObject({
      code: 'sequence_not_found',
    });
  });

  it('through a driver that gives every value as text, arrays included', async () => {
    await ordo.sequences.define({ name: 'tv_raw', reset: 'day', format: '{n:2} {scope}' });
    const asText = { getTypeParser: () => (text: string) => text };
    const scope = 'a,"b"\\{c} NULL';
    const issued = await ordo.transaction(async (client) => {
      const tx = fromRawSql(async (text) => (await client.query({ text, types: asText })).rows);
      return [
        await ordo.sequences.next('tv_raw', { tx, scope, at: '2026-02-03T04:05:06Z' }),
        await ordo.sequences.next('tv_raw', { tx, scope, at: '2026-02-03T23:59:59Z' }),
      ];
    });
    expect(issued).toEqual([
      { value: 1, text: `01 ${scope}`, period: '2026-02-03', scope },
      { value: 2, text: `02 ${scope}`, period: '2026-02-03', scope },
    ]);
  });
});
