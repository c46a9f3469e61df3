// Relays under faults (issue 43) to NATS JetStream, Redis Streams, MQTT, RabbitMQ and webhooks,
// each test against a broker of its own (test/support/broker-servers.ts: a server process on a
// free port, for RabbitMQ a node of its own beside the machine's; for webhooks a receiver in this
// process that verifies every signature): a relay process killed with SIGKILL mid-run and started
// again, the broker stopped for 10 s while writers go on (the receiver closes its port), a relay
// stopped with stop() while it publishes. Every committed message arrives, no rolled-back one,
// each key's first arrivals in commit order; a broker that drops repeats by id (JetStream's
// Nats-Msg-Id) gets none at all, another only repeats of what was in flight at the kill, with the
// same id. Each broker is an entry of CASES.
import { type ChildProcess, spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { connect } from '@nats-io/transport-node';
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import { type Channel, connect as connectAmqp } from 'amqplib';
import { connectAsync, type MqttClient } from 'mqtt';
import { createClient } from 'redis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo, type RelayOptions, type RelayTarget } from '../src/index.js';
import {
  type BrokerKind,
  type BrokerServer,
  brokerServer,
  webhookReceiver,
} from './support/broker-servers.js';
import { type OwnPostgres, ownPostgres } from './support/own-postgres.js';
import { type Arrival, appendLoad, checkArrivals, type Committed, uniqueName } from './support/relay-load.js';
import { until } from './support/until.js';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
/** How long the broker stays away in the outage test. */
const OUTAGE_MS = 10_000;

/** Where one test's messages go on a broker, and how the test reads back what arrived. */
interface Destination {
  to: RelayTarget;
  /** Everything the broker stored, in the order it stored it. */
  arrivals(): Promise<Arrival[]>;
  /** How many messages arrived so far (a cheap look, while a relay runs). */
  count(): Promise<number>;
}

/** A broker of the fault tests: add one by an entry here. */
interface BrokerCase {
  kind: BrokerKind;
  /** The broker drops a message whose id it already stored: then nothing arrives twice, even after a crash. */
  dropsRepeats: boolean;
  /** A destination of one test's own, on the test's server. */
  destination(server: BrokerServer): Promise<Destination>;
}

const CASES: BrokerCase[] = [
  {
    kind: 'nats',
    dropsRepeats: true,
    async destination(server) {
      const subject = uniqueName('faults');
      const stream = subject.toUpperCase();
      const nc = await connect({ servers: server.url });
      try {
        // File storage (the default), in the server's store folder: it outlives the restart.
        await (await jetstreamManager(nc)).streams.add({ name: stream, subjects: [`${subject}.>`] });
      } finally {
        await nc.close();
      }
      return {
        // A PubAck that does not come within a second means the server is away.
        to: { nats: { servers: server.url, subject: `${subject}.{partition}`, timeout: 1000 } },
        arrivals: () => natsArrivals(server.url, stream),
        async count() {
          const nc = await connect({ servers: server.url });
          try {
            return (await (await jetstreamManager(nc)).streams.info(stream)).state.messages;
          } finally {
            await nc.close();
          }
        },
      };
    },
  },
  {
    kind: 'redis',
    // A stream takes a repeat as a new entry: its consumers deduplicate on the id field.
    dropsRepeats: false,
    async destination(server) {
      const stream = uniqueName('faults');
      return {
        // A reply that does not come within a second means the server is away.
        to: { redis: { url: server.url, stream, timeout: 1000 } },
        arrivals: () =>
          withRedis(server.url, async (client) =>
            ((await client.xRange(stream, '-', '+')) ?? []).map(({ message }) => ({
              id: message.id!,
              data: JSON.parse(message.data!) as Arrival['data'],
              headers: JSON.parse(message.headers!) as Record<string, string>,
            })),
          ),
        count: () => withRedis(server.url, (client) => client.xLen(stream)),
      };
    },
  },
  {
    kind: 'mqtt',
    // QoS 1 all the way: a repeat is delivered again; consumers deduplicate on message-id.
    dropsRepeats: false,
    async destination(server) {
      const prefix = uniqueName('faults');
      const got: Arrival[] = [];
      // A persistent session: what the broker takes while the subscriber reconnects waits for it,
      // across the broker's restart too.
      const client = await connectAsync(server.url, {
        protocolVersion: 5,
        clientId: uniqueName('sub'),
        clean: false,
        properties: { sessionExpiryInterval: 3600 },
        reconnectPeriod: 100,
      });
      subscribers.push(client);
      client.on('message', (_topic, payload, packet) => {
        const properties = (packet.properties?.userProperties ?? {}) as Record<string, string>;
        const headers: Record<string, string> = {};
        // The CloudEvents attributes are user properties without the ce- of other brokers.
        for (const [name, value] of Object.entries(properties)) {
          headers[CLOUDEVENTS.includes(name) ? `ce-${name}` : name] = value;
        }
        got.push({ id: properties['message-id']!, data: JSON.parse(payload.toString()), headers });
      });
      await client.subscribeAsync(`${prefix}/#`, { qos: 1 });
      return {
        to: { mqtt: { url: server.url, topic: `${prefix}/{partition}`, qos: 1, timeout: 1000 } },
        async arrivals() {
          // What the broker took reaches the subscriber a moment later: until nothing more comes.
          for (let seen = -1; seen !== got.length;) {
            seen = got.length;
            await sleep(300);
          }
          return [...got];
        },
        count: async () => got.length,
      };
    },
  },
  {
    kind: 'rabbitmq',
    // A queue takes a repeat as a new message: its consumers deduplicate on message_id.
    dropsRepeats: false,
    async destination(server) {
      const exchange = uniqueName('faults');
      const queue = `${exchange}.queue`;
      // Durable, as the relay's messages are persistent: all three outlive the node's restart.
      await withAmqp(server.url, async (ch) => {
        await ch.assertExchange(exchange, 'fanout', { durable: true });
        await ch.assertQueue(queue, { durable: true });
        await ch.bindQueue(queue, exchange, '');
      });
      /** What arrivals() took off the queue so far; the queue holds what came after. */
      const taken: Arrival[] = [];
      return {
        // A node that stops closes the relay's connection, and a stopped one refuses the next:
        // the timeout only bounds a node that hangs, long enough that a confirm slowed by a
        // busy machine's disk is not taken for one (it would publish again what the queue holds).
        to: { rabbitmq: { url: server.url, exchange, routingKey: '{partition}', timeout: 5000 } },
        arrivals: () =>
          withAmqp(server.url, async (ch) => {
            // Read once no relay publishes: what the queue holds now is all there will be.
            const { messageCount } = await ch.checkQueue(queue);
            if (messageCount > 0) await consume(ch, queue, messageCount, taken);
            return [...taken];
          }),
        count: () =>
          withAmqp(server.url, async (ch) => taken.length + (await ch.checkQueue(queue)).messageCount),
      };
    },
  },
  {
    kind: 'webhook',
    // A receiver takes a repeat as a new request: it deduplicates on webhook-id.
    dropsRepeats: false,
    async destination(server) {
      const receiver = webhookReceiver(server);
      const path = uniqueName('/faults');
      return {
        // A receiver that stops drops the relay's connections, and a stopped one refuses the
        // next: the timeout only bounds a receiver that hangs, long enough that an answer slowed
        // by a busy machine is not taken for one (it would send again what the receiver took).
        to: { webhook: { url: `${server.url}${path}/{partition}`, secret: receiver.secret, timeout: '5s' } },
        async arrivals() {
          // Every request verified with the secret: a refused one would count attempts.
          expect(receiver.unverified).toEqual([]);
          return receiver.received.map((d) => ({
            id: d.headers['webhook-id']!,
            data: JSON.parse(d.body) as Arrival['data'],
            headers: d.headers,
          }));
        },
        count: async () => receiver.received.length,
      };
    },
  },
];

/**
 * Takes `n` messages off a queue into `into`, pushed by the broker as fast as it can (a basic.get
 * for each would take a round trip each).
 */
async function consume(ch: Channel, queue: string, n: number, into: Arrival[]): Promise<void> {
  const goal = into.length + n;
  let taken = (): void => undefined;
  let failed = (_: Error): void => undefined;
  const all = new Promise<void>((resolve, reject) => {
    taken = resolve;
    failed = reject;
  });
  // Awaited once the consumer runs: a failure before then is not unhandled meanwhile.
  all.catch(() => undefined);
  const timer = setTimeout(
    () => failed(new Error(`took ${into.length} of ${goal} messages off ${queue} within 30 s`)),
    30_000,
  );
  try {
    const { consumerTag } = await ch.consume(
      queue,
      (m) => {
        if (m === null) return failed(new Error(`the broker cancelled the consumer of ${queue}`));
        into.push({
          id: m.properties.messageId as string,
          data: JSON.parse(m.content.toString('utf8')) as Arrival['data'],
          headers: m.properties.headers as Record<string, string>,
        });
        if (into.length >= goal) taken();
      },
      { noAck: true },
    );
    await all;
    await ch.cancel(consumerTag);
  } finally {
    clearTimeout(timer);
  }
}

/** A channel on a connection of its own, closed after `use`: a node's restart breaks no test client. */
async function withAmqp<T>(url: string, use: (ch: Channel) => Promise<T>): Promise<T> {
  const connection = await connectAmqp(url);
  connection.on('error', () => undefined);
  try {
    return await use(await connection.createChannel());
  } finally {
    await connection.close().catch(() => undefined);
  }
}

const CLOUDEVENTS = ['specversion', 'id', 'type', 'source', 'subject', 'time'];
/** The MQTT subscribers of the file's tests, closed after it. */
const subscribers: MqttClient[] = [];

const redisClient = (url: string) => createClient({ url });

async function withRedis<T>(
  url: string,
  use: (client: ReturnType<typeof redisClient>) => Promise<T>,
): Promise<T> {
  const client = redisClient(url);
  client.on('error', () => undefined);
  await client.connect();
  try {
    return await use(client);
  } finally {
    client.destroy();
  }
}

async function natsArrivals(url: string, stream: string): Promise<Arrival[]> {
  const nc = await connect({ servers: url });
  try {
    const { state } = await (await jetstreamManager(nc)).streams.info(stream);
    const consumer = await jetstream(nc).consumers.get(stream);
    const out: Arrival[] = [];
    while (out.length < state.messages) {
      const before = out.length;
      const batch = await consumer.fetch({ max_messages: state.messages - out.length, expires: 5000 });
      for await (const m of batch) {
        const headers: Record<string, string> = {};
        for (const [k] of m.headers!) headers[k] = m.headers!.get(k);
        out.push({ id: m.headers!.get('Nats-Msg-Id'), data: m.json(), headers });
      }
      if (out.length === before)
        throw new Error(`read ${out.length} of ${state.messages} messages of ${stream}`);
    }
    return out;
  } finally {
    await nc.close();
  }
}

/** Writers appending until stopped, so that the load spans what the test does meanwhile. */
interface Load {
  /** Ends after the round under way; resolves with every committed message. */
  stop(): Promise<Committed[]>;
  /** An arrival labelled and numbered as stop() labels and numbers what committed. */
  relabel(a: Arrival): Arrival;
  /** From the next round on, rounds `ms` apart. */
  pace(ms: number): void;
}

/**
 * appendLoad() in rounds (8 writers, 50 keys, a fifth of the transactions rolled back), `pauseMs`
 * apart, until stopped. A round starts once the one before committed, so each key's commit order
 * runs on across rounds: each message's type names its round (it arrives as ce-type), its label
 * gets the round, and each key's seq counts on from the rounds before.
 */
function keepAppending(ordo: Ordo, topic: string, pauseMs: number): Load {
  let stopping = false;
  const committed: Committed[] = [];
  // Zero for keys no round wrote yet.
  const counts = new Map(Array.from({ length: 50 }, (_, k) => [`key-${k}`, 0]));
  /** Per round, the messages each key committed in the rounds before it. */
  const before = new Map<string, Map<string, number>>();
  const running = (async () => {
    for (let r = 1; !stopping; r++) {
      const round = `round-${r}`;
      before.set(round, new Map(counts));
      for (const m of await appendLoad(ordo, topic, { perWriter: 5, type: () => round })) {
        committed.push({
          key: m.key,
          seq: before.get(round)!.get(m.key)! + m.seq,
          label: `${m.label}@${round}`,
        });
        counts.set(m.key, (counts.get(m.key) ?? 0) + 1);
      }
      await sleep(pauseMs);
    }
  })();
  return {
    pace(ms) {
      pauseMs = ms;
    },
    async stop() {
      stopping = true;
      await running;
      return committed;
    },
    relabel(a) {
      const round = a.headers['ce-type'] ?? '';
      const seq = a.data.seq > 0 ? (before.get(round)?.get(a.data.key) ?? 0) + a.data.seq : a.data.seq;
      return { ...a, data: { ...a.data, seq, label: `${a.data.label}@${round}` } };
    },
  };
}

/** A relay in a process of its own (test/support/relay-process.ts), started ahead of its relay. */
interface RelayProcess {
  child: ChildProcess;
  /** Starts the relay once the process is loaded; resolves once the relay runs. */
  start(): Promise<void>;
  /** Resolves once the process reported at least `n` messages confirmed by the broker. */
  delivered(n: number, ms?: number): Promise<void>;
  /** The exit code (null when killed by a signal). */
  exited: Promise<number | null>;
  output(): string;
}

let server: OwnPostgres;
/** The writers' ordo. */
let ordo: Ordo;
/**
 * The relays' ordo, as the relays guide advises: a batch holds its connection while it
 * publishes, and on the writers' pool the relays would wait behind every queued append.
 */
let relays: Ordo;
const children = new Set<ChildProcess>();
const brokers: BrokerServer[] = [];

/** What each test does to its broker, and the name its server is kept under. */
type TestName = 'killed' | 'outage' | 'stopped';
/**
 * Every test's broker server, all started at once before the tests: a RabbitMQ node takes
 * seconds of both cores to start, better spent before the tests than within their timeouts.
 */
const servers = new Map<string, Promise<BrokerServer>>();

/** The broker server of one test's own, removed after the file. */
const serverOf = (kind: BrokerKind, test: TestName): Promise<BrokerServer> => servers.get(`${kind} ${test}`)!;

beforeAll(async () => {
  for (const c of CASES) {
    for (const test of ['killed', 'outage', 'stopped'] as const) {
      const starting = brokerServer(c.kind);
      void starting.then((b) => brokers.push(b)).catch(() => undefined);
      servers.set(`${c.kind} ${test}`, starting);
    }
  }
  // Writers, relays and relay processes of all the tests at once: more than the 100 connections
  // PostgreSQL takes by default.
  const [postgres, ...started] = await Promise.allSettled([
    ownPostgres({ max_connections: '300' }),
    ...servers.values(),
  ]);
  if (postgres.status === 'fulfilled') server = postgres.value;
  for (const s of [postgres, ...started]) if (s.status === 'rejected') throw s.reason;
  // The tests run at once (five at a time), each with its writers and relays.
  ordo = await createOrdo({ databaseUrl: server.url, poolSize: 40 });
  relays = await createOrdo({ databaseUrl: server.url, poolSize: 40 });
});
afterAll(async () => {
  for (const c of children) c.kill('SIGKILL');
  await Promise.all(subscribers.map((s) => s.endAsync(true)));
  await Promise.all(brokers.map((b) => b.remove()));
  await relays?.close();
  await ordo?.close();
  await server?.stop();
});

function relayProcess(options: RelayOptions): RelayProcess {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', 'test/support/relay-process.ts', server.url, JSON.stringify(options), 'wait'],
    { cwd: ROOT, stdio: ['pipe', 'pipe', 'pipe'] },
  );
  children.add(child);
  let output = '';
  let delivered = 0;
  child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const exited = new Promise<number | null>((resolve) =>
    child.once('close', (code) => {
      children.delete(child);
      resolve(code);
    }),
  );
  const heard = new Set<string>();
  createInterface({ input: child.stdout! }).on('line', (line) => {
    output += `${line}\n`;
    if (line.startsWith('delivered ')) delivered = Number(line.slice('delivered '.length));
    else heard.add(line);
  });
  const waitFor = async (what: string, done: () => boolean, ms: number) => {
    try {
      await until(
        what,
        () => {
          if (done()) return true;
          if (child.exitCode !== null || child.signalCode !== null) throw new Error('the process exited');
          return false;
        },
        ms,
      );
    } catch (e) {
      throw new Error(
        `the relay process: ${what}: ${(e as Error).message}; it said:\n${output.slice(-3000)}`,
        { cause: e },
      );
    }
  };
  return {
    child,
    async start() {
      await waitFor('loaded', () => heard.has('loaded'), 30_000);
      child.stdin!.write('go\n');
      await waitFor('ready', () => heard.has('ready'), 10_000);
    },
    exited,
    output: () => output,
    delivered: (n, ms = 15_000) => waitFor(`delivered ${n}`, () => delivered >= n, ms),
  };
}

