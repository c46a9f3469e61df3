import { randomBytes } from 'node:crypto';
import { createHistogram, performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { jetstreamManager } from '@nats-io/jetstream';
import { connect } from '@nats-io/transport-node';
import amqp from 'amqplib';
import { connectAsync } from 'mqtt';
import { createClient } from 'redis';
import { createOrdo, type Ordo, type RelayTarget } from '../src/index.js';
import { BROKERS, type RelayBroker } from '../src/outbox/relays/brokers.js';
import { parseTemplate, toRelayMessage } from '../src/outbox/relays/envelope.js';
import { type BenchContext, fmt, ratioCell, type Suite, type Table } from './harness.js';
import { PAYLOAD } from './outbox.js';

/**
 * Relays, per broker on this machine: (a) a backlog drained by the relay until the broker
 * confirmed every message, beside the relay's own client publishing the same messages in a tight
 * loop with the same window and confirmations (the broker's limit here), and beside the relay
 * with a window of 1 (one message at a time, each confirmed before the next, as synchronous sinks
 * publish); (b) commit-to-broker latency at a steady rate.
 */

const BACKLOG = 100_000;
const ONE_AT_A_TIME = 5_000;
const CHUNK = 1_000;
const RATE = 1_000;
const RATE_SECONDS = 5;
const GOAL = { ratio: 0.7, p99Ms: 50 };

/** What the bench needs of a broker beyond the relay: a destination, and what arrived there. */
interface BrokerBench {
  broker: RelayBroker;
  /** A smaller backlog for a broker a partition feeds one message at a time (a webhook). */
  backlog?: number;
  /** A destination of its own for one scenario, and the relay's `to` for it. */
  destination(): Promise<{
    to: RelayTarget;
    stored(): Promise<number>;
    listen(arrived: (at: number, id: string) => void): Promise<() => Promise<void>>;
    remove(): Promise<void>;
  }>;
}

const NATS_URL = 'nats://127.0.0.1:4222';

const nats: BrokerBench = {
  broker: 'nats',
  async destination() {
    const nc = await connect({ servers: NATS_URL });
    const jsm = await jetstreamManager(nc);
    const subject = `ordo_bench_${randomBytes(4).toString('hex')}`;
    await jsm.streams.add({ name: subject.toUpperCase(), subjects: [`${subject}.>`] });
    return {
      to: { nats: { servers: NATS_URL, subject: `${subject}.{type}` } },
      stored: async () => (await jsm.streams.info(subject.toUpperCase())).state.messages,
      async listen(arrived) {
        const sub = nc.subscribe(`${subject}.>`, {
          callback: (_e, m) => arrived(performance.now(), m.headers?.get('Nats-Msg-Id') ?? ''),
        });
        return async () => sub.unsubscribe();
      },
      async remove() {
        await jsm.streams.delete(subject.toUpperCase()).catch(() => undefined);
        await nc.close();
      },
    };
  },
};

const RABBITMQ_URL = 'amqp://guest:guest@127.0.0.1:5672';

const rabbitmq: BrokerBench = {
  broker: 'rabbitmq',
  async destination() {
    const conn = await amqp.connect(RABBITMQ_URL);
    const ch = await conn.createChannel();
    const name = `ordo_bench_${randomBytes(4).toString('hex')}`;
    await ch.assertExchange(name, 'topic', { durable: false, autoDelete: false });
    await ch.assertQueue(name, { durable: true });
    await ch.bindQueue(name, name, '#');
    return {
      to: { rabbitmq: { url: RABBITMQ_URL, exchange: name, routingKey: '{type}' } },
      stored: async () => (await ch.checkQueue(name)).messageCount,
      async listen(arrived) {
        const { consumerTag } = await ch.consume(
          name,
          (m) => m && arrived(performance.now(), String(m.properties.messageId)),
          { noAck: true },
        );
        return async () => void (await ch.cancel(consumerTag));
      },
      async remove() {
        await ch.deleteQueue(name).catch(() => undefined);
        await ch.deleteExchange(name).catch(() => undefined);
        await conn.close();
      },
    };
  },
};

const REDIS_URL = 'redis://127.0.0.1:6379';

const redis: BrokerBench = {
  broker: 'redis',
  async destination() {
    const client = createClient({ url: REDIS_URL });
    await client.connect();
    const reader = client.duplicate();
    await reader.connect();
    const stream = `ordo_bench_${randomBytes(4).toString('hex')}`;
    let listening = false;
    return {
      to: { redis: { url: REDIS_URL, stream } },
      stored: () => client.xLen(stream),
      async listen(arrived) {
        listening = true;
        let last = '0';
        const reading = (async () => {
          while (listening) {
            const got = (await reader.xRead({ key: stream, id: last }, { BLOCK: 100, COUNT: 1000 })) as
              { messages: { id: string; message: Record<string, string> }[] }[] | null;
            const now = performance.now();
            for (const m of got?.[0]?.messages ?? []) {
              last = m.id;
              arrived(now, m.message.id ?? '');
            }
          }
        })();
        return async () => {
          listening = false;
          await reading;
        };
      },
      async remove() {
        await client.del(stream);
        await Promise.all([client.quit(), reader.quit()]);
      },
    };
  },
};

const MQTT_URL = 'mqtt://127.0.0.1:1883';

const mqtt: BrokerBench = {
  broker: 'mqtt',
  async destination() {
    // MQTT keeps no count of what it took: a subscriber at QoS 1 counts what it hands on.
    const prefix = `ordo_bench_${randomBytes(4).toString('hex')}`;
    const client = await connectAsync(MQTT_URL, { protocolVersion: 5 });
    let received = 0;
    let onArrival: ((at: number, id: string) => void) | undefined;
    client.on('message', (_topic, _payload, packet) => {
      received++;
      const id = packet.properties?.userProperties?.['message-id'];
      onArrival?.(performance.now(), Array.isArray(id) ? id[0]! : (id ?? ''));
    });
    await client.subscribeAsync(`${prefix}/#`, { qos: 1 });
    return {
      to: { mqtt: { url: MQTT_URL, topic: `${prefix}/{type}`, qos: 1 } },
      stored: async () => received,
      async listen(arrived) {
        onArrival = arrived;
        return async () => {
          onArrival = undefined;
        };
      },
      async remove() {
        await client.endAsync();
      },
    };
  },
};

const webhook: BrokerBench = {
  broker: 'webhook',
  backlog: 10_000,
  async destination() {
    // A receiver that answers 200 at once: the limit is the relay's and HTTP's, not a handler's.
    let received = 0;
    let onArrival: ((at: number, id: string) => void) | undefined;
    const server = createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        received++;
        onArrival?.(performance.now(), String(req.headers['webhook-id'] ?? ''));
        res.writeHead(200).end();
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as AddressInfo;
    return {
      to: {
        webhook: {
          url: `http://127.0.0.1:${port}/hooks/{type}`,
          secret: `whsec_${randomBytes(24).toString('base64')}`,
        },
      },
      stored: async () => received,
      async listen(arrived) {
        onArrival = arrived;
        return async () => {
          onArrival = undefined;
        };
      },
      async remove() {
        server.closeAllConnections();
        await new Promise((resolve) => server.close(resolve));
      },
    };
  },
};

const BENCHES: BrokerBench[] = [nats, rabbitmq, redis, mqtt, webhook];

export const relay: Suite = {
  name: 'relay',
  async run(ctx) {
    const ordo = await createOrdo({ databaseUrl: ctx.url, poolSize: 8 });
    // The application appending, as in production a pool apart from the relay's: appends
    // queued on the relay's own pool would hold its reads back.
    const appender = await createOrdo({ databaseUrl: ctx.url, poolSize: 8 });
    try {
      const drain: Table = {
        title: `relay — a backlog of ${fmt.int(BACKLOG)} messages until the broker confirmed all (window 1 and webhooks: fewer)`,
        columns: [
          { header: 'broker', align: 'left' },
          { header: 'scenario', align: 'left' },
          { header: 'messages' },
          { header: 'msg/s' },
          { header: 'ratio' },
        ],
        rows: [],
        notes: [
          'relay: ordo.outbox.relay() from the beginning of a prefilled topic, 1 partition, its default window and batch size;',
          "  the client: the relay's own publisher (same connection, ids, headers and confirmations) in a tight loop, same window;",
          '  window 1: the same relay publishing one message at a time, each confirmed before the next.',
        ],
        failures: [],
      };
      const latency: Table = {
        title: `relay — commit-to-broker latency, ${fmt.int(RATE)} messages/s for ${RATE_SECONDS} s, one per transaction`,
        columns: [
          { header: 'broker', align: 'left' },
          { header: 'messages' },
          { header: 'p50 ms' },
          { header: 'p99 ms' },
          { header: 'max ms' },
          { header: 'goal', align: 'left' },
        ],
        rows: [],
        failures: [],
      };
      for (const b of BENCHES) {
        ctx.log(`relay ${b.broker}: backlog`);
        const backlog = b.backlog ?? BACKLOG;
        const viaRelay = await drainRate(ordo, b, backlog, undefined, ctx);
        const oneAtATime = await drainRate(ordo, b, ONE_AT_A_TIME, 1, ctx);
        const client = await clientRate(b, backlog);
        drain.rows.push(
          [b.broker, 'relay', fmt.int(backlog), fmt.int(viaRelay), ''],
          [b.broker, 'the client alone (limit)', fmt.int(backlog), fmt.int(client), ''],
          [b.broker, 'relay, window 1', fmt.int(ONE_AT_A_TIME), fmt.int(oneAtATime), ''],
          [b.broker, `goal relay ≥ ${GOAL.ratio} × client`, '', '', ratioCell(viaRelay / client, GOAL.ratio)],
          [b.broker, 'relay ÷ window 1', '', '', `${(viaRelay / oneAtATime).toFixed(1)}×`],
          null,
        );
        ctx.log(`relay ${b.broker}: latency`);
        const l = await latencyAtRate(ordo, appender, b, ctx);
        latency.rows.push([
          b.broker,
          fmt.int(l.count),
          l.p50.toFixed(2),
          l.p99.toFixed(2),
          l.max.toFixed(2),
          `p99 ≤ ${GOAL.p99Ms} ms: ${l.p99 <= GOAL.p99Ms ? '✓' : '✗'}`,
        ]);
        if (l.count !== RATE * RATE_SECONDS)
          latency.failures!.push(`${b.broker}: ${l.count} of ${RATE * RATE_SECONDS} arrived`);
      }
      drain.rows.pop();
      return [drain, latency];
    } finally {
      await Promise.all([ordo.close(), appender.close()]);
    }
  },
};

const topicName = () => `bench_${randomBytes(4).toString('hex')}`;

async function prefill(ordo: Ordo, topic: string, n: number): Promise<void> {
  for (let i = 0; i < n; i += CHUNK) {
    await ordo.outbox.append(
      topic,
      Array.from({ length: Math.min(CHUNK, n - i) }, (_, j) => ({
        type: 'placed',
        key: `k${(i + j) % 64}`,
        data: PAYLOAD,
      })),
    );
  }
}

/** Messages per second the relay makes the broker confirm, from a backlog of `n`. */
async function drainRate(
  ordo: Ordo,
  b: BrokerBench,
  n: number,
  window: number | undefined,
  ctx: BenchContext,
): Promise<number> {
  const topic = topicName();
  await prefill(ordo, topic, n);
  const dest = await b.destination();
  try {
    const started = performance.now();
    const relay = await ordo.outbox.relay({ name: topic, topic, to: dest.to, ...(window ? { window } : {}) });
    try {
      while ((await dest.stored()) < n) {
        if (ctx.signal.aborted) throw ctx.signal.reason;
        await sleep(20);
      }
      return n / ((performance.now() - started) / 1000);
    } finally {
      await relay.stop();
    }
  } finally {
    await dest.remove();
  }
}

/** Messages per second the relay's own publisher gets confirmed in a tight loop, same window. */
async function clientRate(b: BrokerBench, n: number): Promise<number> {
  const dest = await b.destination();
  const broker = BROKERS[b.broker];
  const [name] = Object.keys(dest.to) as RelayBroker[];
  const config = broker.check((dest.to as Record<string, Record<string, unknown>>)[name!]!);
  const template = parseTemplate(broker.template(config)).template!;
  const publisher = await broker.connect(config);
  try {
    const created = new Date();
    const messages = Array.from({ length: n }, (_, i) =>
      toRelayMessage(
        {
          position: i + 1,
          transactionId: '1',
          topic: 'bench',
          type: 'placed',
          key: `k${i % 64}`,
          messageId: null,
          data: PAYLOAD,
          headers: {},
          createdAt: created,
        },
        0,
        template,
      ),
    );
    const started = performance.now();
    const inFlight: Promise<void>[] = [];
    for (const m of messages) {
      if (inFlight.length >= broker.window) await inFlight.shift();
      inFlight.push(publisher.publish(m));
    }
    await Promise.all(inFlight);
    return n / ((performance.now() - started) / 1000);
  } finally {
    await publisher.close();
    await dest.remove();
  }
}

/** Commit-to-broker latency of messages appended one per transaction at RATE a second. */
async function latencyAtRate(
  ordo: Ordo,
  appender: Ordo,
  b: BrokerBench,
  ctx: BenchContext,
): Promise<{ count: number; p50: number; p99: number; max: number }> {
  const topic = topicName();
  const dest = await b.destination();
  // The commit's answer and the arrival race: whichever comes second records the latency.
  const committedAt = new Map<string, number>();
  const arrivedAt = new Map<string, number>();
  const histogram = createHistogram();
  let count = 0;
  const record = (committed: number, arrived: number) => {
    count++;
    histogram.record(Math.max(1, Math.round((arrived - committed) * 1e6)));
  };
  const stopListening = await dest.listen((at, id) => {
    const t = committedAt.get(id);
    if (t === undefined) arrivedAt.set(id, at);
    else record(t, at);
  });
  const relay = await ordo.outbox.relay({ name: topic, topic, to: dest.to });
  try {
    const total = RATE * RATE_SECONDS;
    const start = performance.now();
    const appends: Promise<void>[] = [];
    for (let i = 0; i < total; i++) {
      const due = start + (i * 1000) / RATE;
      const wait = due - performance.now();
      if (wait > 1) await sleep(wait);
      if (ctx.signal.aborted) throw ctx.signal.reason;
      const id = `${topic}-${i}`;
      appends.push(
        ordo.outbox
          .append(topic, { type: 'placed', key: `k${i % 64}`, messageId: id, data: PAYLOAD })
          .then(() => {
            const now = performance.now();
            const arrived = arrivedAt.get(id);
            if (arrived === undefined) committedAt.set(id, now);
            else record(now, arrived);
          }),
      );
    }
    await Promise.all(appends);
    const deadline = performance.now() + 10_000;
    while (count < total && performance.now() < deadline) await sleep(20);
    const ms = (ns: number) => ns / 1e6;
    return {
      count,
      p50: ms(histogram.percentile(50)),
      p99: ms(histogram.percentile(99)),
      max: ms(histogram.max),
    };
  } finally {
    await relay.stop();
    await stopListening();
    await dest.remove();
  }
}
