// A relay to NATS JetStream (the machine's nats-server -js): every committed message is in the
// stream once (Nats-Msg-Id), in commit order per key, with its CloudEvents attributes; a message
// no stream takes is parked and the others go on; bad configuration is refused at creation.
import { connect, type NatsConnection } from '@nats-io/transport-node';
import { jetstreamManager, type JetStreamManager } from '@nats-io/jetstream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo } from '../src/index.js';
import { optionalPackage } from '../src/optional-package.js';
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

const NATS = 'nats://127.0.0.1:4222';
let server: OwnPostgres;
let ordo: Ordo;
let nc: NatsConnection;
let jsm: JetStreamManager;
const streams: string[] = [];

beforeAll(async () => {
  server = await ownPostgres();
  ordo = await createOrdo({ databaseUrl: server.url });
  nc = await connect({ servers: NATS });
  jsm = await jetstreamManager(nc);
});
afterAll(async () => {
  await ordo?.close();
  for (const s of streams) await jsm.streams.delete(s).catch(() => undefined);
  await nc?.close();
  await server?.stop();
});

async function stream(subjects: string[]): Promise<string> {
  const name = uniqueName('ORDO').toUpperCase();
  await jsm.streams.add({ name, subjects });
  streams.push(name);
  return name;
}

async function arrivals(name: string): Promise<Arrival[]> {
  const info = await jsm.streams.info(name);
  const out: Arrival[] = [];
  for (let seq = 1; seq <= info.state.last_seq; seq++) {
    const m = (await jsm.streams.getMessage(name, { seq }))!;
    const headers: Record<string, string> = {};
    for (const [k] of m.header) headers[k] = m.header.get(k);
    out.push({ id: m.header.get('Nats-Msg-Id'), data: m.json(), headers });
  }
  return out;
}

describe('relay to NATS JetStream', () => {
  it('publishes every committed message once, in commit order per key, with its id and CloudEvents attributes', async () => {
    const subject = uniqueName('orders');
    const name = await stream([`${subject}.>`]);
    const topic = uniqueName('t');
    const relay = await ordo.outbox.relay({
      name: uniqueName('to_nats'),
      topic,
      partitions: 4,
      to: { nats: { servers: NATS, subject: `${subject}.{type}.{partition}` } },
    });
    try {
      const committed = await appendLoad(ordo, topic);
      await until('the relay caught up', async () => (await relay.lag()).messagesBehind === 0, 30_000);
      const got = await arrivals(name);
      expect(checkArrivals(got, committed)).toBe(0);
      for (const a of got) expectCloudEvents(a, topic);
      expect(relay.state()).toMatchObject({ broker: 'nats', state: 'running', delivered: committed.length });
    } finally {
      await relay.stop();
    }
  });

  it('parks a message no stream takes after maxAttempts, and delivers the others of its partition', async () => {
    const subject = uniqueName('good');
    const name = await stream([`${subject}.>`]);
    const topic = uniqueName('t');
    const relayName = uniqueName('refused');
    const relay = await ordo.outbox.relay({
      name: relayName,
      topic,
      maxAttempts: 2,
      retryDelay: '10ms',
      to: { nats: { servers: NATS, subject: `{type}.x` } },
    });
    try {
      await ordo.outbox.append(topic, [
        { type: subject, key: 'a', data: { key: 'a', seq: 1, label: 'first' } },
        { type: 'nobody', key: 'a', data: { key: 'a', seq: 2, label: 'refused' } },
        { type: subject, key: 'a', data: { key: 'a', seq: 3, label: 'last' } },
      ]);
      await until(
        'the relay went past the refused message',
        async () => (await relay.lag()).messagesBehind === 0,
        20_000,
      );
      expect((await arrivals(name)).map((a) => a.data.label)).toEqual(['first', 'last']);
      const parked = await ordo.outbox.deadLetters(relayName);
      expect(parked.map((d) => [(d.data as { label: string }).label, d.attempts])).toEqual([['refused', 2]]);
      expect(parked[0]!.error).toMatch(/NATS refused nobody\.x/);
    } finally {
      await relay.stop();
    }
  });

  it('refuses bad configuration when the relay is created, saying what to change', async () => {
    const topic = uniqueName('t');
    const refused = (to: unknown, ...expected: (string | RegExp)[]) =>
      expectRefused(ordo, topic, to, ...expected);
    await refused(undefined, /to: \{ nats \| rabbitmq \| redis \| mqtt \| webhook/);
    await refused({ kafka: {} }, /exactly one broker/, /kafka/);
    await refused({ nats: {}, redis: {} }, /exactly one broker/);
    await refused(
      { nats: { servers: 'localhost:4222', subject: 'a' } },
      /to\.nats\.servers\[0\] must start with nats:/,
    );
    await refused({ nats: { servers: NATS, subject: 'orders.*' } }, /wildcards/);
    await refused(
      { nats: { servers: NATS, subject: 'orders.{tenant}' } },
      /\{tenant\} is not a field: use \{topic\}, \{type\}, \{key\}, \{partition\}/,
    );
    await refused({ nats: { servers: NATS, subject: 'orders.{type' } }, /a '\{' without its '\}'/);
    await refused({ nats: { servers: NATS, subject: 'a', port: 1 } }, /port/);
    // Nothing was created for a refused relay.
    expect((await ordo.outbox.subscriptions()).filter((s) => s.topic === topic)).toEqual([]);
  });

  it('a client library that is not installed is named, with the npm install to run', async () => {
    const pkg = 'ordo-no-such-broker-client';
    const e = await optionalPackage(() => import(pkg), pkg, 'a relay to Kafka').catch((err: unknown) => err);
    expect(e).toMatchObject({
      code: 'invalid_argument',
      message: `a relay to Kafka needs ${pkg}, which is not installed: npm install ${pkg}`,
    });
  });
});
