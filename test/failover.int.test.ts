// A failover pair of pg_auto_failover (test/support/failover-pair.ts), promoted under load: a
// planned failover, then an unplanned one (the primary's keeper and PostgreSQL killed), then the
// old primary rejoining as a standby. Meanwhile `ordo serve` (a child process, given the pair's
// multi-host URL) answers HTTP clients taking gapless numbers with an Idempotency-Key, two ordo
// nodes draw from one batched sequence, a writer appends to the outbox while a consumer and a
// relay to Redis read it, and two throttle workers start a report at most once per interval.
// After all three: the numbers held are exactly 1..n, no batched value twice, every acknowledged
// append delivered to the consumer and to Redis (first arrivals in commit order per key), no
// interval granted twice, no 500, no crashed process; each move of the primary logged once, LISTEN
// open on the new primary, which /readyz and `ordo status` name; each surface's time from the new
// primary accepting writes to its first success again is printed.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { createClient } from 'redis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type LogEntry, OrdoError } from '../src/index.js';
import { type FailoverPair, failoverPair } from './support/failover-pair.js';
import { httpClient, newLoad, serverErrors, summary } from './support/http-load.js';
import { killAll, runCli, startServer } from './support/server-process.js';

/** HTTP clients taking gapless numbers. */
const CLIENTS = 8;
/** The throttle's interval: no two starts closer than this by the database's clock. */
const EVERY_MS = 300;
/** How long the load runs before the first blow, between two, and after the last. */
const BETWEEN_MS = 1_500;
/** A surface not answering again within this after the new primary accepts writes fails the test. */
const RECOVERY_LIMIT_MS = 30_000;
const REDIS = 'redis://127.0.0.1:6379';

let pair: FailoverPair;
/** The pair's URL with a user: it names none, and this process runs as root. */
let url: string;

beforeAll(async () => {
  pair = await failoverPair({ database: 'ordo' });
  url = pair.url.replace('postgres://', 'postgres://postgres@');
}, 180_000);

afterAll(async () => {
  await killAll();
  await pair?.remove();
});

/** What one kind of caller saw: when it last succeeded, and its failures by code. */
class Surface {
  lastOkAt = 0;
  readonly failures = new Map<string, number>();
  ok(): void {
    this.lastOkAt = performance.now();
  }
  failed(e: unknown): void {
    const code = e instanceof OrdoError ? e.code : `not an OrdoError: ${(e as Error)?.message}`;
    this.failures.set(code, (this.failures.get(code) ?? 0) + 1);
  }
  /** Failures other than a database unavailable for a while or a call that timed out. */
  unexpected(): string[] {
    return [...this.failures.keys()].filter((c) => c !== 'database_unavailable' && c !== 'timeout');
  }
}

/** Waits until every surface succeeded after `since`; returns how long after it each did. */
async function recovered(surfaces: Record<string, { lastOkAt: number }>, since: number) {
  const out: Record<string, number> = {};
  for (const [name, s] of Object.entries(surfaces)) {
    while (s.lastOkAt <= since) {
      if (performance.now() - since > RECOVERY_LIMIT_MS)
        throw new Error(`${name} did not succeed again within ${RECOVERY_LIMIT_MS} ms of the new primary`);
      await sleep(10);
    }
    out[name] = Math.round(s.lastOkAt - since);
  }
  return out;
}

