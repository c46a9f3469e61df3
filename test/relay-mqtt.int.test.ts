// A relay to MQTT 5 (the machine's Mosquitto, and Mosquitto brokers of this file's own that it
// stops or configures): every committed message reaches a QoS 1 subscriber, in commit order per
// key, with its id and CloudEvents attributes as user properties; a message the broker refuses
// (not authorized) or that names no topic is parked and the others go on; a broker away at the
// start or stopped mid-run loses nothing; bad configuration is refused at creation.
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import { connectAsync, type IClientOptions, type MqttClient } from 'mqtt';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '../src/db/embedded.js';
import { createOrdo, type Ordo } from '../src/index.js';
import { mqtt } from '../src/outbox/relays/mqtt.js';
import { type OwnPostgres, ownPostgres } from './support/own-postgres.js';
import {
  type Arrival,
  appendLoad,
  checkArrivals,
  type Committed,
  expectCloudEvents,
  uniqueName,
  expectRefused,
} from './support/relay-load.js';
import { until } from './support/until.js';

const MQTT = 'mqtt://127.0.0.1:1883';
const TRACEPARENT = `00-${'a'.repeat(32)}-${'b'.repeat(16)}-01`;
/** The CloudEvents attributes, which the MQTT binding names without the `ce-` of other brokers. */
const ATTRIBUTES = ['specversion', 'id', 'type', 'source', 'subject', 'time'];
let server: OwnPostgres;
let ordo: Ordo;

beforeAll(async () => {
  server = await ownPostgres();
  ordo = await createOrdo({ databaseUrl: server.url });
});
afterAll(async () => {
  for (const own of OwnMosquitto.all) await own.remove();
  await ordo?.close();
  await server?.stop();
});

/** A subscriber at QoS 1 that keeps every message it receives, as an Arrival. */
class Subscriber {
  readonly arrivals: Arrival[] = [];
  readonly raw: { topic: string; userProperties: Record<string, string>; contentType?: string }[] = [];
  private constructor(private readonly client: MqttClient) {
    client.on('message', (topic, payload, packet) => {
      const userProperties = (packet.properties?.userProperties ?? {}) as Record<string, string>;
      this.raw.push({ topic, userProperties, contentType: packet.properties?.contentType });
      const headers: Record<string, string> = {};
      for (const [name, value] of Object.entries(userProperties)) {
        headers[ATTRIBUTES.includes(name) ? `ce-${name}` : name] = value;
      }
      this.arrivals.push({
        id: userProperties['message-id']!,
        data: JSON.parse(payload.toString()) as Arrival['data'],
        headers,
      });
    });
  }

  static async start(url: string, filter: string, options: IClientOptions = {}): Promise<Subscriber> {
    const client = await connectAsync(url, { protocolVersion: 5, reconnectPeriod: 100, ...options });
    const granted = await client.subscribeAsync(filter, { qos: 1 });
    expect(granted.map((g) => g.qos)).toEqual([1]);
    return new Subscriber(client);
  }

  labels(): string[] {
    return this.arrivals.map((a) => a.data.label);
  }

  async close(): Promise<void> {
    await this.client.endAsync(true);
  }
}

/** A Mosquitto of this test's own on a free port, its configuration and state in a directory. */
class OwnMosquitto {
  /** Removed after the file, whatever a test left running. */
  static readonly all = new Set<OwnMosquitto>();
  private child: ChildProcess | undefined;
  private constructor(
    readonly port: number,
    readonly dir: string,
  ) {}

  get url(): string {
    return `mqtt://127.0.0.1:${this.port}`;
  }

