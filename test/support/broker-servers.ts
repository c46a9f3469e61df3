// A broker of a test's own, on a free port of 127.0.0.1 with its files in a temporary folder,
// for tests that stop a broker and start it again: never the machine's own brokers, which other
// test files use at the same time. A restart keeps the port and the folder, so clients reconnect
// to the same URL and find what the broker had stored (a JetStream stream, a Redis stream, an
// MQTT session).
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { rmSync } from 'node:fs';
import { chown, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { freePort } from '../../src/db/embedded.js';

export type BrokerKind = 'nats' | 'redis' | 'mqtt';

export interface BrokerServer {
  kind: BrokerKind;
  port: number;
  /** The URL a relay and a test client use: nats://, redis:// or mqtt://127.0.0.1:<port>. */
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

/** How each broker is run: its command, and the line it prints once it accepts clients. */
interface Recipe {
  scheme: string;
  /** The command line; may write a configuration file into `dir` first. */
  command(port: number, dir: string): Promise<string[]>;
  ready: RegExp;
}

const RECIPES: Record<BrokerKind, Recipe> = {
  // The JetStream store in `dir`: a stream and its duplicate window outlive a restart.
  nats: {
    scheme: 'nats',
    command: async (port, dir) => ['nats-server', '-js', '-a', '127.0.0.1', '-p', String(port), '-sd', dir],
    ready: /Server is ready/,
  },
  // The append-only file in `dir`, no snapshots: every confirmed XADD outlives a stop.
  redis: {
    scheme: 'redis',
    command: async (port, dir) => [
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
    ready: /Ready to accept connections/,
  },
  // Persistence in `dir`: a subscriber's session and the messages queued for it outlive a
  // stop. Started as root, mosquitto runs as its own user, which must own the folder.
  mqtt: {
    scheme: 'mqtt',
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
      return ['mosquitto', '-c', file];
    },
    ready: /mosquitto version \S+ running/,
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
export async function brokerServer(kind: BrokerKind): Promise<BrokerServer> {
  const recipe = RECIPES[kind];
  const dir = await mkdtemp(join(tmpdir(), `ordo-${kind}-`));
  let child: ChildProcess | undefined;
  let exited: Promise<void> = Promise.resolve();
  let output = '';
  let port = 0;

  const launch = async (): Promise<string | undefined> => {
    const [command, ...args] = await recipe.command(port, dir);
    const started = spawn(command!, args, { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
    child = started;
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
    exited = new Promise<void>((resolve) => started.once('close', () => resolve()));
    const failed = exited.then(
      () => `${command} exited with ${started.signalCode ?? `status ${started.exitCode}`}`,
    );
    const timeout = sleep(START_TIMEOUT_MS, `${command} did not start within ${START_TIMEOUT_MS} ms`, {
      ref: false,
    });
    return Promise.race([ready, failed, timeout]);
  };

  const kill = () => {
    if (child && child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
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
      return `${recipe.scheme}://127.0.0.1:${port}`;
    },
    get running() {
      return child !== undefined && child.exitCode === null && child.signalCode === null;
    },
    async stop(signal = 'SIGTERM') {
      if (!server.running) return;
      child!.kill(signal);
      const killed = sleep(STOP_TIMEOUT_MS, undefined, { ref: false }).then(kill);
      await Promise.race([exited, killed]);
      await exited;
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
    if (attempt >= 3 || !/in use/i.test(output)) {
      await server.remove();
      throw new Error(`${kind} did not start: ${failure}\n${output.trim()}`);
    }
  }
}

function systemUser(name: string): { uid: number; gid: number } | undefined {
  const uid = spawnSync('id', ['-u', name], { encoding: 'utf8' });
  const gid = spawnSync('id', ['-g', name], { encoding: 'utf8' });
  if (uid.status !== 0 || gid.status !== 0) return undefined;
  return { uid: Number(uid.stdout.trim()), gid: Number(gid.stdout.trim()) };
}
