// A key's live units are a counter in its state row (0033), not a count of its permits: every
// way a permit starts, ends, expires, is forgotten or outlives a redefinition must move the
// counter exactly as the permits move, or a concurrency limit grants too much or too little.
// The counter is checked against the permits themselves: many workers, random ends, short leases, limits changed mid-run, an
// upgrade with permits in every state, and maintain() deleting an end nobody folded.
import { setTimeout as sleep } from 'node:timers/promises';
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrateLegacy } from './support/legacy-schema.js';
import { createOrdo, type Ordo } from '../src/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { granted } from './support/permits.js';

let db: TestDatabase;
let raw: pg.Pool;

beforeAll(async () => {
  db = await freshDatabase();
  raw = db.pool(4);
});
afterAll(async () => {
  await db?.drop();
});

interface Units {
  counter: number;
  running: number;
}

/**
 * The counter beside the permits it stands for: those of the key's incarnation that have not
 * been marked expired, running or ended and not yet folded. Every statement that moves one
 * moves the other in the same transaction, so one snapshot sees them agree at any time.
 */
async function counted(
  pool: pg.Pool,
  name: string,
  key: string,
): Promise<{ counter: number; permits: number } | undefined> {
  const { rows } = await pool.query(
    `SELECT st.live_units::int AS counter,
            coalesce((SELECT sum(p.cost) FROM ordo.permits AS p
                       WHERE p.name = st.name AND p.key = st.key AND p.incarnation = st.incarnation
                         AND p.outcome IS DISTINCT FROM 'expired'), 0)::int AS permits
       FROM ordo.throttle_state AS st WHERE st.name = $1 AND st.key = $2`,
    [name, key],
  );
  return rows[0];
}

/**
 * What a decision on the key sees once it has folded the key's ends and leases: the counter,
 * and the units of the permits live at its clock (the decision asks for one unit, left out of
 * both, and is rolled back).
 */
async function unitsAfterDecision(pool: pg.Pool, name: string, key: string): Promise<Units> {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const { rows: decided } = await client.query(
      `SELECT granted FROM ordo.acquire_all(ARRAY[1], ARRAY[$1], ARRAY[$2], ARRAY[1], ARRAY[NULL::text])`,
      [name, key],
    );
    const own = decided[0].granted ? 1 : 0;
    const { rows } = await client.query(
      `SELECT st.live_units::int - $3 AS counter,
              coalesce((SELECT sum(p.cost) FROM ordo.permits AS p
                         WHERE p.name = st.name AND p.key = st.key AND p.incarnation = st.incarnation
                           AND p.ended_at IS NULL AND p.expires_at > st.decided_at), 0)::int - $3 AS running
         FROM ordo.throttle_state AS st WHERE st.name = $1 AND st.key = $2`,
      [name, key, own],
    );
    return rows[0] as Units;
  } finally {
    await client.query('ROLLBACK');
    client.release();
  }
}

