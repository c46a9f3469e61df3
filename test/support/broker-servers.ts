// A broker of a test's own, on a free port of 127.0.0.1 with its files in a temporary folder,
// for tests that stop a broker and start it again: never the machine's own brokers, which other
// test files use at the same time. A restart keeps the port and the folder, so clients reconnect
// to the same URL and find what the broker had stored (a JetStream stream, a Redis stream, an
// MQTT session, a RabbitMQ durable queue). The webhook "broker" is a receiver in the test's own
// process: stopped, it closes its listening socket and its connections.
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { rmSync } from 'node:fs';
import { chown, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Webhook } from 'standardwebhooks';
import { freePort } from '../../src/db/embedded.js';

export type BrokerKind = 'nats' | 'redis' | 'mqtt' | 'rabbitmq' | 'webhook';

export interface BrokerServer {
  kind: BrokerKind;
  port: number;
  /**
   * The URL a relay and a test client use: nats://, redis://, mqtt://, amqp://guest:guest@ or
   * http://127.0.0.1:<port>.
   */
  url: string;
  /** Whether the broker runs now. */
  readonly running: boolean;
  /**
   * Stops the broker and resolves once its process is gone. SIGTERM (the default) lets it shut
   * down as an operator's stop does, writing out what it confirmed; SIGKILL is a crash.
   */
  stop(signal?: 'SIGTERM' | 'SIGKILL'): Promise<void>;
  /** Starts it again on the same port and folder; resolves once it accepts clients. */
  start(): Promise<void>;
  /** What the broker has written to its output so far, for failure messages. */
  log(): string;
  /** Stops the broker if it runs (SIGKILL) and removes its folder. Safe to call twice. */
  remove(): Promise<void>;
}

/** One request the webhook receiver verified and answered 204, as it came. */
export interface WebhookDelivery {
  path: string;
  body: string;
  /** Its headers, names in lower case. */
  headers: Record<string, string>;
}

/** The webhook receiver: what it took, in the order it took it. */
export interface WebhookReceiver extends BrokerServer {
  kind: 'webhook';
  /** The whsec_ secret that every request must be signed with. */
  secret: string;
  /** The requests it verified, each recorded before it was answered 204. */
  received: WebhookDelivery[];
  /** The requests it refused (401) because they did not verify: none, ever. */
  unverified: string[];
}

/** The webhook receiver that a 'webhook' brokerServer() is. */
export function webhookReceiver(server: BrokerServer): WebhookReceiver {
  if (server.kind !== 'webhook') throw new Error(`a ${server.kind} broker is no webhook receiver`);
  return server as WebhookReceiver;
}

/** How each broker is run: its command, and the line it prints once it accepts clients. */
interface Recipe {
  url(port: number): string;
  /**
   * The command line and what it adds to the environment, at every start (with the same port
   * and folder); may write files into `dir` first.
   */
  command(port: number, dir: string): Promise<{ argv: string[]; env?: Record<string, string> }>;
  ready: RegExp;
  /** How long a start may take (default START_TIMEOUT_MS). */
  startMs?: number;
  /** How long a SIGTERM may take before the broker is killed (default STOP_TIMEOUT_MS). */
  stopMs?: number;
}

/** The RabbitMQ server script itself: /usr/sbin/rabbitmq-server would run it through su as the rabbitmq user. */
const RABBITMQ_SERVER = process.env.ORDO_TEST_RABBITMQ_SERVER ?? '/usr/lib/rabbitmq/bin/rabbitmq-server';

