// /metrics after a known workload: sequences (range reservations and their latency, gapless
// counters held by open transactions and who waits behind them) and throttles (grants,
// refusals by reason, ends by outcome, running permits). The outbox's metrics are checked in
// outbox-http.int.test.ts, the HTTP ones in server.int.test.ts.
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Ordo, Permit } from '../src/index.js';
import { buildServer } from '../src/server/app.js';
import { type OrdoDatabase, ordoDatabase, type TestDatabase } from './support/database.js';
import { sample, sampleSum } from './support/prometheus.js';

let t: OrdoDatabase;
let db: TestDatabase;
let ordo: Ordo;
let app: Awaited<ReturnType<typeof buildServer>>;
const clients: pg.Client[] = [];

beforeAll(async () => {
  t = await ordoDatabase({ poolSize: 6 });
  ({ db, ordo } = t);
  app = await buildServer(ordo);
});
afterAll(async () => {
  await Promise.all(clients.map((c) => c.end().catch(() => undefined)));
  await app?.close();
  await t?.close();
});

async function scrape(): Promise<string> {
  const reply = await app.inject({ method: 'GET', url: '/metrics' });
  expect(reply.statusCode).toBe(200);
  return reply.body;
}

async function transaction(applicationName: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: db.url, application_name: applicationName });
  client.on('error', () => undefined);
  await client.connect();
  clients.push(client);
  await client.query('BEGIN');
  return client;
}

async function until(probe: () => Promise<boolean>): Promise<void> {
  for (let i = 0; i < 250 && !(await probe()); i++) await sleep(20);
}

describe('GET /metrics: sequences', () => {
  it('counts the ranges a node reserves and how long each reservation statement took', async () => {
    await ordo.sequences.define({ name: 'm_ids', kind: 'batched', batch: 10 });
    const taken = await ordo.sequences.nextMany('m_ids', 35);
    expect(taken).toHaveLength(35);
    const text = await scrape();
    const reservations = sample(text, 'ordo_range_reservations_total', { sequence: 'm_ids' });
    expect(reservations).toBeGreaterThanOrEqual(4);
    // One latency observation per reservation statement (one range or several), each a real duration.
    const statements = sample(text, 'ordo_range_reservation_duration_seconds_count', { sequence: 'm_ids' })!;
    expect(statements).toBeGreaterThanOrEqual(1);
    expect(statements).toBeLessThanOrEqual(reservations!);
    const seconds = sample(text, 'ordo_range_reservation_duration_seconds_sum', { sequence: 'm_ids' })!;
    expect(seconds).toBeGreaterThan(0);
    expect(seconds).toBeLessThan(statements * 5);
    expect(
      sample(text, 'ordo_range_reservation_duration_seconds_bucket', { sequence: 'm_ids', le: '+Inf' }),
    ).toBe(statements);
  });

  it('names the gapless counters held by open transactions, who waits behind them and for how long', async () => {
    await ordo.sequences.define({ name: 'm_inv' });
    await ordo.sequences.next('m_inv');
    let text = await scrape();
    expect(sample(text, 'ordo_gapless_counters_held', { sequence: 'm_inv' })).toBeUndefined();

    const holder = await transaction('forgotten');
    await ordo.sequences.next('m_inv', { tx: holder });
    const waiters = await Promise.all(['w1', 'w2'].map(transaction));
    const waiting = waiters.map(async (w) => {
      await ordo.sequences.next('m_inv', { tx: w });
      await w.query('COMMIT');
    });
    await until(async () => sample(await scrape(), 'ordo_gapless_lock_waiters', { sequence: 'm_inv' }) === 2);
    await sleep(50);
    text = await scrape();
    expect(sample(text, 'ordo_gapless_counters_held', { sequence: 'm_inv' })).toBe(1);
    expect(sample(text, 'ordo_gapless_lock_waiters', { sequence: 'm_inv' })).toBe(2);
    expect(sample(text, 'ordo_gapless_longest_hold_seconds', { sequence: 'm_inv' })).toBeGreaterThanOrEqual(
      0.05,
    );

    await holder.query('COMMIT');
    await Promise.all(waiting);
    text = await scrape();
    expect(sample(text, 'ordo_gapless_counters_held', { sequence: 'm_inv' })).toBeUndefined();
    expect(sample(text, 'ordo_gapless_lock_waiters', { sequence: 'm_inv' })).toBeUndefined();
  });
});

describe('GET /metrics: throttles', () => {
  it('grants, refusals by reason, ends by outcome and running permits', async () => {
    await ordo.throttles.define({ name: 'm_api', concurrency: 2 });
    await ordo.throttles.define({ name: 'm_idle', concurrency: 1 });
    const granted: Permit[] = [];
    for (let i = 0; i < 2; i++) {
      const r = await ordo.throttles.acquire('m_api', { key: 'k' });
      if (!(r instanceof Permit)) throw new Error(`refused: ${r.reason}`);
      granted.push(r);
    }
    expect(await ordo.throttles.acquire('m_api', { key: 'k' })).toMatchObject({ granted: false });
    await ordo.throttles.pause('m_api', { key: 'held', until: '1m' });
    expect(await ordo.throttles.acquire('m_api', { key: 'held' })).toMatchObject({
      granted: false,
      reason: 'paused',
    });

    let text = await scrape();
    expect(sample(text, 'ordo_throttle_granted_total', { throttle: 'm_api' })).toBe(2);
    expect(sample(text, 'ordo_throttle_refused_total', { throttle: 'm_api', reason: 'concurrency' })).toBe(1);
    expect(sample(text, 'ordo_throttle_refused_total', { throttle: 'm_api', reason: 'paused' })).toBe(1);
    expect(sampleSum(text, 'ordo_throttle_refused_total', { throttle: 'm_api' })).toBe(2);
    expect(sample(text, 'ordo_throttle_running_permits', { throttle: 'm_api' })).toBe(2);
    // A throttle with nothing running says so, rather than having no sample.
    expect(sample(text, 'ordo_throttle_running_permits', { throttle: 'm_idle' })).toBe(0);

    await granted[0]!.complete();
    await granted[1]!.fail(new Error('upstream 500'), { refund: true });
    text = await scrape();
    expect(sample(text, 'ordo_throttle_ended_total', { throttle: 'm_api', outcome: 'completed' })).toBe(1);
    expect(sample(text, 'ordo_throttle_ended_total', { throttle: 'm_api', outcome: 'failed' })).toBe(1);
    expect(sample(text, 'ordo_throttle_ended_total', { throttle: 'm_api', outcome: 'refunded' })).toBe(1);
    expect(sample(text, 'ordo_throttle_running_permits', { throttle: 'm_api' })).toBe(0);
  });
});