describe('a failover under load', () => {
  it('planned, unplanned, then the old primary rejoining: nothing acknowledged lost or given twice, no 500, every surface back by itself', async () => {
    const serve = await startServer({ databaseUrl: url });
    const logged: LogEntry[] = [];
    const a = await createOrdo({ databaseUrl: url, log: (e) => logged.push(e) });
    const b = await createOrdo({ databaseUrl: url });
    const redis = await createClient({ url: REDIS }).connect();
    const stream = `ordo-failover-${randomUUID()}`;
    let running = true;
    const loops: Promise<void>[] = [];
    try {
      const defined = await fetch(`${serve.url}/v1/sequences/invoice`, {
        method: 'PUT',
        headers: { 'content-type': 'application/json' },
        body: '{}',
      });
      expect(defined.status).toBe(200);
      await a.sequences.define({ name: 'ids', kind: 'batched', batch: 50, timeout: '20s' });
      await a.throttles.define({ name: 'report', every: `${EVERY_MS}ms` });

      // Gapless numbers over HTTP, each call with its key until a 200.
      const http = newLoad();
      for (let i = 0; i < CLIENTS; i++)
        loops.push(httpClient(serve.url, 'invoice', true, () => running, http));

      // Batched ids on two nodes.
      const ids = new Surface();
      const values: number[] = [];
      for (const node of [a, b])
        for (let i = 0; i < 2; i++)
          loops.push(
            (async () => {
              while (running) {
                try {
                  values.push(await node.nextval('ids'));
                  ids.ok();
                } catch (e) {
                  ids.failed(e);
                  await sleep(20);
                }
              }
            })(),
          );

      // The outbox: one writer, keys in turn; an append whose answer was lost may have committed.
      const appends = new Surface();
      const acknowledged: string[] = [];
      const unknown = new Set<string>();
      loops.push(
        (async () => {
          for (let seq = 1; running; seq++) {
            const key = `k${seq % 7}`;
            const label = `m${seq}`;
            try {
              await a.outbox.append('orders', {
                type: 'placed',
                key,
                messageId: label,
                data: { key, seq, label },
              });
              acknowledged.push(label);
              appends.ok();
            } catch (e) {
              appends.failed(e);
              unknown.add(label);
              await sleep(20);
            }
            await sleep(2);
          }
        })(),
      );
      const consumed = new Surface();
      const arrivals: { key: string; seq: number; label: string; id: string | null }[] = [];
      const consumer = await b.outbox.subscribe({
        name: 'audit',
        topic: 'orders',
        handler: async (messages) => {
          for (const m of messages)
            arrivals.push({ ...(m.data as { key: string; seq: number; label: string }), id: m.messageId });
          consumed.ok();
        },
      });
      const relay = await a.outbox.relay({
        name: 'orders-to-redis',
        topic: 'orders',
        to: { redis: { url: REDIS, stream } },
      });

      // Throttle workers, one per node: every grant's start by the database's clock.
      const throttled = new Surface();
      const starts: number[] = [];
      for (const node of [a, b])
        loops.push(
          (async () => {
            while (running) {
              try {
                const permit = await node.throttles.acquire('report', { key: 'daily' });
                throttled.ok();
                if (permit.granted) {
                  starts.push(permit.acquiredAt.getTime());
                  await permit.complete();
                } else await sleep(Math.min(permit.retryAfterMs, 100));
              } catch (e) {
                throttled.failed(e);
                await sleep(20);
              }
            }
          })(),
        );

      const surfaces = { http, ids, appends, consumed, throttled };
      const recoveries: Record<string, unknown> = {};
      await sleep(BETWEEN_MS);
      const planned = await pair.failover();
      recoveries.planned = { promotedInMs: planned.ms, ...(await recovered(surfaces, performance.now())) };
      await pair.standby();
      await sleep(BETWEEN_MS);
      const unplanned = await pair.killPrimary();
      recoveries.unplanned = {
        promotedInMs: unplanned.ms,
        ...(await recovered(surfaces, performance.now())),
      };
      await sleep(BETWEEN_MS);
      const rejoined = await pair.rejoin();
      recoveries.rejoined = { rejoinedInMs: rejoined.ms, ...(await recovered(surfaces, performance.now())) };
      await sleep(BETWEEN_MS);

      running = false;
      await Promise.all(loops);
      const expected = new Set([...acknowledged, ...unknown]);
      const until = async (what: string, done: () => Promise<boolean>) => {
        const deadline = Date.now() + 30_000;
        while (!(await done())) {
          if (Date.now() > deadline) throw new Error(`${what} did not happen within 30 s`);
          await sleep(50);
        }
      };
      await until('the consumer caught up', async () => (await b.outbox.lag('audit')).messagesBehind === 0);
      await until('the relay caught up', async () => (await relay.lag()).messagesBehind === 0);
      await consumer.stop();
      await relay.stop();

      const primary = await pair.primary();
      const admin = new pg.Client({ connectionString: primary.url });
      await admin.connect();
      const n = Number(
        (
          await admin.query(
            `SELECT coalesce(max(value), 0) AS n FROM ordo.counters WHERE sequence = 'invoice'`,
          )
        ).rows[0].n,
      );
      await admin.end();
      const held = [...http.held].sort((x, y) => x - y);
      const batched = [...values].sort((x, y) => x - y);
      const stored = ((await redis.xRange(stream, '-', '+')) ?? []).map((e) => e.message.id!);
      const report = {
        recoveries,
        http: summary(http),
        committed: n,
        batched: { values: values.length, failures: Object.fromEntries(ids.failures) },
        appends: {
          acknowledged: acknowledged.length,
          unknown: unknown.size,
          failures: Object.fromEntries(appends.failures),
        },
        consumed: arrivals.length,
        relayed: stored.length,
        throttled: { starts: starts.length, failures: Object.fromEntries(throttled.failures) },
        serverErrors: serverErrors(serve),
      };
      console.log('failover under load', JSON.stringify(report, null, 2));

      // Each failover said once, by each process, with the host it moved to; the rejoin moved nothing.
      const moves = logged.filter((e) => e.code === 'primary_moved').map((e) => e.message);
      expect(moves).toEqual([
        expect.stringMatching(
          new RegExp(
            `^127\\.0\\.0\\.1:${planned.to.port} is the host .* in place of 127\\.0\\.0\\.1:${planned.from.port}`,
          ),
        ),
        expect.stringMatching(new RegExp(`^127\\.0\\.0\\.1:${unplanned.to.port} is the host`)),
      ]);
      expect(serve.logs().filter((l) => l.code === 'primary_moved')).toHaveLength(2);
      // LISTEN is open on the new primary: a NOTIFY sent through the pool comes back to each node.
      for (const node of [a, b]) expect(await node.notifications()).toMatchObject({ state: 'ok' });
      // /readyz and `ordo status` name the primary in use.
      const ready = (await (await fetch(`${serve.url}/readyz`)).json()) as { server?: string };
      expect(ready.server).toBe(`127.0.0.1:${primary.port}`);
      const status = await runCli(['status'], { env: { DATABASE_URL: url } });
      expect(status.out).toContain(`, connected to 127.0.0.1:${primary.port}`);

      // No crashed process, no 500.
      expect(serve.child.exitCode, 'ordo serve is still running').toBe(null);
      expect(serve.child.signalCode).toBe(null);
      expect(http.statuses.get(500) ?? 0, http.unexpected.join(' | ')).toBe(0);
      expect(http.unexpected).toEqual([]);
      expect(http.withoutRetryAfter).toBe(0);
      expect(http.abandoned).toBe(0);
      expect([...ids.unexpected(), ...appends.unexpected(), ...throttled.unexpected()]).toEqual([]);
      // Gapless: every number a client holds is committed, and every committed one is held once.
      expect(held.filter((v, i) => i > 0 && v === held[i - 1])).toEqual([]);
      expect(held).toEqual(Array.from({ length: n }, (_, i) => i + 1));
      // Batched: no value twice, across both nodes and both failovers.
      expect(batched.filter((v, i) => i > 0 && v === batched[i - 1])).toEqual([]);
      // Outbox: every acknowledged append delivered, nothing that was never appended, first
      // arrivals in commit order per key; a repeat carries the same id.
      const firsts = new Map<string, number[]>();
      const seen = new Set<string>();
      for (const m of arrivals) {
        expect(m.id).toBe(m.label);
        if (seen.has(m.label)) continue;
        seen.add(m.label);
        firsts.set(m.key, [...(firsts.get(m.key) ?? []), m.seq]);
      }
      for (const label of acknowledged) expect(seen.has(label), `${label} consumed`).toBe(true);
      for (const label of seen) expect(expected.has(label), `${label} was appended`).toBe(true);
      for (const [key, seqs] of firsts)
        expect(seqs, `the order of ${key}`).toEqual([...seqs].sort((x, y) => x - y));
      const relayed = new Set(stored);
      for (const label of acknowledged) expect(relayed.has(label), `${label} relayed`).toBe(true);
      for (const label of relayed) expect(expected.has(label), `${label} was appended`).toBe(true);
      // Throttle: no two starts within one interval, by the database's clock.
      const sortedStarts = [...starts].sort((x, y) => x - y);
      const close = sortedStarts.filter((t, i) => i > 0 && t - sortedStarts[i - 1]! < EVERY_MS);
      expect(close).toEqual([]);
      expect(starts.length).toBeGreaterThan(5);
    } finally {
      running = false;
      await Promise.all(loops).catch(() => undefined);
      await redis.del(stream).catch(() => undefined);
      await redis.quit().catch(() => undefined);
      await a.close().catch(() => undefined);
      await b.close().catch(() => undefined);
      await serve.stop().catch(() => undefined);
    }
  }, 300_000);
});