const RECIPES: Record<Exclude<BrokerKind, 'webhook'>, Recipe> = {
  // The JetStream store in `dir`: a stream and its duplicate window outlive a restart.
  nats: {
    url: (port) => `nats://127.0.0.1:${port}`,
    command: async (port, dir) => ({
      argv: ['nats-server', '-js', '-a', '127.0.0.1', '-p', String(port), '-sd', dir],
    }),
    ready: /Server is ready/,
  },
  // The append-only file in `dir`, no snapshots: every confirmed XADD outlives a stop.
  redis: {
    url: (port) => `redis://127.0.0.1:${port}`,
    command: async (port, dir) => ({
      argv: [
        'redis-server',
        '--port',
        String(port),
        '--bind',
        '127.0.0.1',
        '--dir',
        dir,
        '--save',
        '',
        '--appendonly',
        'yes',
      ],
    }),
    ready: /Ready to accept connections/,
  },
  // Persistence in `dir`: a subscriber's session and the messages queued for it outlive a
  // stop. Started as root, mosquitto runs as its own user, which must own the folder.
  mqtt: {
    url: (port) => `mqtt://127.0.0.1:${port}`,
    async command(port, dir) {
      const file = join(dir, 'mosquitto.conf');
      await writeFile(
        file,
        [
          `listener ${port} 127.0.0.1`,
          'allow_anonymous true',
          'persistence true',
          `persistence_location ${dir}/`,
          // A subscriber away while a relay catches up misses nothing.
          'max_queued_messages 100000',
          'log_dest stderr',
          '',
        ].join('\n'),
      );
      const owner = userInfo().uid === 0 ? systemUser('mosquitto') : undefined;
      if (owner) {
        await chown(dir, owner.uid, owner.gid);
        await chown(file, owner.uid, owner.gid);
      }
      return { argv: ['mosquitto', '-c', file] };
    },
    ready: /mosquitto version \S+ running/,
  },
  // A node of its own beside the machine's: its own name (registered with the epmd that every
  // Erlang node on the machine shares; the first node starts it), distribution port, database
  // (durable exchanges, queues and persistent messages outlive a stop), cookie (HOME) and
  // configuration, none of /etc/rabbitmq. No plugins: the management plugin would take the
  // machine's port 15672. The log goes to stdout, whose last line of a start comes once the
  // listener runs. SIGTERM reaches the script, which passes it to the node: a clean stop, as
  // rabbitmqctl stop's. A node takes seconds to start and stop.
  rabbitmq: {
    url: (port) => `amqp://guest:guest@127.0.0.1:${port}`,
    async command(port, dir) {
      // Chosen at the first start, kept for the restarts: a node finds its database by its name.
      const nodeFile = join(dir, 'node.json');
      const node = await readFile(nodeFile, 'utf8').then(
        (text) => JSON.parse(text) as { name: string; distPort: number },
        async () => {
          const chosen = {
            name: `ordo-${randomBytes(4).toString('hex')}@localhost`,
            distPort: await freePort(),
          };
          await writeFile(nodeFile, JSON.stringify(chosen));
          return chosen;
        },
      );
      // The classic format, Erlang terms: the node need not translate it with every plugin's schema.
      await writeFile(
        join(dir, 'rabbitmq.config'),
        `[{rabbit, [{tcp_listeners, [{"127.0.0.1", ${port}}]}]}].\n`,
      );
      await writeFile(join(dir, 'enabled_plugins'), '[].\n');
      await writeFile(join(dir, 'rabbitmq-env.conf'), '');
      return {
        argv: [RABBITMQ_SERVER],
        env: {
          HOME: dir,
          RABBITMQ_NODENAME: node.name,
          RABBITMQ_DIST_PORT: String(node.distPort),
          RABBITMQ_CONF_ENV_FILE: join(dir, 'rabbitmq-env.conf'),
          RABBITMQ_CONFIG_FILE: join(dir, 'rabbitmq.config'),
          RABBITMQ_ADVANCED_CONFIG_FILE: join(dir, 'advanced.config'),
          RABBITMQ_ENABLED_PLUGINS_FILE: join(dir, 'enabled_plugins'),
          RABBITMQ_MNESIA_BASE: join(dir, 'mnesia'),
          RABBITMQ_LOG_BASE: join(dir, 'log'),
          RABBITMQ_LOGS: '-',
          // Distribution on the loopback only. One scheduler of each kind, which sleeps when idle
          // rather than spins: a machine of two cores runs several nodes and the tests beside them.
          RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS:
            '-kernel inet_dist_use_interface {127,0,0,1} +S 1:1 +SDcpu 1:1 +SDio 1 +sbwt none +sbwtdcpu none +sbwtdio none',
        },
      };
    },
    ready: /Server startup complete/,
    startMs: 60_000,
    stopMs: 30_000,
  },
};