  /** `acl`: the ACL file's text; `settings`: more lines of the configuration (of its listener). */
  static async create(options: { acl?: string; settings?: string[] } = {}): Promise<OwnMosquitto> {
    const own = new OwnMosquitto(await freePort(), await mkdtemp(join(tmpdir(), 'ordo-own-mosquitto-')));
    OwnMosquitto.all.add(own);
    const lines = [
      `listener ${own.port} 127.0.0.1`,
      'allow_anonymous true',
      // Kept across a stop: the subscriber's session and the messages queued for it.
      'persistence true',
      `persistence_location ${own.dir}/`,
      'max_queued_messages 100000',
      // Mosquitto started as root would switch to the user `mosquitto`, which cannot reach the directory.
      `user ${userInfo().username}`,
      ...(options.settings ?? []),
    ];
    if (options.acl !== undefined) {
      await writeFile(join(own.dir, 'acl'), options.acl);
      lines.push(`acl_file ${join(own.dir, 'acl')}`);
    }
    await writeFile(join(own.dir, 'mosquitto.conf'), `${lines.join('\n')}\n`);
    return own;
  }

  async start(): Promise<void> {
    this.child = spawn('mosquitto', ['-c', join(this.dir, 'mosquitto.conf')], { stdio: 'ignore' });
    await until(
      'the own mosquitto answers',
      async () => {
        try {
          const probe = await connectAsync(this.url, { reconnectPeriod: 0, connectTimeout: 500 }, false);
          await probe.endAsync(true);
          return true;
        } catch {
          return false;
        }
      },
      10_000,
    );
  }

  /** SIGTERM: Mosquitto writes its sessions and queued messages down, then exits. */
  async stop(): Promise<void> {
    const child = this.child;
    this.child = undefined;
    if (!child || child.exitCode !== null) return;
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGTERM');
    await exited;
  }

  /** SIGSTOP freezes it (connections stay open, nothing is answered); SIGCONT wakes it. */
  signal(signal: 'SIGSTOP' | 'SIGCONT'): void {
    this.child?.kill(signal);
  }

  async remove(): Promise<void> {
    const child = this.child;
    this.child = undefined;
    if (child && child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGKILL');
      await exited;
    }
    await rm(this.dir, { recursive: true, force: true });
    OwnMosquitto.all.delete(this);
  }
}

/** Each arrival's user properties are the CloudEvents MQTT binding's, with the id field. */
function expectBinding(sub: Subscriber, topic: string): void {
  for (const a of sub.arrivals) expectCloudEvents(a, topic);
  for (const r of sub.raw) {
    expect(r.contentType).toBe('application/json');
    expect(r.userProperties.id).toBe(r.userProperties['message-id']);
    expect(Object.keys(r.userProperties).filter((n) => n.startsWith('ce-') || n === 'content-type')).toEqual(
      [],
    );
  }
}

