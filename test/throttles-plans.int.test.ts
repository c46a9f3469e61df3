// A connection plans a decision's statements once and keeps the plans. Vacuum of ordo.permits,
// a table of short-lived rows, often finds few live rows among many pages, and a connection
// that plans then takes the table for nearly empty: the plans it keeps must still read one
// key's permits by the key, and one permit by its id, however many permits come later.
// Each test has a database of its own: the estimate is of the whole table.
import type pg from 'pg';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo } from '../src/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { granted } from './support/permits.js';

let own: TestDatabase;
let pool: pg.Pool;
let ordo: Ordo;

beforeEach(async () => {
  own = await freshDatabase();
  pool = own.pool(2);
  ordo = await createOrdo({ databaseUrl: own.url, poolSize: 2 });
});
afterEach(async () => {
  await ordo?.close();
  await own?.drop();
});

/** `n` permits of `name`, one per key k1..kn, granted in one statement; their ids. */
async function grantMany(name: string, n: number): Promise<string[]> {
  const { rows } = await pool.query(
    `SELECT permit_id FROM ordo.acquire_all(
       (SELECT array_agg(i) FROM generate_series(1, $2::int) AS i), array_fill($1::text, ARRAY[$2::int]),
       (SELECT array_agg('k' || i) FROM generate_series(1, $2::int) AS i),
       array_fill(1, ARRAY[$2::int]), array_fill(NULL::text, ARRAY[$2::int])) WHERE granted`,
    [name, n],
  );
  return rows.map((r) => r.permit_id as string);
}

/**
 * What vacuum sees after a burst has come and gone: pages, and one live permit on the last of
 * them (so that the table cannot be truncated), a density of nearly nothing. Then a new burst
 * of 2,000 live permits the estimate knows nothing of.
 */
async function estimateNearlyEmptyThenBurst(): Promise<string[]> {
  await ordo.throttles.define({ name: 'crowd', limit: 1_000_000, per: '1s', lease: '1h' });
  expect(await grantMany('crowd', 2000)).toHaveLength(2000);
  await pool.query(`DELETE FROM ordo.permits WHERE name = 'crowd' AND key <> 'k2000'`);
  await pool.query('VACUUM ordo.permits');
  const { rows } = await pool.query(
    `SELECT reltuples, relpages FROM pg_class WHERE oid = 'ordo.permits'::regclass`,
  );
  expect(rows[0].reltuples).toBeLessThan(10);
  expect(rows[0].relpages).toBeGreaterThan(5);
  await pool.query(`DELETE FROM ordo.throttle_state WHERE name = 'crowd'`);
  const ids = await grantMany('crowd', 2000);
  expect(ids).toHaveLength(2000);
  return ids;
}

/**
 * Pages a statement read on `client`: run with `first`, then with `second` on the plans the
 * first run made and the connection keeps.
 */
async function pagesRead(
  client: pg.PoolClient,
  statement: string,
  first: unknown[],
  second = first,
): Promise<number> {
  const run = async (values: unknown[]) => {
    const { rows } = await client.query(`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${statement}`, values);
    const plan = rows[0]['QUERY PLAN'][0].Plan;
    return (plan['Shared Hit Blocks'] as number) + (plan['Shared Read Blocks'] as number);
  };
  await run(first);
  return run(second);
}

describe('plans kept from when ordo.permits looked empty', () => {
  it('a decision on one key reads a few pages, with 2,000 permits of another throttle present', async () => {
    await estimateNearlyEmptyThenBurst();
    await ordo.throttles.define({ name: 'quiet', concurrency: 5, lease: '1h' });
    const fresh = await pool.connect();
    try {
      // The fold, the sweep and the grant of one key read a few dozen pages by the key; a plan
      // that joins the key list to the permits as the planner sees fit, or skip-scans the primary
      // key, reads several times as many. A first grant, so that the key has a live permit: a
      // decision on a key with none does not read the permits, and the fold's statements are
      // planned, under the same estimate, by the run after it.
      const decision = `SELECT * FROM ordo.acquire_all(ARRAY[1], ARRAY['quiet'], ARRAY['k'], ARRAY[1], ARRAY[NULL::text])`;
      await fresh.query(decision);
      const pages = await pagesRead(fresh, decision, []);
      expect(pages).toBeLessThan(60);
    } finally {
      fresh.release();
    }
  });

  it('completing, failing and extending a permit read it by its id, not every permit', async () => {
    const ids = await estimateNearlyEmptyThenBurst();
    const fresh = await pool.connect();
    try {
      const runs: [string, unknown[], unknown[]][] = [
        ['SELECT ordo.extend_permit($1)', [ids[0]], [ids[1]]],
        ['SELECT * FROM ordo.complete_permits(ARRAY[$1::uuid])', [ids[2]], [ids[3]]],
        ['SELECT * FROM ordo.fail_permit($1, $2)', [ids[4], 'upstream down'], [ids[5], 'upstream down']],
      ];
      for (const [statement, first, second] of runs) {
        expect(await pagesRead(fresh, statement, first, second), statement).toBeLessThan(40);
      }
      const { rows } = await pool.query(
        `SELECT outcome, count(*)::int AS n FROM ordo.permits WHERE name = 'crowd' GROUP BY outcome ORDER BY outcome`,
      );
      expect(rows).toEqual([
        { outcome: 'completed', n: 2 },
        { outcome: 'failed', n: 2 },
        { outcome: null, n: 1997 },
      ]);
    } finally {
      fresh.release();
    }
  });
});

describe('a publication of every table', () => {
  it('throttles go on deciding: ordo.permits has a replica identity without a primary key', async () => {
    // Updates and deletes of a published table without one fail (55000), whatever wal_level.
    await pool.query('SET client_min_messages = error; CREATE PUBLICATION ordo_everything FOR ALL TABLES');
    try {
      await ordo.throttles.define({ name: 'published', concurrency: 2, lease: '1m' });
      for (let i = 0; i < 3; i++) {
        const permit = granted(await ordo.throttles.acquire('published', { key: 'k' }));
        await permit.extend();
        await (i === 1 ? permit.fail(new Error('upstream down'), { refund: true }) : permit.complete());
      }
      const state = await ordo.throttles.state('published', 'k');
      expect(state.lastOutcome).toBe('completed');
    } finally {
      await pool.query('DROP PUBLICATION ordo_everything');
    }
  });
});
