import { setTimeout as sleep } from 'node:timers/promises';
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Ordo, OrdoError } from '../src/index.js';
import { type OrdoDatabase, ordoDatabase } from './support/database.js';
import { waitingForLock } from './support/lock-waits.js';

// A gapless sequence redefined as batched (OVERWRITE) must never hand out a value already handed
// out, whatever the takers in flight are doing. Each test holds one transaction open on a
// connection of its own, checks that the other side waits for a lock, then ends it.

let t: OrdoDatabase;
let ordo: Ordo;
let sql: pg.Pool;
/** The quoted schema holding ordo's SQL functions. */
let S: string;

beforeAll(async () => {
  t = await ordoDatabase({ sqlPoolSize: 8 });
  ({ ordo, sql, S } = t);
});
afterAll(() => t?.close());

const MAX = 9007199254740991;

/** A gapless sequence that has handed out 1..taken, committed. */
async function gapless(name: string, taken: number): Promise<number[]> {
  await ordo.sequences.define({ name });
  const values: number[] = [];
  for (let i = 0; i < taken; i++) values.push(await ordo.nextval(name));
  return values;
}

/** define_sequence from SQL, turning `name` batched (OVERWRITE), on a connection of the caller's. */
async function toBatchedSql(client: pg.PoolClient, name: string): Promise<{ start: number }> {
  const { rows } = await client.query(
    `SELECT (r.definition).start FROM ${S}.define_sequence($1, 'batched', 1, 1, 1, ${MAX}, false, 10, NULL, 'never', 'UTC', NULL, 'overwrite', 1) AS r`,
    [name],
  );
  return { start: Number(rows[0].start) };
}

/** Back to the pool with no transaction left open, whatever the test did with it. */
async function release(...clients: pg.PoolClient[]): Promise<void> {
  for (const client of clients) {
    await client.query('ROLLBACK').catch(() => undefined);
    client.release();
  }
}