describe('relay to MQTT', () => {
  it('publishes every committed message, in commit order per key, with its id and CloudEvents user properties', async () => {
    const prefix = uniqueName('orders');
    const sub = await Subscriber.start(MQTT, `${prefix}/#`);
    const topic = uniqueName('t');
    const relay = await ordo.outbox.relay({
      name: uniqueName('to_mqtt'),
      topic,
      partitions: 4,
      to: { mqtt: { url: MQTT, topic: `${prefix}/{partition}/{key}` } },
    });
    try {
      const committed = await appendLoad(ordo, topic);
      await until('the relay caught up', async () => (await relay.lag()).messagesBehind === 0, 30_000);
      await until('the subscriber received them', () => sub.arrivals.length >= committed.length, 10_000);
      // A QoS 1 repeat would carry the same id (checked there); a run without failures has none.
      expect(checkArrivals(sub.arrivals, committed)).toBe(0);
      expectBinding(sub, topic);
      for (const r of sub.raw) {
        expect(r.topic).toMatch(new RegExp(`^${prefix}/[0-3]/${r.userProperties.subject}$`));
      }
      expect(relay.state()).toMatchObject({ broker: 'mqtt', state: 'running', delivered: committed.length });
    } finally {
      await relay.stop();
      await sub.close();
    }
  });

  it('at QoS 2, delivered on PUBCOMP, beyond the broker’s Receive Maximum of 20 in flight', async () => {
    const prefix = uniqueName('orders');
    const sub = await Subscriber.start(MQTT, `${prefix}/#`);
    const topic = uniqueName('t');
    const relay = await ordo.outbox.relay({
      name: uniqueName('qos2'),
      topic,
      partitions: 2,
      to: { mqtt: { url: MQTT, topic: `${prefix}/{key}`, qos: 2 } },
    });
    try {
      // One transaction, one batch per partition: far more than 20 publishes wait at once, and
      // Mosquitto answers QoS 2 publishes beyond its Receive Maximum with Quota exceeded.
      const committed: Committed[] = Array.from({ length: 400 }, (_, i) => ({
        key: `key-${i % 10}`,
        seq: Math.floor(i / 10) + 1,
        label: `c-${i}`,
      }));
      await ordo.outbox.append(
        topic,
        committed.map((c) => ({
          type: 'placed',
          key: c.key,
          data: c,
          headers: { traceparent: TRACEPARENT },
        })),
      );
      await until('the relay caught up', async () => (await relay.lag()).messagesBehind === 0, 30_000);
      await until('the subscriber received them', () => sub.arrivals.length >= committed.length, 10_000);
      expect(checkArrivals(sub.arrivals, committed)).toBe(0);
      expectBinding(sub, topic);
      expect(relay.state()).toMatchObject({ state: 'running', delivered: committed.length, lastError: null });
    } finally {
      await relay.stop();
      await sub.close();
    }
  });

  it('parks a message the broker refuses (not authorized) or that names no topic, and delivers the others', async () => {
    const allowed = uniqueName('allowed');
    const denied = uniqueName('denied');
    const broker = await OwnMosquitto.create({ acl: `topic readwrite ${allowed}/#\n` });
    await broker.start();
    const sub = await Subscriber.start(broker.url, `${allowed}/#`);
    const topic = uniqueName('t');
    const relayName = uniqueName('refused');
    const relay = await ordo.outbox.relay({
      name: relayName,
      topic,
      maxAttempts: 2,
      retryDelay: '10ms',
      to: { mqtt: { url: broker.url, topic: '{type}/{key}' } },
    });
    try {
      await ordo.outbox.append(topic, [
        { type: allowed, key: 'a', data: { key: 'a', seq: 1, label: 'first' } },
        { type: denied, key: 'a', data: { key: 'a', seq: 2, label: 'refused' } },
        { type: allowed, key: 'a', data: { key: 'a', seq: 3, label: 'last' } },
        { type: allowed, key: 'b+c', data: { key: 'b+c', seq: 1, label: 'wildcard' } },
      ]);
      await until(
        'the relay went past the refused messages',
        async () => (await relay.lag()).messagesBehind === 0,
        20_000,
      );
      await until('the subscriber received the last', () => sub.labels().includes('last'), 5_000);
      // 'last' went out in the window behind the refused message: the broker took it, and it is
      // sent again (with the same id) on each attempt of the refused one and after the park.
      const ids = new Map<string, string>();
      for (const a of sub.arrivals) {
        expect(a.id, `the repeat of ${a.data.label}`).toBe(ids.get(a.data.label) ?? a.id);
        ids.set(a.data.label, a.id);
      }
      expect([...ids.keys()]).toEqual(['first', 'last']);
      expect(sub.arrivals.length).toBeLessThanOrEqual(1 + 3);
      const parked = await ordo.outbox.deadLetters(relayName);
      expect(parked.map((d) => [(d.data as { label: string }).label, d.attempts]).sort()).toEqual([
        ['refused', 2],
        ['wildcard', 2],
      ]);
      const errors = Object.fromEntries(parked.map((d) => [(d.data as { label: string }).label, d.error]));
      expect(errors.refused).toMatch(new RegExp(`the MQTT broker refused ${denied}/a: .*Not authorized`));
      expect(errors.wildcard).toMatch(
        /'allowed_\w+\/b\+c' is not an MQTT topic to publish to: it holds the wildcard/,
      );
    } finally {
      await broker.remove();
      await relay.stop();
      await sub.close();
    }
  });

  it('a broker away at the start, then stopped mid-run: retried without counting attempts, nothing lost', async () => {
    const prefix = uniqueName('orders');
    const broker = await OwnMosquitto.create();
    await broker.start();
    // A persistent session: what the relay publishes while the subscriber is away waits for it.
    const sub = await Subscriber.start(broker.url, `${prefix}/#`, {
      clientId: uniqueName('sub'),
      clean: false,
      properties: { sessionExpiryInterval: 3600 },
    });
    await broker.stop();
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
      to: { mqtt: { url: broker.url, topic: `${prefix}/{key}`, timeout: 1000 } },
    });
    try {
      const early = { key: 'early', seq: 1, label: 'c-early' };
      await ordo.outbox.append(topic, [
        { type: 'placed', key: early.key, data: early, headers: { traceparent: TRACEPARENT } },
      ]);
      await until('the relay reports the broker away', () => relay.state().state === 'failing', 10_000);
      expect(relay.state().lastError).toMatch(/ECONNREFUSED/);
      expect(await relay.lag()).toMatchObject({ messagesBehind: 1, attempts: 0 });
      await broker.start();
      await until('the early message was delivered', () => relay.state().delivered === 1, 10_000);

      // Stopped while writers append; the relay sends again what was not acknowledged.
      const writing = appendLoad(ordo, topic, { perWriter: 40 });
      await until('the relay is delivering the load', () => relay.state().delivered > 50, 20_000);
      await broker.stop();
      const committed = [early, ...(await writing)];
      await until('the relay met the broker gone', () => relay.state().state === 'failing', 10_000);
      await broker.start();
      await until('the relay caught up', async () => (await relay.lag()).messagesBehind === 0, 30_000);
      await until(
        'the subscriber received them',
        () => new Set(sub.labels()).size >= committed.length,
        20_000,
      );
      // Only what was in flight at the stop may arrive twice, with the same id (checked there).
      expect(checkArrivals(sub.arrivals, committed)).toBeLessThanOrEqual(4 * mqtt.window);
      expectBinding(sub, topic);
      expect(await ordo.outbox.deadLetters(relayName)).toEqual([]);
    } finally {
      await broker.remove();
      await relay.stop();
      await sub.close();
    }
  });

  it('a broker that stops answering: the publish times out and is sent again, without counting attempts', async () => {
    const prefix = uniqueName('orders');
    const broker = await OwnMosquitto.create();
    await broker.start();
    const sub = await Subscriber.start(broker.url, `${prefix}/#`);
    const topic = uniqueName('t');
    const relayName = uniqueName('frozen');
    const relay = await ordo.outbox.relay({
      name: relayName,
      topic,
      maxAttempts: 1,
      retryDelay: '20ms',
      maxRetryDelay: '200ms',
      to: { mqtt: { url: broker.url, topic: `${prefix}/{key}`, timeout: 300 } },
    });
    const append = (label: string, seq: number) =>
      ordo.outbox.append(topic, [
        { type: 'placed', key: 'k', data: { key: 'k', seq, label }, headers: { traceparent: TRACEPARENT } },
      ]);
    try {
      await append('c-before', 1);
      await until('the first message was delivered', () => relay.state().delivered === 1, 10_000);
      broker.signal('SIGSTOP');
      await append('c-frozen', 2);
      await until('the relay reports the timeout', () => relay.state().state === 'failing', 10_000);
      expect(relay.state().lastError).toMatch(
        new RegExp(`the MQTT broker did not acknowledge a publish to ${prefix}/k within 300 ms`),
      );
      // Its next connection is not answered either: no CONNACK within the timeout.
      await until('the relay reports the connection timing out', () =>
        /connack timeout/.test(relay.state().lastError ?? ''),
      );
      expect(await relay.lag()).toMatchObject({ messagesBehind: 1, attempts: 0 });
      broker.signal('SIGCONT');
      await until('the relay caught up', async () => (await relay.lag()).messagesBehind === 0, 10_000);
      await until('the subscriber received both', () => new Set(sub.labels()).size === 2, 10_000);
      // The publish sent before the freeze may reach the subscriber when the broker wakes: a
      // repeat, with the same id.
      const committed = [
        { key: 'k', seq: 1, label: 'c-before' },
        { key: 'k', seq: 2, label: 'c-frozen' },
      ];
      expect(checkArrivals(sub.arrivals, committed)).toBeLessThanOrEqual(1);
      expect(await ordo.outbox.deadLetters(relayName)).toEqual([]);
    } finally {
      await broker.remove();
      await relay.stop();
      await sub.close();
    }
  });

  it('a broker that takes QoS 1 at most, for a relay at QoS 2: failing with what to change, nothing parked', async () => {
    const broker = await OwnMosquitto.create({ settings: ['max_qos 1'] });
    await broker.start();
    const topic = uniqueName('t');
    const relayName = uniqueName('qos');
    const relay = await ordo.outbox.relay({
      name: relayName,
      topic,
      maxAttempts: 1,
      retryDelay: '20ms',
      to: { mqtt: { url: broker.url, topic: 'orders/{key}', qos: 2 } },
    });
    try {
      await ordo.outbox.append(topic, [{ type: 'placed', key: 'k', data: { label: 'waits' } }]);
      await until('the relay reports the QoS', () =>
        /the MQTT broker takes QoS 1 at most: set to\.mqtt\.qos to 1/.test(relay.state().lastError ?? ''),
      );
      expect(await relay.lag()).toMatchObject({ messagesBehind: 1, attempts: 0 });
      expect(await ordo.outbox.deadLetters(relayName)).toEqual([]);
    } finally {
      await broker.remove();
      await relay.stop();
    }
  });

  it('refuses bad configuration when the relay is created, saying what to change', async () => {
    const topic = uniqueName('t');
    const refused = (to: unknown, ...expected: (string | RegExp)[]) =>
      expectRefused(ordo, topic, to, ...expected);
    await refused(
      { mqtt: { url: 'tcp://127.0.0.1:1883', topic: 'a' } },
      /to\.mqtt\.url must start with mqtt: or mqtts:/,
    );
    await refused({ mqtt: { url: '127.0.0.1:1883', topic: 'a' } }, /to\.mqtt\.url must/);
    await refused({ mqtt: { url: `${MQTT}/orders`, topic: 'a' } }, /the topic goes in to\.mqtt\.topic/);
    await refused({ mqtt: { url: MQTT } }, /to\.mqtt\.topic must be a non-empty string/);
    await refused({ mqtt: { url: MQTT, topic: 'orders/+/x' } }, /wildcards \+ and #/, /orders\/\+\/x/);
    await refused({ mqtt: { url: MQTT, topic: 'orders/#' } }, /wildcard \+ or #/);
    await refused({ mqtt: { url: MQTT, topic: '$SYS/orders' } }, /leading \$/);
    await refused(
      { mqtt: { url: MQTT, topic: 'orders/{tenant}' } },
      /to\.mqtt\.topic: \{tenant\} is not a field/,
    );
    await refused({ mqtt: { url: MQTT, topic: 'a', qos: 0 } }, /to\.mqtt\.qos must be 1 or 2/, /acknowledg/);
    await refused({ mqtt: { url: MQTT, topic: 'a', qos: 3 } }, /to\.mqtt\.qos must be 1 or 2 \(got 3\)/);
    await refused({ mqtt: { url: MQTT, topic: 'a', qos: '1' } }, /to\.mqtt\.qos must be 1 or 2/);
    await refused(
      { mqtt: { url: MQTT, topic: 'a', timeout: -5 } },
      /to\.mqtt\.timeout must be a number of milliseconds/,
    );
    await refused({ mqtt: { url: MQTT, topic: 'a', retain: true } }, /to\.mqtt has no option 'retain'/);
    expect((await ordo.outbox.subscriptions()).filter((s) => s.topic === topic)).toEqual([]);
  });

  it('describes its target without the password', () => {
    const config = mqtt.check({ url: 'mqtts://relay:s3cret@broker.example:8883', topic: 'orders/{key}' });
    const shown = mqtt.describe(config);
    expect(shown).not.toContain('s3cret');
    expect(shown).toBe('mqtt mqtts://relay:***@broker.example:8883 topic orders/{key} qos 1');
  });
});