describe('live units kept in the key', () => {
  it('agree with the permits they stand for at every moment, while 12 workers start, end, fail, refund, abandon and extend permits and the limits change', async () => {
    const instances: Ordo[] = [];
    for (let i = 0; i < 3; i++) instances.push(await createOrdo({ databaseUrl: db.url, poolSize: 4 }));
    const [first] = instances as [Ordo];
    await first.throttles.define({ name: 'mixed', concurrency: 6, lease: '300ms' });
    const keys = ['a', 'b'];
    const until = performance.now() + 3000;
    const checks: { counter: number; permits: number }[] = [];
    let grants = 0;
    const workers = Array.from({ length: 12 }, async (_, w) => {
      const ordo = instances[w % instances.length]!;
      while (performance.now() < until) {
        const key = keys[w % keys.length]!;
        const r = await ordo.throttles.acquire('mixed', { key, cost: 1 + (w % 2) });
        if (!r.granted) {
          await sleep(Math.min(r.retryAfterMs, 20));
          continue;
        }
        grants++;
        const roll = Math.random();
        await sleep(Math.random() * 30);
        // An abandoned permit expires with its lease; the others end every way there is.
        if (roll < 0.1) continue;
        if (roll < 0.2) await r.extend().catch(() => undefined);
        if (roll < 0.5) await r.complete().catch(() => undefined);
        else if (roll < 0.7) await r.fail('failed').catch(() => undefined);
        else if (roll < 0.85) await r.fail('refunded', { refund: true }).catch(() => undefined);
        else await r.fail('held', { retryAfter: 20 }).catch(() => undefined);
      }
    });
    const checker = (async () => {
      let round = 0;
      while (performance.now() < until) {
        await sleep(50);
        round++;
        // Limits changed under the workers: the key's own, then the throttle's.
        if (round % 10 === 3)
          await first.throttles.setKeyLimits('mixed', 'a', { concurrency: 1 + (round % 5) });
        if (round % 10 === 7)
          await first.throttles.define({
            name: 'mixed',
            concurrency: 3 + (round % 4),
            lease: '300ms',
            overwrite: true,
          });
        // A key no worker has been granted on yet has no state to compare (a slow start).
        for (const key of keys) {
          const c = await counted(raw, 'mixed', key);
          if (c) checks.push(c);
        }
      }
    })();
    await Promise.all([...workers, checker]);
    expect(grants).toBeGreaterThan(50);
    expect(checks.length).toBeGreaterThan(20);
    expect(checks.filter((c) => c.counter !== c.permits)).toEqual([]);
    // Every lease lapses: nothing is left counted.
    await sleep(400);
    for (const key of keys)
      expect(await unitsAfterDecision(raw, 'mixed', key)).toEqual({ counter: 0, running: 0 });
    await Promise.all(instances.map((o) => o.close()));
  });

  it("start again from nothing under a new definition: a key's state written by the old one counts nothing", async () => {
    const ordo = await createOrdo({ databaseUrl: db.url, poolSize: 2 });
    const tx = await raw.connect();
    try {
      await ordo.throttles.define({ name: 'reborn', concurrency: 2, lease: '1m' });
      // A first grant on a new key in a transaction still open while the throttle is removed
      // and defined again: its state row and permit, not yet committed, survive the removal.
      await tx.query('BEGIN');
      granted(await ordo.throttles.acquire('reborn', { key: 'k', cost: 2, tx }));
      await ordo.throttles.remove('reborn');
      await ordo.throttles.define({ name: 'reborn', concurrency: 2, lease: '1m' });
      await tx.query('COMMIT');
      const { rows } = await raw.query(
        `SELECT st.live_units::int AS units, st.incarnation < d.incarnation AS old
           FROM ordo.throttle_state AS st JOIN ordo.throttles AS d ON d.name = st.name
          WHERE st.name = 'reborn' AND st.key = 'k'`,
      );
      expect(rows).toEqual([{ units: 2, old: true }]);
      // The new definition's first decision on the key starts from nothing: all 2 units free.
      granted(await ordo.throttles.acquire('reborn', { key: 'k', cost: 2 }));
      expect(await unitsAfterDecision(raw, 'reborn', 'k')).toEqual({ counter: 2, running: 2 });
    } finally {
      await tx.query('ROLLBACK').catch(() => undefined);
      tx.release();
      await ordo.close();
    }
  });

  it('maintain() frees the units of an end it deletes that no decision folded, and only once', async () => {
    const ordo = await createOrdo({ databaseUrl: db.url, poolSize: 2 });
    try {
      await ordo.throttles.define({ name: 'forgotten', concurrency: 3, lease: '1m' });
      const done = granted(await ordo.throttles.acquire('forgotten', { key: 'k', cost: 2 }));
      const running = granted(await ordo.throttles.acquire('forgotten', { key: 'k' }));
      await done.complete();
      // A day on, with nobody asking for the key since: maintain() deletes the end unfolded.
      await raw.query(`UPDATE ordo.permits SET ended_at = ended_at - interval '25 hours' WHERE id = $1`, [
        done.id,
      ]);
      const ended = (await ordo.maintain()).find((m) => m.what === 'ended permits')?.deleted;
      expect(ended).toBe(1);
      const { rows } = await raw.query(
        `SELECT live_units::int AS n FROM ordo.throttle_state WHERE name = 'forgotten' AND key = 'k'`,
      );
      expect(rows[0].n).toBe(1);
      expect(await unitsAfterDecision(raw, 'forgotten', 'k')).toEqual({ counter: 1, running: 1 });
      // Room for exactly two more units.
      granted(await ordo.throttles.acquire('forgotten', { key: 'k', cost: 2 }));
      const full = await ordo.throttles.acquire('forgotten', { key: 'k' });
      expect(full).toMatchObject({ granted: false, reason: 'concurrency' });
      await running.complete();
    } finally {
      await ordo.close();
    }
  });
});