async function pidOf(client: pg.PoolClient): Promise<number> {
  return (await client.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
}

/** What the sequence hands out once batched: through a node's ranges, and fresh ranges from SQL. */
async function batchedValues(name: string): Promise<number[]> {
  const values = (await ordo.sequences.nextMany(name, 25)).map((i) => i.value);
  for (let i = 0; i < 3; i++) {
    values.push(Number((await sql.query(`SELECT ${S}.nextval($1) AS v`, [name])).rows[0].v));
  }
  return values;
}

async function counterRows(name: string): Promise<number> {
  return (await sql.query(`SELECT count(*)::int AS n FROM ${S}.counters WHERE sequence = $1`, [name])).rows[0]
    .n as number;
}

function expectNoneTwice(values: number[]): void {
  const twice = values.filter((v, i) => values.indexOf(v) !== i);
  expect(twice, `handed out twice: ${twice.join(', ')}`).toEqual([]);
}

/** Ways of taking gapless values in a caller's transaction, each through another SQL function. */
const inTransaction: { via: string; take(name: string, tx: pg.PoolClient): Promise<number[]> }[] = [
  {
    via: 'take_value (next with tx)',
    take: async (name, tx) => [(await ordo.sequences.next(name, { tx })).value],
  },
  {
    via: 'take (nextMany with tx)',
    take: async (name, tx) => (await ordo.sequences.nextMany(name, 2, { tx })).map((i) => i.value),
  },
  {
    via: 'take_once (next with tx and an idempotency key)',
    take: async (name, tx) => [
      (await ordo.sequences.next(name, { tx, idempotencyKey: `key-${name}` })).value,
    ],
  },
  {
    via: 'take_many (SQL)',
    take: async (name, tx) =>
      (
        await tx.query(
          `SELECT value FROM ${S}.take_many(ARRAY[$1], ARRAY[''], ARRAY[NULL]::timestamptz[], ARRAY[2])`,
          [name],
        )
      ).rows.map((r) => Number(r.value)),
  },
  {
    via: 'nextval (SQL)',
    take: async (name, tx) => [Number((await tx.query(`SELECT ${S}.nextval($1) AS v`, [name])).rows[0].v)],
  },
];

describe('(a) a value taken in a transaction still open when the sequence turns batched', () => {
  it.each(inTransaction.map((w, i) => ({ ...w, name: `held_${i}` })))(
    '$via: the redefinition waits for it and starts above it',
    async ({ name, take }) => {
      const before = await gapless(name, 3);
      const tx = await sql.connect();
      try {
        await tx.query('BEGIN');
        const held = await take(name, tx);
        expect(held[0]).toBe(4);
        const redefining = ordo.sequences.define({ name, kind: 'batched', batch: 10, overwrite: true });
        await waitingForLock(sql, { like: '%define_sequence%' });
        await tx.query('COMMIT');
        const definition = await redefining;
        expect(definition.start).toBeGreaterThan(Math.max(...held));
        const after = await batchedValues(name);
        expectNoneTwice([...before, ...held, ...after]);
        expect(await counterRows(name)).toBe(0);
      } finally {
        await release(tx);
      }
    },
  );
});

/**
 * Ways of taking a value while another transaction turns the sequence batched: in the taker's
 * transaction, the take fails once it sees the new kind (the caller must know: its transaction
 * is aborted); standalone, or from SQL's nextval(), it is served by the new kind.
 */
const whileRedefined: {
  via: string;
  outcome: 'refused' | 'batched';
  take(name: string, tx: pg.PoolClient): Promise<number[]>;
}[] = [
  {
    via: 'take_value (next with tx)',
    outcome: 'refused',
    take: async (name, tx) => [(await ordo.sequences.next(name, { tx })).value],
  },
  {
    via: 'take (nextMany with tx)',
    outcome: 'refused',
    take: async (name, tx) => (await ordo.sequences.nextMany(name, 2, { tx })).map((i) => i.value),
  },
  {
    via: 'take_once (next with tx and an idempotency key)',
    outcome: 'refused',
    take: async (name, tx) => [
      (await ordo.sequences.next(name, { tx, idempotencyKey: `key-${name}` })).value,
    ],
  },
  {
    via: 'take (next without tx)',
    outcome: 'batched',
    take: async (name) => [(await ordo.sequences.next(name)).value],
  },
  {
    via: 'nextval (SQL)',
    outcome: 'batched',
    take: async (name, tx) => [Number((await tx.query(`SELECT ${S}.nextval($1) AS v`, [name])).rows[0].v)],
  },
];

describe.each([
  { interleaving: '(b) the counter row exists', prefix: 'b', taken: 3 },
  { interleaving: '(c) no counter row yet', prefix: 'c', taken: 0 },
])('$interleaving: a take that starts while the redefinition is open', ({ prefix, taken }) => {
  it.each(whileRedefined.map((w, i) => ({ ...w, name: `${prefix}_open_${i}` })))(
    '$via: waits for it, then hands out nothing twice and leaves no counter row',
    async ({ name, outcome, take }) => {
      const before = await gapless(name, taken);
      const redefiner = await sql.connect();
      const taker = await sql.connect();
      try {
        await redefiner.query('BEGIN');
        const { start } = await toBatchedSql(redefiner, name);
        expect(start).toBe(taken + 1);
        await taker.query('BEGIN');
        const taking = take(name, taker).then(
          (values) => ({ values, error: undefined }),
          (error: unknown) => ({ values: [], error }),
        );
        await waitingForLock(sql, { except: await pidOf(redefiner) });
        await redefiner.query('COMMIT');
        const { values, error } = await taking;
        await taker.query(error ? 'ROLLBACK' : 'COMMIT');
        if (outcome === 'refused') {
          expect(error).toBeInstanceOf(OrdoError);
          expect((error as OrdoError).message).toMatch(/is batched, not gapless/);
        } else {
          expect(error).toBeUndefined();
          expect(Math.min(...values)).toBeGreaterThanOrEqual(start);
        }
        const after = await batchedValues(name);
        expectNoneTwice([...before, ...values, ...after]);
        expect(await counterRows(name)).toBe(0);
      } finally {
        await release(redefiner, taker);
      }
    },
  );
});

describe('around the redefinition', () => {
  it('a take arriving while the redefinition waits queues behind it, and is served by the new kind', async () => {
    const name = 'queued';
    const before = await gapless(name, 3);
    const tx = await sql.connect();
    try {
      await tx.query('BEGIN');
      const held = await ordo.sequences.next(name, { tx });
      const redefining = ordo.sequences.define({ name, kind: 'batched', batch: 10, overwrite: true });
      await waitingForLock(sql, { like: '%define_sequence%' });
      const late = ordo.sequences.next(name);
      await waitingForLock(sql, { like: '%take(%' });
      await tx.query('COMMIT');
      const definition = await redefining;
      const { value } = await late;
      expect(value).toBeGreaterThanOrEqual(definition.start);
      expectNoneTwice([...before, held.value, value, ...(await batchedValues(name))]);
      expect(await counterRows(name)).toBe(0);
    } finally {
      await release(tx);
    }
  });

  it('a transaction that took from the sequence redefines it itself: no deadlock, and it starts above', async () => {
    const name = 'own';
    const before = await gapless(name, 3);
    const tx = await sql.connect();
    try {
      await tx.query('BEGIN');
      const held = await ordo.sequences.next(name, { tx });
      const { start } = await toBatchedSql(tx, name);
      await tx.query('COMMIT');
      expect(start).toBe(held.value + 1);
      expectNoneTwice([...before, held.value, ...(await batchedValues(name))]);
      expect(await counterRows(name)).toBe(0);
    } finally {
      await release(tx);
    }
  });

  it('a sequence that numbers a table at commit is refused at once, not after waiting for its takers', async () => {
    const name = 'numbering';
    await gapless(name, 3);
    await sql.query('CREATE TABLE numbered (number bigint)');
    await ordo.sequences.attach(name, { table: 'public.numbered', column: 'number' });
    const tx = await sql.connect();
    try {
      await tx.query('BEGIN');
      expect((await ordo.sequences.next(name, { tx })).value).toBe(4);
      const redefining = ordo.sequences.define({ name, kind: 'batched', batch: 10, overwrite: true }).then(
        () => 'redefined',
        (error: unknown) => error,
      );
      const first = await Promise.race([redefining, sleep(2_000).then(() => 'still waiting')]);
      await tx.query('COMMIT');
      await redefining;
      expect(first).toBeInstanceOf(OrdoError);
      expect((first as OrdoError).message).toMatch(
        /numbers numbered\(number\) at commit: it cannot become batched/,
      );
      expect((await ordo.sequences.get(name))?.kind).toBe('gapless');
    } finally {
      await release(tx);
    }
  });

  it("the redefinition waits no longer than the caller's lock_timeout, and then changes nothing", async () => {
    const name = 'impatient';
    await gapless(name, 3);
    const holder = await sql.connect();
    const redefiner = await sql.connect();
    try {
      await holder.query('BEGIN');
      expect((await ordo.sequences.next(name, { tx: holder })).value).toBe(4);
      await redefiner.query('BEGIN');
      await redefiner.query("SET LOCAL lock_timeout = '100ms'");
      await expect(toBatchedSql(redefiner, name)).rejects.toMatchObject({ code: '55P03' });
      await redefiner.query('ROLLBACK');
      expect((await ordo.sequences.next(name, { tx: holder })).value).toBe(5);
      await holder.query('COMMIT');
      expect((await ordo.sequences.get(name))?.kind).toBe('gapless');
      expect(await ordo.nextval(name)).toBe(6);
    } finally {
      await release(holder, redefiner);
    }
  });
});

describe('REPEATABLE READ and SERIALIZABLE', () => {
  it.each(['REPEATABLE READ', 'SERIALIZABLE'])(
    'a gapless sequence is not turned batched at %s: its snapshot would miss values committed meanwhile',
    async (isolation) => {
      const name = `snapshot_${isolation.split(' ')[0]!.toLowerCase()}`;
      await ordo.sequences.define({ name });
      const redefiner = await sql.connect();
      try {
        await redefiner.query(`BEGIN ISOLATION LEVEL ${isolation}`);
        await redefiner.query('SELECT 1');
        // Committed after the redefiner's snapshot, the first value of its counter.
        const first = await ordo.nextval(name);
        await expect(toBatchedSql(redefiner, name)).rejects.toMatchObject({
          code: 'OX003',
          message: expect.stringMatching(/can become batched only at READ COMMITTED/),
        });
        await redefiner.query('ROLLBACK');
        const definition = await ordo.sequences.define({ name, kind: 'batched', batch: 10, overwrite: true });
        expect(definition.start).toBe(first + 1);
        expectNoneTwice([first, ...(await batchedValues(name))]);
        expect(await counterRows(name)).toBe(0);
      } finally {
        await release(redefiner);
      }
    },
  );

  it('a take at REPEATABLE READ whose snapshot predates the change fails (40001) and hands out nothing', async () => {
    const name = 'stale_snapshot';
    const before = await gapless(name, 3);
    const tx = await sql.connect();
    try {
      await tx.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
      await tx.query('SELECT 1');
      await ordo.sequences.define({ name, kind: 'batched', batch: 10, overwrite: true });
      await expect(tx.query(`SELECT ${S}.take_value($1) AS v`, [name])).rejects.toMatchObject({
        code: '40001',
      });
      await tx.query('ROLLBACK');
      expectNoneTwice([...before, ...(await batchedValues(name))]);
      expect(await counterRows(name)).toBe(0);
    } finally {
      await release(tx);
    }
  });
});
