// A relay to Redis Streams (the machine's redis-server, and one of this file's own that it stops):
// every committed message is an entry of the stream, in commit order per key, with its id and
// CloudEvents attributes; a message whose stream key holds a string is parked and the others go
// on; a server away at the start or killed mid-run loses nothing; bad configuration is refused.
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createClient } from 'redis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '../src/db/embedded.js';
import { createOrdo, type Ordo } from '../src/index.js';
import { redis } from '../src/outbox/relays/redis.js';
import { type OwnPostgres, ownPostgres } from './support/own-postgres.js';
import {
  type Arrival,
  appendLoad,
  checkArrivals,
  expectCloudEvents,
  uniqueName,
  expectRefused,
} from './support/relay-load.js';
import { until } from './support/until.js';

const REDIS = 'redis://127.0.0.1:6379';
const TRACEPARENT = `00-${'a'.repeat(32)}-${'b'.repeat(16)}-01`;
let server: OwnPostgres;
let ordo: Ordo;
const client = createClient({ url: REDIS });
const keys: string[] = [];

beforeAll(async () => {
  server = await ownPostgres();
  ordo = await createOrdo({ databaseUrl: server.url });
  client.on('error', () => undefined);
  await client.connect();
});
afterAll(async () => {
  for (const own of OwnRedis.all) await own.remove();
  await ordo?.close();
  if (keys.length > 0) await client.del(keys).catch(() => undefined);
  if (client.isOpen) client.destroy();
  await server?.stop();
});

function key(prefix: string): string {
  const name = uniqueName(prefix);
  keys.push(name);
  return name;
}

/** The fields of a stream's entries, oldest first. */
async function entries(stream: string, from = client): Promise<Record<string, string>[]> {
  const list = (await from.xRange(stream, '-', '+')) ?? [];
  return list.map((e) => ({ ...(e.message as Record<string, string>) }));
}

/** The stream's entries as the relay wrote them, checked field by field. */
async function arrivals(stream: string, from = client): Promise<Arrival[]> {
  return (await entries(stream, from)).map((message) => {
    expect(Object.keys(message).sort()).toEqual(
      [...(message.key === undefined ? [] : ['key']), 'data', 'headers', 'id', 'type'].sort(),
    );
    const data = JSON.parse(message.data!) as Arrival['data'];
    const headers = JSON.parse(message.headers!) as Record<string, string>;
    expect(message.key ?? null).toBe(headers['ce-subject'] ?? null);
    expect(headers['ce-type']).toBe(message.type);
    return { id: message.id!, data, headers };
  });
}

/**
 * A redis-server of this test's own on a free port, its files in a directory. appendfsync always:
 * an XADD is on disk before it is answered, so a SIGKILL loses nothing the relay counted as
 * delivered. Removed after the file, whatever a test left running.
 */
class OwnRedis {
  static readonly all = new Set<OwnRedis>();
  private child: ChildProcess | undefined;
  private constructor(
    readonly port: number,
    readonly dir: string,
  ) {}

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  static async create(): Promise<OwnRedis> {
    const own = new OwnRedis(await freePort(), await mkdtemp(join(tmpdir(), 'ordo-own-redis-')));
    OwnRedis.all.add(own);
    return own;
  }

  async start(): Promise<void> {
    this.child = spawn(
      'redis-server',
      [
        ...['--port', String(this.port), '--bind', '127.0.0.1', '--dir', this.dir, '--save', ''],
        ...['--appendonly', 'yes', '--appendfsync', 'always'],
      ],
      { stdio: 'ignore' },
    );
    await until(
      'the own redis-server answers',
      async () => {
        const probe = createClient({ url: this.url, socket: { reconnectStrategy: false } });
        probe.on('error', () => undefined);
        try {
          await probe.connect();
          probe.destroy();
          return true;
        } catch {
          return false;
        }
      },
      10_000,
    );
  }

