// Relays outside the library: `ordo relay FILE` until SIGTERM, `ordo serve --relays FILE` (and
// ORDO_RELAYS), GET /v1/relays and `ordo status` — which see a relay wherever it runs, since the
// database records it. NATS JetStream is the broker (the machine's nats-server -js).
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type JetStreamManager, jetstreamManager } from '@nats-io/jetstream';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo, type RelayStatus } from '../src/index.js';
import { buildServer } from '../src/server/app.js';
import { type OwnPostgres, ownPostgres } from './support/own-postgres.js';
import { uniqueName } from './support/relay-load.js';
import { killAll, runCli, startCli, startServer } from './support/server-process.js';
import { until } from './support/until.js';

const NATS = 'nats://127.0.0.1:4222';
let server: OwnPostgres;
let ordo: Ordo;
let nc: NatsConnection;
let jsm: JetStreamManager;
let dir: string;
const streams: string[] = [];

beforeAll(async () => {
  server = await ownPostgres();
  ordo = await createOrdo({ databaseUrl: server.url });
  nc = await connect({ servers: NATS });
  jsm = await jetstreamManager(nc);
  dir = await mkdtemp(join(tmpdir(), 'ordo-relays-'));
});
afterAll(async () => {
  await killAll();
  await ordo?.close();
  for (const s of streams) await jsm.streams.delete(s).catch(() => undefined);
  await nc?.close();
  await server?.stop();
  await rm(dir, { recursive: true, force: true });
});

/** A stream of its own, a relays file naming one relay to it, and the topic it reads. */
async function relayFile(extra: Record<string, unknown> = {}) {
  const subject = uniqueName('surf');
  const stream = subject.toUpperCase();
  await jsm.streams.add({ name: stream, subjects: [`${subject}.>`] });
  streams.push(stream);
  const relay = {
    name: uniqueName('relay'),
    topic: uniqueName('t'),
    to: { nats: { servers: NATS, subject: `${subject}.{type}` } },
    ...extra,
  };
  const file = join(dir, `${relay.name}.json`);
  await writeFile(file, JSON.stringify([relay]));
  return { relay, stream, file };
}

const stored = async (stream: string) => (await jsm.streams.info(stream)).state.messages;
const relayNamed = async (name: string): Promise<RelayStatus | undefined> =>
  (await ordo.outbox.relays()).find((r) => r.name === name);

describe('ordo relay FILE', () => {
  it('runs the relays of the file until SIGTERM, shown by ordo status and GET /v1/relays meanwhile, then stops them', async () => {
    const { relay, stream, file } = await relayFile({ partitions: 2 });
    const started = startCli(['relay', file, '--database-url', server.url]);
    await until('the relay started', async () => (await relayNamed(relay.name))?.state === 'running', 20_000);
    await ordo.outbox.append(relay.topic, [
      { type: 'a', key: 'k1', data: { n: 1 } },
      { type: 'b', key: 'k2', data: { n: 2 } },
    ]);
    await until('both published', async () => (await stored(stream)) === 2, 20_000);

    const status = await runCli(['status', '--json', '--database-url', server.url]);
    expect(status.code).toBe(0);
    const shown = (JSON.parse(status.out) as { relays: RelayStatus[] }).relays;
    expect(shown).toEqual([
      expect.objectContaining({
        name: relay.name,
        topic: relay.topic,
        broker: 'nats',
        target: expect.stringContaining(NATS),
        state: 'running',
        messagesBehind: 0,
        delivered: 2,
      }),
    ]);
    const text = await runCli(['status', '--database-url', server.url]);
    expect(text.out).toMatch(/relays/);
    expect(text.out).toContain(relay.name);

    const app = await buildServer(ordo);
    try {
      const res = await app.inject({ method: 'GET', url: '/v1/relays' });
      expect(res.statusCode).toBe(200);
      expect(res.json()).toEqual([
        expect.objectContaining({ name: relay.name, broker: 'nats', state: 'running' }),
      ]);
      const metrics = (await app.inject({ method: 'GET', url: '/metrics' })).body;
      expect(metrics).toContain(`ordo_relay_state{relay="${relay.name}",broker="nats",state="running"} 1`);
      expect(metrics).toContain(`ordo_relay_state{relay="${relay.name}",broker="nats",state="failing"} 0`);
      expect(metrics).toMatch(
        new RegExp(`ordo_outbox_delivered_total\\{subscription="${relay.name}",partition="\\d"\\} [12]`),
      );
    } finally {
      await app.close();
    }

    started.child.kill('SIGTERM');
    expect(await started.exited).toMatchObject({ code: 0 });
    expect(started.output()).toContain(`relay ${relay.name}`);
    expect((await relayNamed(relay.name))?.state).toBe('stopped');
  });

  it('refuses a file it cannot use before it starts anything, and a relay it cannot start with its code', async () => {
    const missing = await runCli(['relay', join(dir, 'nope.json'), '--database-url', server.url]);
    expect(missing.code).toBe(2);
    expect(missing.err).toMatch(/cannot read the relays file .*nope\.json/);
    const notJson = join(dir, 'not.json');
    await writeFile(notJson, '{');
    expect((await runCli(['relay', notJson, '--database-url', server.url])).err).toMatch(/is not JSON/);
    const notArray = join(dir, 'object.json');
    await writeFile(notArray, '{"name": "x"}');
    expect((await runCli(['relay', notArray, '--database-url', server.url])).err).toMatch(
      /must hold a JSON array/,
    );
    const bad = join(dir, 'bad.json');
    await writeFile(
      bad,
      JSON.stringify([{ name: 'bad_one', topic: 't', to: { nats: { servers: NATS, subject: 'x.{nope}' } } }]),
    );
    const refused = await runCli(['relay', bad, '--database-url', server.url]);
    expect(refused.code).toBe(1);
    expect(refused.err).toMatch(/invalid_argument: relay 0 \(bad_one\): .*\{nope\} is not a field/);
  });
});

describe('ordo serve --relays FILE', () => {
  it('runs the relays beside the API, shows them at /v1/relays, and stops them on SIGTERM', async () => {
    const { relay, stream, file } = await relayFile();
    const serve = await startServer({ databaseUrl: server.url, args: ['--relays', file] });
    await ordo.outbox.append(relay.topic, { type: 'a', data: { n: 1 } });
    await until('published', async () => (await stored(stream)) === 1, 20_000);
    // The broker confirmed it; the checkpoint follows in the relay's next statement.
    await until('acknowledged', async () => (await relayNamed(relay.name))?.delivered === 1);
    const res = await fetch(`${serve.url}/v1/relays`);
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual(
      expect.arrayContaining([expect.objectContaining({ name: relay.name, state: 'running', delivered: 1 })]),
    );
    expect(await serve.stop()).toBe(0);
    expect((await relayNamed(relay.name))?.state).toBe('stopped');
  });

  it('reads ORDO_RELAYS when no --relays is given', async () => {
    const { relay, stream, file } = await relayFile();
    const serve = await startServer({ databaseUrl: server.url, env: { ORDO_RELAYS: file } });
    await ordo.outbox.append(relay.topic, { type: 'a', data: { n: 1 } });
    await until('published', async () => (await stored(stream)) === 1, 20_000);
    const code = await serve.stop();
    expect(code, serve.output()).toBe(0);
  });
});
