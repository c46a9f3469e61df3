// A relay to RabbitMQ (the machine's broker, guest/guest): every committed message is confirmed
// into the queues its exchange routes it to, in commit order per key, with its id in message_id and
// its CloudEvents attributes in the headers; a message no queue takes is parked and the others go
// on; a missing exchange, a nack and a connection the broker closes are waited out without
// parking anything; bad configuration is refused at creation.
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { type Channel, type ChannelModel, connect, type GetMessage, type Options } from 'amqplib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo } from '../src/index.js';
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

const AMQP = 'amqp://guest:guest@127.0.0.1:5672';
let server: OwnPostgres;
let ordo: Ordo;
let conn: ChannelModel;
let ch: Channel;
const exchanges: string[] = [];
const queues: string[] = [];

beforeAll(async () => {
  server = await ownPostgres();
  ordo = await createOrdo({ databaseUrl: server.url });
  conn = await connect(AMQP);
  ch = await conn.createChannel();
});
afterAll(async () => {
  await ordo?.close();
  for (const q of queues) await ch.deleteQueue(q).catch(() => undefined);
  for (const x of exchanges) await ch.deleteExchange(x).catch(() => undefined);
  await conn?.close();
  await server?.stop();
});

async function exchange(type: 'topic' | 'direct', name = uniqueName('orders')): Promise<string> {
  await ch.assertExchange(name, type, { durable: true });
  if (!exchanges.includes(name)) exchanges.push(name);
  return name;
}

async function queue(bindings: [exchange: string, key: string][], options: Options.AssertQueue = {}) {
  const name = uniqueName('q');
  await ch.assertQueue(name, { durable: true, ...options });
  queues.push(name);
  for (const [x, key] of bindings) await ch.bindQueue(name, x, key);
  return name;
}

/** What is in the queue now, taken off it in order. */
async function take(name: string): Promise<(Arrival & { message: GetMessage })[]> {
  const out: (Arrival & { message: GetMessage })[] = [];
  for (;;) {
    const m = await ch.get(name, { noAck: true });
    if (m === false) return out;
    out.push({
      id: m.properties.messageId as string,
      data: JSON.parse(m.content.toString('utf8')),
      headers: m.properties.headers as Record<string, string>,
      message: m,
    });
  }
}