  /** SIGKILL: a crash. SIGSTOP freezes it (connections stay open, nothing is answered); SIGCONT wakes it. */
  async signal(signal: 'SIGKILL' | 'SIGSTOP' | 'SIGCONT'): Promise<void> {
    const child = this.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    if (signal !== 'SIGKILL') {
      child.kill(signal);
      return;
    }
    this.child = undefined;
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGKILL');
    await exited;
  }

  /** A client of this server, for the test to read what arrived. */
  async client(): Promise<typeof client> {
    const reader = createClient({ url: this.url });
    reader.on('error', () => undefined);
    await reader.connect();
    return reader as typeof client;
  }

  async remove(): Promise<void> {
    await this.signal('SIGKILL');
    await rm(this.dir, { recursive: true, force: true });
    OwnRedis.all.delete(this);
  }
}

describe('relay to Redis Streams', () => {
  it('adds every committed message once, in commit order per key, with its id and CloudEvents attributes', async () => {
    const stream = key('orders');
    const topic = uniqueName('t');
    const relay = await ordo.outbox.relay({
      name: uniqueName('to_redis'),
      topic,
      partitions: 4,
      to: { redis: { url: REDIS, stream, maxLen: 1_000_000 } },
    });
    try {
      const committed = await appendLoad(ordo, topic);
      await until('the relay caught up', async () => (await relay.lag()).messagesBehind === 0, 30_000);
      const got = await arrivals(stream);
      expect(checkArrivals(got, committed)).toBe(0);
      for (const a of got) expectCloudEvents(a, topic);
      expect(new Set(got.map((a) => a.id)).size).toBe(got.length);
      expect(relay.state()).toMatchObject({ broker: 'redis', state: 'running', delivered: committed.length });
    } finally {
      await relay.stop();
    }
  });

  it('parks a message whose stream key holds a string (WRONGTYPE) after maxAttempts, and delivers the others', async () => {
    const good = key('good');
    const bad = key('bad');
    await client.set(bad, 'not a stream');
    const topic = uniqueName('t');
    const relayName = uniqueName('refused');
    const relay = await ordo.outbox.relay({
      name: relayName,
      topic,
      maxAttempts: 2,
      retryDelay: '10ms',
      to: { redis: { url: REDIS, stream: '{type}' } },
    });
    try {
      await ordo.outbox.append(topic, [
        { type: good, key: 'a', data: { key: 'a', seq: 1, label: 'first' } },
        { type: bad, key: 'a', data: { key: 'a', seq: 2, label: 'refused' } },
        { type: good, data: { key: 'a', seq: 3, label: 'last' } },
      ]);
      await until(
        'the relay went past the refused message',
        async () => (await relay.lag()).messagesBehind === 0,
        20_000,
      );
      const got = await arrivals(good);
      // 'last' went out in the same window as the refused message, behind it: the server added it,
      // and it is sent again (with the same id) on each attempt of the refused one and after the
      // park, since the checkpoint moves over the confirmed prefix alone. A stream keeps repeats;
      // its consumers deduplicate on the id field.
      const ids = new Map<string, string>();
      for (const a of got) {
        expect(a.id, `the repeat of ${a.data.label}`).toBe(ids.get(a.data.label) ?? a.id);
        ids.set(a.data.label, a.id);
      }
      expect([...ids.keys()]).toEqual(['first', 'last']);
      expect(got.length).toBeLessThanOrEqual(1 + 3);
      // A message without a key has no key field, rather than an empty one.
      expect((await entries(good)).map((m) => m.key ?? null)).toEqual(
        got.map((a) => (a.data.label === 'first' ? 'a' : null)),
      );
      expect(await client.get(bad)).toBe('not a stream');
      const parked = await ordo.outbox.deadLetters(relayName);
      expect(parked.map((d) => [(d.data as { label: string }).label, d.attempts])).toEqual([['refused', 2]]);
      expect(parked[0]!.error).toMatch(/Redis refused the XADD to bad_\w+: WRONGTYPE/);
    } finally {
      await relay.stop();
    }
  });

  it('trims the stream to about maxLen entries', async () => {
    const stream = key('trimmed');
    const topic = uniqueName('t');
    const relay = await ordo.outbox.relay({
      name: uniqueName('trim'),
      topic,
      to: { redis: { url: REDIS, stream, maxLen: 10 } },
    });
    try {
      const messages = Array.from({ length: 500 }, (_, i) => ({
        type: 'placed',
        key: 'k',
        data: { key: 'k', seq: i + 1, label: `m${i}` },
      }));
      await ordo.outbox.append(topic, messages);
      await until('the relay caught up', async () => (await relay.lag()).messagesBehind === 0, 20_000);
      // Approximate trimming removes whole nodes of the stream: fewer than were added, at least maxLen.
      const length = await client.xLen(stream);
      expect(length).toBeGreaterThanOrEqual(10);
      expect(length).toBeLessThan(500);
      const last = (await entries(stream)).at(-1)!;
      expect(JSON.parse(last.data!)).toMatchObject({ label: 'm499' });
    } finally {
      await relay.stop();
    }
  });

  it('a server away at the start, then killed mid-run: retried without counting attempts, nothing lost', async () => {
    const own = await OwnRedis.create();
    const stream = uniqueName('orders');
    const topic = uniqueName('t');
    const relayName = uniqueName('away');
    // maxAttempts 1: a failure counted as an attempt would park the message at once.
    const relay = await ordo.outbox.relay({
      name: relayName,
      topic,
      partitions: 4,
      maxAttempts: 1,
      retryDelay: '20ms',
      maxRetryDelay: '200ms',
      to: { redis: { url: own.url, stream, timeout: 1000 } },
    });
    try {
      const early = { key: 'early', seq: 1, label: 'c-early' };
      await ordo.outbox.append(topic, [
        { type: 'placed', key: early.key, data: early, headers: { traceparent: TRACEPARENT } },
      ]);
      await until('the relay reports the server away', () => relay.state().state === 'failing', 10_000);
      expect(relay.state().lastError).toMatch(/ECONNREFUSED/);
      expect(await relay.lag()).toMatchObject({ messagesBehind: 1, attempts: 0 });
      await own.start();
      await until('the early message arrived', () => relay.state().delivered === 1, 10_000);

      // Killed while writers append: what was confirmed is on disk; the rest is sent again.
      const writing = appendLoad(ordo, topic, { perWriter: 60 });
      await until('the relay is delivering the load', () => relay.state().delivered > 100, 20_000);
      await own.signal('SIGKILL');
      const committed = await writing;
      await until('the relay met the server gone', () => relay.state().state === 'failing', 10_000);
      await own.start();
      await until('the relay caught up', async () => (await relay.lag()).messagesBehind === 0, 30_000);

      const reader = await own.client();
      try {
        const got = await arrivals(stream, reader);
        // Only what was in flight at the kill may arrive twice, with the same id (checked there).
        expect(checkArrivals(got, [early, ...committed])).toBeLessThanOrEqual(4 * redis.window);
        for (const a of got) expectCloudEvents(a, topic);
      } finally {
        reader.destroy();
      }
      expect(await ordo.outbox.deadLetters(relayName)).toEqual([]);
    } finally {
      await own.remove();
      await relay.stop();
    }
  });

  it('a server that stops answering: the publish times out and is sent again, without counting attempts', async () => {
    const own = await OwnRedis.create();
    await own.start();
    const stream = uniqueName('orders');
    const topic = uniqueName('t');
    const relayName = uniqueName('frozen');
    const relay = await ordo.outbox.relay({
      name: relayName,
      topic,
      maxAttempts: 1,
      retryDelay: '20ms',
      maxRetryDelay: '200ms',
      to: { redis: { url: own.url, stream, timeout: 300 } },
    });
    const append = (label: string, seq: number) =>
      ordo.outbox.append(topic, [
        { type: 'placed', key: 'k', data: { key: 'k', seq, label }, headers: { traceparent: TRACEPARENT } },
      ]);
    try {
      await append('c-before', 1);
      await until('the first message was delivered', () => relay.state().delivered === 1, 10_000);
      await own.signal('SIGSTOP');
      await append('c-frozen', 2);
      await until('the relay reports the timeout', () => relay.state().state === 'failing', 10_000);
      expect(relay.state().lastError).toMatch(/Redis did not answer the XADD to orders_\w+ within 300 ms/);
      // Its next connection is not answered either: the attempt to connect times out the same way.
      await until('the relay reports the connection timing out', () =>
        /Redis did not answer on connecting within 300 ms/.test(relay.state().lastError ?? ''),
      );
      expect(await relay.lag()).toMatchObject({ messagesBehind: 1, attempts: 0 });
      await own.signal('SIGCONT');
      await until('the relay caught up', async () => (await relay.lag()).messagesBehind === 0, 10_000);
      const reader = await own.client();
      try {
        // The XADD sent before the freeze may run when the server wakes: a repeat, with the same id.
        const got = await arrivals(stream, reader);
        const committed = [
          { key: 'k', seq: 1, label: 'c-before' },
          { key: 'k', seq: 2, label: 'c-frozen' },
        ];
        expect(checkArrivals(got, committed)).toBeLessThanOrEqual(1);
      } finally {
        reader.destroy();
      }
      expect(await ordo.outbox.deadLetters(relayName)).toEqual([]);
    } finally {
      await own.remove();
      await relay.stop();
    }
  });

  it('refuses bad configuration when the relay is created, saying what to change', async () => {
    const topic = uniqueName('t');
    const refused = (to: unknown, ...expected: (string | RegExp)[]) =>
      expectRefused(ordo, topic, to, ...expected);
    await refused(
      { redis: { url: 'http://127.0.0.1:6379', stream: 's' } },
      /to\.redis\.url must start with redis: or rediss:/,
    );
    await refused({ redis: { url: '127.0.0.1:6379', stream: 's' } }, /to\.redis\.url must/);
    await refused({ redis: { url: 'redis://127.0.0.1:6379/orders', stream: 's' } }, /database number/);
    await refused({ redis: { url: REDIS } }, /to\.redis\.stream must be a non-empty string/);
    await refused({ redis: { url: REDIS, stream: '' } }, /to\.redis\.stream must be a non-empty string/);
    await refused(
      { redis: { url: REDIS, stream: 'orders:{tenant}' } },
      /to\.redis\.stream: \{tenant\} is not a field/,
    );
    await refused(
      { redis: { url: REDIS, stream: 's', maxLen: 0 } },
      /to\.redis\.maxLen must be a whole number from 1/,
    );
    await refused({ redis: { url: REDIS, stream: 's', maxLen: '100' } }, /to\.redis\.maxLen/);
    await refused(
      { redis: { url: REDIS, stream: 's', timeout: 'soon' } },
      /to\.redis\.timeout must be a number of milliseconds/,
    );
    await refused({ redis: { url: REDIS, stream: 's', key: 'x' } }, /to\.redis has no option 'key'/);
    expect((await ordo.outbox.subscriptions()).filter((s) => s.topic === topic)).toEqual([]);
  });

  it('describes its target without the password', () => {
    const config = redis.check({
      url: 'redis://user:s3cret@127.0.0.1:6379/2',
      stream: 'orders:{type}',
      maxLen: 5,
    });
    const shown = redis.describe(config);
    expect(shown).not.toContain('s3cret');
    expect(shown).toBe('redis redis://user:***@127.0.0.1:6379/2 stream orders:{type} maxLen ~5');
  });
});