/**
 * SIGKILL while the broker holds messages the relay has not acknowledged (published, confirmed
 * or not, their batch not yet acknowledged): the moment a crash leaves something to send again.
 * The process is frozen (SIGSTOP) while the broker and the database are compared, long enough
 * for what it sent to land; when nothing is in flight it runs on a little and is looked at again.
 * Resolves with what the broker held once the killed process's last sends landed, and what the
 * subscription had acknowledged at the kill.
 */
async function killMidBatch(
  relay: RelayProcess,
  name: string,
  destination: Destination,
): Promise<{ stored: number; delivered: number }> {
  for (let look = 1; ; look++) {
    relay.child.kill('SIGSTOP');
    // Less than the lease's renewal margin: the frozen process keeps its partitions.
    await sleep(100);
    const delivered = (await ordo.outbox.lag(name)).delivered;
    const stored = await destination.count();
    if (stored > delivered || look === 100) {
      relay.child.kill('SIGKILL');
      expect(await relay.exited).toBe(null);
      // What it had sent may still be landing (a busy broker reads its socket late): counted
      // again until the count holds still, since every one of those is sent again too.
      let settled = stored;
      for (let before = -1; settled !== before;) {
        before = settled;
        await sleep(100);
        settled = await destination.count();
      }
      return { stored: settled, delivered };
    }
    relay.child.kill('SIGCONT');
    await sleep(Math.random() * 20);
  }
}