const START_TIMEOUT_MS = 15_000;
const STOP_TIMEOUT_MS = 10_000;

/** Brokers started here and not yet removed: killed if the test process exits first. */
const live = new Map<string, () => void>();
process.once('exit', () => {
  for (const kill of live.values()) kill();
});

/** Starts a broker of the test's own; resolves once it accepts clients. */
export async function brokerServer(kind: 'webhook'): Promise<WebhookReceiver>;
export async function brokerServer(kind: BrokerKind): Promise<BrokerServer>;
export async function brokerServer(kind: BrokerKind): Promise<BrokerServer> {
  if (kind === 'webhook') return webhookServer();
  const recipe = RECIPES[kind];
  const startMs = recipe.startMs ?? START_TIMEOUT_MS;
  const stopMs = recipe.stopMs ?? STOP_TIMEOUT_MS;
  const dir = await mkdtemp(join(tmpdir(), `ordo-${kind}-`));
  let child: ChildProcess | undefined;
  let exited: Promise<void> = Promise.resolve();
  /** Whether the process last started is gone with every process that held its output. */
  let closed = true;
  let output = '';
  let port = 0;

  const launch = async (): Promise<string | undefined> => {
    const { argv, env } = await recipe.command(port, dir);
    const [command, ...args] = argv;
    // A process group of its own: a broker run by a script (RabbitMQ's) is killed with the
    // processes the script started, not only the script.
    const started = spawn(command!, args, {
      cwd: dir,
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true,
    });
    child = started;
    closed = false;
    let seen = '';
    const ready = new Promise<undefined>((resolve) => {
      const hear = (chunk: Buffer) => {
        const text = chunk.toString();
        output += text;
        seen += text;
        if (recipe.ready.test(seen)) resolve(undefined);
      };
      started.stdout!.on('data', hear);
      started.stderr!.on('data', hear);
    });
    started.once('error', (e) => (output += `\n${e.message}`));
    // Once every process that holds its output is gone: the script's node too.
    exited = new Promise<void>((resolve) =>
      started.once('close', () => {
        closed = true;
        resolve();
      }),
    );
    const failed = exited.then(
      () => `${command} exited with ${started.signalCode ?? `status ${started.exitCode}`}`,
    );
    const timeout = sleep(startMs, `${command} did not start within ${startMs} ms`, { ref: false });
    return Promise.race([ready, failed, timeout]);
  };

  /** Kills the process last started and its group, unless they are gone (their ids may be reused). */
  const kill = () => {
    if (closed || child?.pid === undefined) return;
    try {
      process.kill(-child.pid, 'SIGKILL');
    } catch {
      // The group is gone already.
    }
  };
  live.set(dir, () => {
    kill();
    rmSync(dir, { recursive: true, force: true });
  });

  const server: BrokerServer = {
    kind,
    get port() {
      return port;
    },
    get url() {
      return recipe.url(port);
    },
    get running() {
      return child !== undefined && child.exitCode === null && child.signalCode === null;
    },
    async stop(signal = 'SIGTERM') {
      if (!server.running) return;
      // SIGTERM to the broker (or its script) alone, which stops what it started; SIGKILL to all.
      if (signal === 'SIGKILL') kill();
      else child!.kill(signal);
      // Killed if it does not stop in time; the timer ends with the stop, or it would kill the
      // broker started after it.
      const timer = setTimeout(kill, stopMs);
      await exited;
      clearTimeout(timer);
    },
    async start() {
      if (server.running) return;
      const failure = await launch();
      if (failure !== undefined) {
        kill();
        await exited;
        throw new Error(`${kind} did not start again on port ${port}: ${failure}\n${output.trim()}`);
      }
    },
    log: () => output,
    async remove() {
      kill();
      await exited;
      live.delete(dir);
      await rm(dir, { recursive: true, force: true });
    },
  };

  // A port can be taken between finding it free and the broker binding it: try a few.
  for (let attempt = 1; ; attempt++) {
    port = await freePort();
    const failure = await launch();
    if (failure === undefined) return server;
    kill();
    await exited;
    if (attempt >= 3 || !/in use|eaddrinuse/i.test(output)) {
      await server.remove();
      throw new Error(`${kind} did not start: ${failure}\n${output.trim()}`);
    }
  }
}