describe('relay to RabbitMQ', () => {
  it('publishes every committed message once, in commit order per key, with its id and CloudEvents attributes', async () => {
    const x = await exchange('topic');
    const q = await queue([[x, '#']]);
    const topic = uniqueName('t');
    const startedAt = Math.floor(Date.now() / 1000);
    const relay = await ordo.outbox.relay({
      name: uniqueName('to_rabbitmq'),
      topic,
      partitions: 4,
      to: { rabbitmq: { url: AMQP, exchange: x, routingKey: '{type}.{partition}' } },
    });
    try {
      const committed = await appendLoad(ordo, topic);
      await until('the relay caught up', async () => (await relay.lag()).messagesBehind === 0, 30_000);
      const got = await take(q);
      expect(checkArrivals(got, committed)).toBe(0);
      for (const a of got) {
        expectCloudEvents(a, topic);
        expect(a.message.properties).toMatchObject({
          messageId: a.headers['ce-id'],
          contentType: 'application/json',
          deliveryMode: 2,
          type: 'placed',
        });
        expect(a.message.properties.timestamp).toBeGreaterThanOrEqual(startedAt);
        expect(a.message.properties.timestamp).toBeLessThanOrEqual(Date.now() / 1000);
        expect(a.message.fields).toMatchObject({
          exchange: x,
          routingKey: expect.stringMatching(/^placed\.[0-3]$/),
        });
      }
      const state = relay.state();
      expect(state).toMatchObject({ broker: 'rabbitmq', state: 'running', delivered: committed.length });
      // Where it publishes, without the password.
      expect(state.target).toBe(
        `rabbitmq amqp://guest:***@127.0.0.1:5672 exchange ${x} routing key {type}.{partition}`,
      );
    } finally {
      await relay.stop();
    }
  });

  it('parks a message no queue takes (returned as unroutable) after maxAttempts, and delivers the others in order', async () => {
    const x = await exchange('direct');
    const good = uniqueName('good');
    const q = await queue([[x, good]]);
    const topic = uniqueName('t');
    const relayName = uniqueName('refused');
    const relay = await ordo.outbox.relay({
      name: relayName,
      topic,
      maxAttempts: 2,
      retryDelay: '10ms',
      to: { rabbitmq: { url: AMQP, exchange: x, routingKey: '{type}' } },
    });
    try {
      await ordo.outbox.append(topic, [
        { type: good, key: 'a', data: { key: 'a', seq: 1, label: 'first' } },
        { type: 'nobody', key: 'a', data: { key: 'a', seq: 2, label: 'refused' } },
        { type: good, key: 'a', data: { key: 'a', seq: 3, label: 'last' } },
      ]);
      await until(
        'the relay went past the refused message',
        async () => (await relay.lag()).messagesBehind === 0,
        20_000,
      );
      // 'last' went out in the window behind 'refused' on the first attempt, and again after it.
      const labels = (await take(q)).map((a) => a.data.label);
      expect(labels.slice(0, 2)).toEqual(['first', 'last']);
      expect(new Set(labels)).toEqual(new Set(['first', 'last']));
      const parked = await ordo.outbox.deadLetters(relayName);
      expect(parked.map((d) => [(d.data as { label: string }).label, d.attempts])).toEqual([['refused', 2]]);
      expect(parked[0]!.error).toMatch(
        new RegExp(`RabbitMQ returned .*: no queue is bound to exchange '${x}' with routing key 'nobody'`),
      );
    } finally {
      await relay.stop();
    }
  });

  it('waits for an exchange that does not exist yet, parking nothing, and delivers once it is declared', async () => {
    const x = uniqueName('later');
    const topic = uniqueName('t');
    const relayName = uniqueName('later');
    const errors: string[] = [];
    const relay = await ordo.outbox.relay({
      name: relayName,
      topic,
      // A failure that counted would park the first message at once.
      maxAttempts: 1,
      retryDelay: '10ms',
      maxRetryDelay: '100ms',
      onError: (e) => errors.push(e.message),
      to: { rabbitmq: { url: AMQP, exchange: x, routingKey: 'k' } },
    });
    try {
      await ordo.outbox.append(topic, [
        { type: 'placed', key: 'a', data: { key: 'a', seq: 1, label: 'one' } },
        { type: 'placed', key: 'a', data: { key: 'a', seq: 2, label: 'two' } },
      ]);
      await until('the relay tried several times', () => errors.length >= 5);
      expect(errors[0]).toContain(`RabbitMQ at amqp://guest:***@127.0.0.1:5672 has no exchange '${x}'`);
      expect(relay.state().state).toBe('failing');
      expect(await relay.lag()).toMatchObject({ messagesBehind: 2, attempts: 0 });
      expect(await ordo.outbox.deadLetters(relayName)).toEqual([]);
      await exchange('direct', x);
      const q = await queue([[x, 'k']]);
      await until('the relay caught up', async () => (await relay.lag()).messagesBehind === 0, 20_000);
      expect((await take(q)).map((a) => a.data.label)).toEqual(['one', 'two']);
      expect(await ordo.outbox.deadLetters(relayName)).toEqual([]);
    } finally {
      await relay.stop();
    }
  });

  it('sends a nacked message again after a back-off, without counting it, until the queue takes it', async () => {
    const x = await exchange('direct');
    // A queue holding one message that nacks publishes beyond it.
    const q = await queue([[x, 'k']], { maxLength: 1, overflow: 'reject-publish' });
    const topic = uniqueName('t');
    const relayName = uniqueName('nacked');
    const errors: string[] = [];
    const relay = await ordo.outbox.relay({
      name: relayName,
      topic,
      maxAttempts: 1,
      retryDelay: '10ms',
      maxRetryDelay: '100ms',
      onError: (e) => errors.push(e.message),
      // One at a time: a queue taking a later message after nacking an earlier one would reorder.
      window: 1,
      to: { rabbitmq: { url: AMQP, exchange: x, routingKey: 'k' } },
    });
    try {
      await ordo.outbox.append(
        topic,
        ['one', 'two', 'three'].map((label, i) => ({
          type: 'placed',
          key: 'a',
          data: { key: 'a', seq: i + 1, label },
        })),
      );
      await until('the queue nacked several times', () => errors.length >= 5);
      expect(errors.every((e) => /RabbitMQ nacked/.test(e))).toBe(true);
      expect(await relay.lag()).toMatchObject({ messagesBehind: 2, attempts: 0 });
      expect(await ordo.outbox.deadLetters(relayName)).toEqual([]);
      const labels: string[] = [];
      await until('every message reached the queue', async () => {
        labels.push(...(await take(q)).map((a) => a.data.label));
        return labels.length >= 3;
      });
      expect(labels).toEqual(['one', 'two', 'three']);
      await until('the relay caught up', async () => (await relay.lag()).messagesBehind === 0);
      expect(await ordo.outbox.deadLetters(relayName)).toEqual([]);
    } finally {
      await relay.stop();
    }
  });

  it('reconnects when the broker closes its connection, losing nothing', async () => {
    const x = await exchange('topic');
    const q = await queue([[x, '#']]);
    const topic = uniqueName('t');
    const relay = await ordo.outbox.relay({
      name: uniqueName('forced'),
      topic,
      partitions: 4,
      retryDelay: '10ms',
      maxRetryDelay: '100ms',
      to: { rabbitmq: { url: AMQP, exchange: x, routingKey: '{key}' } },
    });
    try {
      await ordo.outbox.append(topic, {
        type: 'placed',
        key: 'warm-up',
        data: { key: 'warm-up', seq: 1, label: 'c-warm-up' },
      });
      await until('the relay connected', () => relay.state().delivered === 1);
      await closeConnections(`ordo relay to exchange '${x}'`);
      const committed = await appendLoad(ordo, topic);
      await until('the relay caught up', async () => (await relay.lag()).messagesBehind === 0, 30_000);
      expect(relay.state().lastError).toMatch(/CONNECTION[-_]FORCED/);
      const got = (await take(q)).filter((a) => a.data.key !== 'warm-up');
      checkArrivals(got, committed);
      for (const a of got) expectCloudEvents(a, topic);
    } finally {
      await relay.stop();
    }
  });

  it('refuses bad configuration when the relay is created, saying what to change', async () => {
    const topic = uniqueName('t');
    const refused = (to: unknown, ...expected: (string | RegExp)[]) =>
      expectRefused(ordo, topic, to, ...expected);
    const ok = { url: AMQP, exchange: 'orders', routingKey: '{type}' };
    await refused(
      { rabbitmq: { ...ok, url: 'http://127.0.0.1:5672' } },
      /to\.rabbitmq\.url must start with amqp: or amqps:/,
    );
    await refused(
      { rabbitmq: { ...ok, url: 'not a url' } },
      /to\.rabbitmq\.url must be a URL such as amqp:\/\/host:port/,
    );
    await refused(
      { rabbitmq: { ...ok, port: 5672 } },
      /to\.rabbitmq has no option 'port'/,
      /url, exchange, routingKey, timeout/,
    );
    await refused(
      { rabbitmq: { ...ok, routingKey: 'orders.{tenant}' } },
      /to\.rabbitmq\.routingKey: \{tenant\} is not a field: use \{topic\}, \{type\}, \{key\}, \{partition\}/,
    );
    await refused({ rabbitmq: { ...ok, routingKey: '{type' } }, /a '\{' without its '\}'/);
    await refused(
      { rabbitmq: { ...ok, routingKey: undefined } },
      /to\.rabbitmq\.routingKey must be a non-empty string/,
    );
    await refused({ rabbitmq: { ...ok, routingKey: 'x'.repeat(256) } }, /at most 255 bytes/);
    await refused(
      { rabbitmq: { ...ok, exchange: undefined } },
      /to\.rabbitmq\.exchange must be the name of an exchange/,
      /''/,
    );
    await refused(
      { rabbitmq: { ...ok, timeout: '5s' } },
      /to\.rabbitmq\.timeout must be a number of milliseconds/,
    );
    // Nothing was created for a refused relay.
    expect((await ordo.outbox.subscriptions()).filter((s) => s.topic === topic)).toEqual([]);
  });
});

/** Has the broker close the connections a client named `name` (rabbitmqctl, as an operator would). */
async function closeConnections(name: string): Promise<void> {
  const run = promisify(execFile);
  const { stdout } = await run('rabbitmqctl', [
    'list_connections',
    'pid',
    'client_properties',
    '-q',
    '--no-table-headers',
  ]);
  const ours = stdout
    .split('\n')
    .filter((line) => line.includes(`{"connection_name","${name}"}`))
    .map((line) => line.split('\t')[0]!);
  expect(ours.length).toBeGreaterThan(0);
  for (const pid of ours) await run('rabbitmqctl', ['close_connection', pid, 'closed by the test']);
}