// Every test has a broker server of its own, and they all run at once: the outage tests spend
// most of their time waiting.
describe.concurrent.each(CASES)('a relay to $kind under faults', (c) => {
  it('a relay process killed with SIGKILL mid-run and started again: every committed message, in commit order per key', async () => {
    const broker = await serverOf(c.kind, 'killed');
    const destination = await c.destination(broker);
    const topic = uniqueName('t');
    const options: RelayOptions = {
      name: uniqueName('killed'),
      topic,
      partitions: 4,
      batchSize: 100,
      // The killed process's partitions pass on once their leases lapse.
      lease: '1s',
      retryDelay: '50ms',
      maxRetryDelay: '500ms',
      to: destination.to,
    };
    // Both processes are started now (a process takes seconds to load), their relays later.
    const [first, second] = [relayProcess(options), relayProcess(options)];
    // A backlog first, so that the relay is busy publishing when it is killed.
    await ordo.outbox.createSubscription({ name: options.name, topic, partitions: 4 });
    const load = keepAppending(ordo, topic, 0);
    let committed: Committed[];
    let atKill: { stored: number; delivered: number };
    try {
      await until(
        'a backlog',
        async () => (await ordo.outbox.lag(options.name)).messagesBehind >= 600,
        30_000,
      );
      // The writers go on, at a pace that leaves the machine's two cores to the relays.
      load.pace(100);
      await first.start();
      await first.delivered(200);
      atKill = await killMidBatch(first, options.name, destination);
      await second.start();
      await second.delivered(200);
      committed = await load.stop();
      await until(
        'the second relay process delivered everything',
        async () => (await ordo.outbox.lag(options.name)).messagesBehind === 0,
        30_000,
      );
      // SIGTERM: the relay finishes what is in flight, gives its partitions up and exits 0.
      second.child.kill('SIGTERM');
      expect(await second.exited, second.output()).toBe(0);
    } finally {
      await load.stop();
    }

    const lag = await ordo.outbox.lag(options.name);
    // Given up at SIGTERM, not left to lapse.
    expect(
      lag.partitions.map((p) => p.owner),
      `the first process was ${first.child.pid}, the second ${second.child.pid}; leases: ${JSON.stringify(lag.partitions)}`,
    ).toEqual([null, null, null, null]);
    expect(lag).toMatchObject({ messagesBehind: 0, attempts: 0, deadLettered: 0 });
    // The kill landed while the broker held messages the relay had not acknowledged.
    expect(atKill.stored).toBeGreaterThan(atKill.delivered);
    const repeats = checkArrivals((await destination.arrivals()).map(load.relabel), committed);
    // Repeats only of those: the messages in flight at the kill.
    expect(repeats).toBeLessThanOrEqual(c.dropsRepeats ? 0 : atKill.stored - atKill.delivered);
  });

  it('the broker stopped for 10 s mid-run and started again: lag grows, the relay resumes by itself, nothing lost, nothing parked', async () => {
    const broker = await serverOf(c.kind, 'outage');
    const destination = await c.destination(broker);
    const topic = uniqueName('t');
    const name = uniqueName('outage');
    const relay = await relays.outbox.relay({
      name,
      topic,
      partitions: 4,
      batchSize: 100,
      // A low ceiling of the back-off, so that the relay is back soon after the broker.
      retryDelay: '100ms',
      maxRetryDelay: '1s',
      // An outage that counted attempts would park messages within its first second.
      maxAttempts: 2,
      to: destination.to,
    });
    const load = keepAppending(ordo, topic, 50);
    let committed: Committed[];
    try {
      await until('the relay delivered', () => relay.state().delivered >= 200, 30_000).catch(
        async (e: Error) => {
          const lag = await relay.lag();
          throw new Error(`${e.message}: ${JSON.stringify({ state: relay.state(), lag })}`, { cause: e });
        },
      );
      // SIGTERM, as an operator stops a broker: what a broker confirmed and had not yet written
      // out when it crashed would be the broker's loss, which no relay can make up for.
      await broker.stop();
      const stoppedAt = performance.now();

      await until('the relay failing', () => relay.state().state === 'failing', OUTAGE_MS / 2);
      expect(relay.state().lastError).not.toBeNull();
      await until('messages waiting', async () => (await relay.lag()).messagesBehind > 0, OUTAGE_MS / 2);
      await until(
        'the relays table showing the failure',
        async () => {
          const status = (await ordo.outbox.relays()).find((r) => r.name === name);
          return status?.state === 'failing' && status.lastRelayError !== null;
        },
        OUTAGE_MS / 2,
      );
      await sleep(OUTAGE_MS - (performance.now() - stoppedAt));
      // All along the outage: retried without counting, so nothing is parked, however long it lasts.
      const down = await relay.lag();
      expect(relay.state().state).toBe('failing');
      expect(down.messagesBehind).toBeGreaterThan(0);
      expect(
        down.partitions.filter((p) => p.attempts > 0).map((p) => p.lastError),
        'failures counted as attempts',
      ).toEqual([]);
      expect(down.deadLettered).toBe(0);
      const deliveredBefore = relay.state().delivered;

      await broker.start();
      await until(
        'the relay delivering again by itself',
        () => relay.state().state === 'running' && relay.state().delivered > deliveredBefore,
        10_000,
      );
      await sleep(500);
      committed = await load.stop();
      await until('the relay caught up', async () => (await relay.lag()).messagesBehind === 0, 20_000);
      await until(
        'the relays table showing it running again',
        async () => (await ordo.outbox.relays()).find((r) => r.name === name)?.state === 'running',
      );
    } finally {
      await load.stop();
      await relay.stop();
    }

    expect((await ordo.outbox.deadLetters(name)).map((d) => d.error)).toEqual([]);
    const status = (await ordo.outbox.relays()).find((r) => r.name === name)!;
    expect(status).toMatchObject({ messagesBehind: 0, attempts: 0, deadLettered: 0 });
    // Its last failure is still shown, older than its last checkpoint.
    expect(status.lastRelayError).not.toBeNull();
    const repeats = checkArrivals((await destination.arrivals()).map(load.relabel), committed);
    if (c.dropsRepeats) expect(repeats).toBe(0);
  });

  it('a relay stopped with stop() finishes the publishes in flight: nothing leased, nothing published past its checkpoint', async () => {
    const broker = await serverOf(c.kind, 'stopped');
    const destination = await c.destination(broker);
    const topic = uniqueName('t');
    const committed = await appendLoad(ordo, topic, { perWriter: 100 });
    const options: RelayOptions = {
      name: uniqueName('stopped'),
      topic,
      partitions: 4,
      batchSize: 50,
      // One publish at a time: a batch takes long enough to be caught in the middle.
      window: 1,
      to: destination.to,
    };
    const relay = await relays.outbox.relay(options);
    // Until the broker holds messages of a batch the relay has not finished (delivered counts a
    // batch once all of it is confirmed, and is read after the broker): stop() lands then.
    let deliveredAtStop = 0;
    await until(
      'a batch in flight',
      async () => {
        const stored = await destination.count();
        deliveredAtStop = relay.state().delivered;
        return stored > deliveredAtStop;
      },
      10_000,
    );
    const end = await relay.stop();
    expect(end.reason).toBe('stopped');

    const lag = await relay.lag();
    expect(
      lag.partitions.map((p) => p.owner),
      JSON.stringify(lag.partitions),
    ).toEqual([null, null, null, null]);
    // Stopped mid-run, and the batch under way at stop() was finished, not given up.
    expect(lag.delivered).toBeLessThan(committed.length);
    expect(lag.delivered).toBeGreaterThan(deliveredAtStop);
    expect(relay.state()).toMatchObject({ state: 'stopped', delivered: lag.delivered });
    // Whatever reached the broker is behind the checkpoint: nothing half-published is left to send again.
    expect(await destination.arrivals()).toHaveLength(lag.delivered);

    // Started again (with the broker's own window: the rest need not go one at a time), the relay
    // delivers the rest once.
    const { window: _window, ...rest } = options;
    const again = await relays.outbox.relay(rest);
    try {
      await until('the relay caught up', async () => (await again.lag()).messagesBehind === 0, 20_000);
    } finally {
      await again.stop();
    }
    expect(checkArrivals(await destination.arrivals(), committed)).toBe(0);
  });
});