/**
 * A webhook receiver on a free port, in this process: every request must verify with its secret
 * (the standardwebhooks package, as a receiver by the Standard Webhooks specification does); it
 * is recorded, then answered 204. Stopped, it closes its listening socket and destroys its
 * connections, the requests on them unanswered; started again, it listens on the same port.
 */
async function webhookServer(): Promise<WebhookReceiver> {
  const secret = `whsec_${randomBytes(32).toString('base64')}`;
  const verifier = new Webhook(secret);
  const received: WebhookDelivery[] = [];
  const unverified: string[] = [];
  let output = '';
  let http: Server | undefined;
  let port = 0;

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const body = Buffer.concat(chunks).toString('utf8');
    const headers: Record<string, string> = {};
    for (const [k, v] of Object.entries(req.headers)) headers[k] = Array.isArray(v) ? v.join(', ') : v!;
    try {
      verifier.verify(body, headers);
    } catch (e) {
      unverified.push(`${headers['webhook-id']}: ${(e as Error).message}`);
      res.writeHead(401).end();
      return;
    }
    received.push({ path: req.url!, body, headers });
    res.writeHead(204).end();
  };

  const listen = async (): Promise<void> => {
    const started = createServer((req, res) => {
      // A request whose connection was destroyed mid-way (the receiver stopping) is not recorded.
      handle(req, res).catch((e: unknown) => {
        output += `a request failed: ${(e as Error).message}\n`;
        if (!res.destroyed) res.writeHead(500).end();
      });
    });
    await new Promise<void>((resolve, reject) => {
      started.once('error', reject);
      started.listen(port, '127.0.0.1', () => {
        started.off('error', reject);
        resolve();
      });
    });
    http = started;
    port = (started.address() as { port: number }).port;
    output += `listening on 127.0.0.1:${port}\n`;
  };

  const close = async (): Promise<void> => {
    const stopping = http;
    if (!stopping) return;
    http = undefined;
    const closed = new Promise<void>((resolve) => stopping.close(() => resolve()));
    stopping.closeAllConnections();
    await closed;
    output += 'stopped\n';
  };

  const server: WebhookReceiver = {
    kind: 'webhook',
    secret,
    received,
    unverified,
    get port() {
      return port;
    },
    get url() {
      return `http://127.0.0.1:${port}`;
    },
    get running() {
      return http !== undefined;
    },
    stop: close,
    async start() {
      if (!http) await listen();
    },
    log: () => output,
    remove: close,
  };
  await listen();
  return server;
}

function systemUser(name: string): { uid: number; gid: number } | undefined {
  const uid = spawnSync('id', ['-u', name], { encoding: 'utf8' });
  const gid = spawnSync('id', ['-g', name], { encoding: 'utf8' });
  if (uid.status !== 0 || gid.status !== 0) return undefined;
  return { uid: Number(uid.stdout.trim()), gid: Number(gid.stdout.trim()) };
}