describe('maintain() beside a decision', () => {
  it('leaves a key a decision holds to that decision, without waiting for it: no deadlock, the end counted once', async () => {
    const ordo = await createOrdo({ databaseUrl: db.url, poolSize: 2 });
    const decision = await raw.connect();
    try {
      await ordo.throttles.define({ name: 'busy', concurrency: 2, lease: '1m' });
      const done = granted(await ordo.throttles.acquire('busy', { key: 'k' }));
      await done.complete();
      await raw.query(`UPDATE ordo.permits SET ended_at = ended_at - interval '25 hours' WHERE id = $1`, [
        done.id,
      ]);
      // A decision has locked the key (as throttle_lock does) and has not folded it yet.
      await decision.query('BEGIN');
      await decision.query(`SELECT 1 FROM ordo.throttle_state WHERE name = 'busy' AND key = 'k' FOR UPDATE`);
      // maintain() neither waits for the key nor deletes its end under it: the decision would
      // then wait for maintain() while maintain() waits for the key.
      const started = performance.now();
      const ended = (await ordo.maintain()).find((m) => m.what === 'ended permits')?.deleted;
      expect(ended).toBe(0);
      expect(performance.now() - started).toBeLessThan(1000);
      const { rows } = await decision.query(
        `SELECT granted FROM ordo.acquire_all(ARRAY[1], ARRAY['busy'], ARRAY['k'], ARRAY[2], ARRAY[NULL::text])`,
      );
      // The decision folded the end: the whole limit is free for it.
      expect(rows[0].granted).toBe(true);
      await decision.query('COMMIT');
      expect(await counted(raw, 'busy', 'k')).toEqual({ counter: 2, permits: 2 });
    } finally {
      await decision.query('ROLLBACK').catch(() => undefined);
      decision.release();
      await ordo.close();
    }
  });
});

describe('upgrade to 0033 (8080e8c), then today', () => {
  it('counts the permits running, ended unfolded and expired unswept of a database on 0032, and the limit holds across it', async () => {
    const old = await freshDatabase();
    try {
      const pool = old.pool(2);
      await migrateLegacy(pool, 'ordo', 32);
      const acquire = async (key: string, cost: number) =>
        (
          await pool.query(
            `SELECT permit_id FROM ordo.acquire_all(ARRAY[1], ARRAY['upgraded'], ARRAY[$1], ARRAY[$2::int], ARRAY[NULL::text]) WHERE granted`,
            [key, cost],
          )
        ).rows[0]?.permit_id as string | undefined;
      await pool.query(
        `SELECT * FROM ordo.define_throttle('upgraded', NULL, NULL, NULL, 4, 60000, false, 'create')`,
      );
      // Key a: 1 running, 2 ended and not folded. Key b: 3 whose lease runs out before the upgrade.
      const running = await acquire('a', 1);
      const ended = await acquire('a', 2);
      await pool.query('SELECT * FROM ordo.complete_permit($1)', [ended]);
      await pool.query(`UPDATE ordo.throttles SET lease_ms = 200 WHERE name = 'upgraded'`);
      expect(await acquire('b', 3)).toBeDefined();
      await pool.query(`UPDATE ordo.throttles SET lease_ms = 60000 WHERE name = 'upgraded'`);
      await sleep(300);

      await migrateLegacy(pool, 'ordo');
      const ordo = await createOrdo({ databaseUrl: old.url, poolSize: 2 });
      try {
        const { rows } = await pool.query(
          `SELECT key, live_units::int AS n FROM ordo.throttle_state WHERE name = 'upgraded' ORDER BY key`,
        );
        expect(rows).toEqual([
          { key: 'a', n: 3 },
          { key: 'b', n: 3 },
        ]);
        // a: the end is folded, 1 running: room for 3. b: the lease ran out: room for 4.
        granted(await ordo.throttles.acquire('upgraded', { key: 'a', cost: 3 }));
        expect(await ordo.throttles.acquire('upgraded', { key: 'a' })).toMatchObject({ granted: false });
        granted(await ordo.throttles.acquire('upgraded', { key: 'b', cost: 4 }));
        expect(await unitsAfterDecision(pool, 'upgraded', 'a')).toEqual({ counter: 4, running: 4 });
        expect(await unitsAfterDecision(pool, 'upgraded', 'b')).toEqual({ counter: 4, running: 4 });
        expect(running).toBeDefined();
      } finally {
        await ordo.close();
      }
    } finally {
      await old.drop();
    }
  });
});
