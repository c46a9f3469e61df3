import { spawn } from 'node:child_process';
import cluster, { type Address, type Worker } from 'node:cluster';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type ParseArgsConfig, parseArgs } from 'node:util';
import {
  type Blocker,
  createOrdo,
  type DatabaseInfo,
  describeHost,
  durationOption,
  envDatabaseUrl,
  formatDuration,
  type LogEntry,
  type Ordo,
  OrdoError,
  type Relay,
  type RelayOptions,
  type ThrottleState,
  toOrdoError,
} from '../index.js';
import type { FastifyBaseLogger } from 'fastify';
import {
  answerWorkerScrapes,
  buildServer,
  parseTokens,
  readTokensFile,
  serverLogger,
  type Token,
} from '../server/app.js';

type Options = NonNullable<ParseArgsConfig['options']>;
type Flags = Record<string, string | boolean | undefined>;

const COMMON: Options = {
  'database-url': { type: 'string' },
  'listen-url': { type: 'string' },
  'data-dir': { type: 'string' },
  schema: { type: 'string' },
  help: { type: 'boolean', short: 'h' },
};
const COMMON_HELP = `  --database-url URL   PostgreSQL to use (default: ORDO_DATABASE_URL, DATABASE_URL); with none,
                       an embedded PostgreSQL kept in <data-dir>/pg
  --listen-url URL     a direct route to PostgreSQL for LISTEN, when --database-url goes through
                       a pooler in transaction mode (default: ORDO_LISTEN_URL)
  --data-dir DIR       ordo's directory for the embedded PostgreSQL (default: the nearest .ordo
                       in this folder or above it, else ./.ordo)
  --schema NAME        ordo's schema (default ORDO_SCHEMA, then ordo)
  -h, --help           this help`;

interface Command {
  usage: string;
  options: Options;
  /** Returns the exit status; a command that serves resolves when it has stopped. */
  run(ordo: Ordo, args: string[], flags: Flags): Promise<number>;
  /** Checks flags before anything is started. */
  check?(flags: Flags, args: string[]): void;
  /** Runs without a database. */
  standalone?: true;
}

const COMMANDS: Record<string, Command> = {
  serve: {
    usage: `ordo serve [--port 7070] [--host 127.0.0.1] [--tokens-file FILE] [--insecure]
  Serves the HTTP API until SIGINT or SIGTERM, then finishes the requests in flight and exits 0.
  --port N             port (default 7070; 0 picks a free one)
  --host ADDRESS       address to listen on (default 127.0.0.1)
  --tokens-file FILE   bearer tokens, one 'token:scope+scope' a line (default: ORDO_TOKENS)
  --insecure           allow listening beyond loopback without tokens
  --request-timeout D  a request must arrive whole within D (default 10s; headers within half)
  --max-connections N  most open client connections (default: the open-files limit less 256; per worker)
  --workers N          serves from N processes (node:cluster, 1 to 64, default 1), each with its own
                       pool and its own ranges of batched sequences; /metrics sums them all
  --relays FILE        runs the relays of a JSON file (an array of relay options) beside the API
                       (default: ORDO_RELAYS); on SIGTERM they finish what is in flight`,
    options: {
      relays: { type: 'string' },
      port: { type: 'string' },
      host: { type: 'string' },
      'tokens-file': { type: 'string' },
      insecure: { type: 'boolean' },
      'request-timeout': { type: 'string' },
      'max-connections': { type: 'string' },
      workers: { type: 'string' },
    },
    check(flags) {
      port(flags.port);
      workersFrom(flags);
      serverLimits(flags);
      tokensFrom(flags);
      relaysFrom(flags.relays as string | undefined);
      const host = (flags.host as string | undefined) ?? '127.0.0.1';
      if (!loopback(host) && tokensFrom(flags).length === 0 && !flags.insecure) {
        throw usage(
          `refusing to listen on ${host} without tokens: set ORDO_TOKENS or --tokens-file, or pass --insecure`,
        );
      }
    },
    async run(ordo, _args, flags) {
      if (workersFrom(flags) > 1 && cluster.isPrimary) return serveWorkers(ordo, flags, workersFrom(flags));
      // A worker of serveWorkers() serves; its primary says what the server is and does.
      const worker = cluster.isWorker;
      const app = await buildServer(ordo, {
        tokens: tokensFrom(flags),
        logger: { level: 'info' },
        ...serverLimits(flags),
        worker,
      });
      log.current = (entry) =>
        entry.level === 'warn'
          ? app.log.warn({ code: entry.code }, entry.message)
          : app.log.info({ code: entry.code }, entry.message);
      if (!worker) {
        app.log.info(
          { database: ordo.database, server: ordo.server() },
          describeDatabase(ordo.database, ordo.server()),
        );
      }
      const host = (flags.host as string | undefined) ?? '127.0.0.1';
      await app.listen({ port: port(flags.port), host });
      const address = app.server.address();
      if (!worker) {
        const where = typeof address === 'object' && address ? `${host}:${address.port}` : host;
        app.log.info({ url: `http://${where}` }, 'ordo is listening');
        warnIfInsecure(app.log, host, flags);
      }
      // Finds out now, not at the first subscription, whether notifications arrive (a pooler).
      void ordo.notifications().catch(() => undefined);
      // Heard from now on: a SIGTERM while the relays start stops them once started.
      const stopping = stopSignal();
      const relays = worker
        ? []
        : await startRelays(ordo, relaysFrom(flags.relays as string | undefined), (m) => app.log.info(m));
      const signal = await stopping;
      if (!worker) app.log.info({ signal }, 'stopping: finishing requests in flight');
      if (relays.length > 0)
        app.log.info({ relays: relays.length }, 'stopping: finishing the relays in flight');
      // No new connections; requests in flight are answered (each answered number was committed),
      // and each relay's batches in flight are confirmed or handed back.
      await Promise.all([app.close(), ...relays.map((r) => r.stop())]);
      // A worker's channel to its primary would keep it alive.
      cluster.worker?.disconnect();
      return 0;
    },
  },

  relay: {
    usage: `ordo relay FILE
  Runs the relays of FILE (a JSON array of relay options, as ordo.outbox.relay() takes them) until
  SIGINT or SIGTERM, then finishes what is in flight and exits 0; exits 1 if every relay stopped by
  itself (onExhausted: 'stop').`,
    options: {},
    check(_flags, args) {
      if (args.length !== 1) throw usage('ordo relay takes one argument: the relays file');
      relaysFrom(args[0]);
    },
    async run(ordo, args) {
      const stopping = stopSignal();
      const relays = await startRelays(ordo, relaysFrom(args[0]), (m) => console.error(`ordo: ${m}`));
      const ended = Promise.all(relays.map((r) => r.done)).then(() => 'ended' as const);
      const how = await Promise.race([stopping, ended]);
      if (how === 'ended') {
        console.error('ordo: every relay stopped');
        return 1;
      }
      console.error(`ordo: ${how}: finishing what is in flight`);
      await Promise.all(relays.map((r) => r.stop()));
      return 0;
    },
  },

  sql: {
    usage: `ordo sql "<statements>" [--json]
  Runs SurrealQL-compatible statements, e.g.
    ordo sql "DEFINE SEQUENCE ids BATCH 1000 START 100 TIMEOUT 5s; sequence::nextval('ids');"
  Prints one line per statement (--json: the array of { result } / { error, code }); exits 1 if any failed.
  Text that does not parse runs nothing (--json: one { error, code } object, not an array).`,
    options: { json: { type: 'boolean' } },
    check(_flags, args) {
      if (args.length !== 1) throw usage('ordo sql takes one argument: the statements, quoted');
    },
    async run(ordo, args, flags) {
      let results;
      try {
        results = await ordo.query(args[0]!);
      } catch (e) {
        if (!flags.json || !(e instanceof OrdoError)) throw e;
        console.log(JSON.stringify({ error: e.message, code: e.code }));
        return 1;
      }
      if (flags.json) console.log(JSON.stringify(results));
      else {
        for (const r of results)
          console.log('error' in r ? `error (${r.code}): ${r.error}` : JSON.stringify(r.result));
      }
      return results.some((r) => 'error' in r) ? 1 : 0;
    },
  },

  next: {
    usage: `ordo next <name> [--scope s] [--count n] [--at time] [--json]
  Takes the next value(s) of a sequence and prints their text (--json: the issued values).`,
    options: {
      scope: { type: 'string' },
      count: { type: 'string' },
      at: { type: 'string' },
      json: { type: 'boolean' },
    },
    check(flags, args) {
      if (args.length !== 1) throw usage('ordo next takes one argument: the sequence name');
      if (flags.count !== undefined && !/^\d+$/.test(flags.count as string)) {
        throw usage(`--count must be a whole number (got '${flags.count}')`);
      }
    },
    async run(ordo, args, flags) {
      const opts = { scope: flags.scope as string | undefined, at: flags.at as string | undefined };
      const issued =
        flags.count === undefined
          ? [await ordo.sequences.next(args[0]!, opts)]
          : await ordo.sequences.nextMany(args[0]!, Number(flags.count), opts);
      if (flags.json) console.log(JSON.stringify(issued));
      else for (const i of issued) console.log(i.text);
      return 0;
    },
  },

  migrate: {
    usage: `ordo migrate
  Applies ordo's migrations to the database (every command does so too).`,
    options: {},
    check: noArguments('migrate'),
    async run() {
      console.log('ordo: schema is up to date');
      return 0;
    },
  },

  url: {
    usage: `ordo url
  Prints the URL of the database ordo uses, with its password. For the embedded PostgreSQL the
  port changes at every start: run it while \`ordo serve\` runs (or use \`ordo psql\`).`,
    options: {},
    check: noArguments('url'),
    async run(ordo) {
      console.log(ordo.connectionUrl() ?? '');
      const d = ordo.database;
      if (d.kind === 'embedded' && !d.adopted) {
        console.error(
          'ordo: no ordo was running on this embedded PostgreSQL: it stops now, and this URL with it',
        );
      }
      return 0;
    },
  },

  psql: {
    usage: `ordo psql [-- psql arguments]
  Opens psql on the database ordo uses (the embedded PostgreSQL is started for it when needed).`,
    options: {},
    async run(ordo, args) {
      const child = spawn('psql', [ordo.connectionUrl() ?? '', ...args], { stdio: 'inherit' });
      return new Promise<number>((resolve, reject) => {
        child.on('error', (e: NodeJS.ErrnoException) =>
          reject(
            e.code === 'ENOENT'
              ? usage('psql is not installed here; `ordo url` prints the URL for another client')
              : e,
          ),
        );
        child.on('exit', (code) => resolve(code ?? 1));
      });
    },
  },

  status: {
    usage: `ordo status [--json]
  Shows the database in use and whether notifications arrive; lists the sequences with their current values per scope and period,
  the columns they number at commit, the open transactions holding their counters (and how many wait behind each), the outbox
  subscriptions with how far they are behind and any open transaction holding them back,
  and the throttles with their running permits and their keys of note (own limits, paused, waiting in line, last failed).`,
    options: { json: { type: 'boolean' } },
    check: noArguments('status'),
    async run(ordo, _args, flags) {
      const sequences = await ordo.sequences.status();
      const holders = await ordo.sequences.holders();
      const attachments = await ordo.sequences.attachments();
      const subscriptions = await ordo.outbox.subscriptions();
      const relays = await ordo.outbox.relays();
      const throttles = await ordo.throttles.list();
      const permits = await ordo.throttles.running();
      const keys = (await Promise.all(throttles.map((t) => ordo.throttles.keys(t.name, { limit: 1000 }))))
        .flat()
        .filter(
          (k) =>
            k.pausedUntil !== null ||
            k.waiting > 0 ||
            k.lastOutcome === 'failed' ||
            Object.values(k.ownLimits).some((v) => v !== null),
        );
      const notifications = await ordo.notifications();
      const { database } = ordo;
      const server = ordo.server();
      if (flags.json) {
        console.log(
          JSON.stringify(
            {
              database,
              server,
              notifications,
              sequences,
              holders,
              attachments,
              subscriptions,
              relays,
              throttles,
              keys,
              permits,
            },
            null,
            2,
          ),
        );
        return 0;
      }
      console.log(describeDatabase(database, server));
      console.log(
        notifications.state === 'ok'
          ? `notifications: arriving (${notifications.route === 'listenUrl' ? 'through --listen-url' : 'on the database connection'})`
          : `notifications: ${notifications.state} — ${notifications.message}`,
      );
      if (sequences.length === 0) console.log('no sequences defined');
      else {
        console.log('sequences');
        console.table(
          sequences.map((r) => ({
            sequence: r.name,
            reset: r.reset,
            scope: r.scope ?? '',
            period: r.period ?? '',
            value: r.value ?? '',
          })),
        );
      }
      if (attachments.length > 0) {
        console.log('numbered at commit');
        console.table(
          attachments.map((a) => ({
            sequence: a.sequence,
            table: a.table,
            column: a.column,
            scope: a.scopeColumn ?? '',
            text: a.textColumn ?? '',
          })),
        );
      }
      if (holders.length > 0) {
        console.log('counters held by open transactions');
        console.table(
          holders.map((h) => ({
            sequence: h.sequence,
            scope: h.scope,
            period: h.period ?? '',
            'held by': describeBlocker(h),
            waiting: h.waiting,
          })),
        );
      }
      if (subscriptions.length === 0) console.log('no outbox subscriptions');
      else {
        console.log('outbox subscriptions');
        console.table(
          subscriptions.map((s) => ({
            subscription: s.name,
            topic: s.topic,
            behind: s.messagesBehind,
            'oldest (s)': s.oldestAgeMs === null ? '' : Math.round(s.oldestAgeMs / 100) / 10,
            'held back by': s.blockedBy ? describeBlocker(s.blockedBy) : '',
            consumer: s.owner ?? '',
            'last error': s.lastError ?? '',
          })),
        );
      }
      if (relays.length > 0) {
        console.log('relays');
        console.table(
          relays.map((r) => ({
            relay: r.name,
            topic: r.topic,
            to: r.target,
            state: r.state,
            behind: r.messagesBehind,
            delivered: r.delivered,
            'last error': r.lastRelayError ?? r.lastError ?? '',
          })),
        );
      }
      if (throttles.length === 0) console.log('no throttles defined');
      else {
        console.log('throttles');
        console.table(
          throttles.map((t) => ({
            throttle: t.name,
            every: t.everyMs === null ? '' : formatDuration(t.everyMs),
            rate: t.limit === null || t.perMs === null ? '' : `${t.limit}/${formatDuration(t.perMs)}`,
            concurrency: t.concurrency ?? '',
            lease: t.leaseMs === null ? 'no permits' : formatDuration(t.leaseMs),
            'refund on failure': t.refundOnFailure ? 'yes' : 'no',
            running: permits.filter((p) => p.name === t.name).length,
            'paused until': t.pausedUntil?.toISOString() ?? '',
          })),
        );
      }
      if (keys.length > 0) {
        console.log('throttle keys of note');
        console.table(
          keys.map((k) => ({
            throttle: k.name,
            key: k.key,
            'own limits': describeOwnLimits(k.ownLimits),
            'paused until': k.pausedUntil?.toISOString() ?? '',
            waiting: k.waiting,
            running: k.running.length,
            'last outcome': k.lastOutcome ?? '',
            'last error': k.lastError ?? '',
          })),
        );
      }
      if (permits.length === 0) console.log('no running permits');
      else {
        console.log('running permits');
        console.table(
          permits.map((p) => ({
            throttle: p.name,
            key: p.key,
            holder: p.holder,
            permit: p.id,
            since: p.acquiredAt.toISOString(),
            expires: p.expiresAt.toISOString(),
          })),
        );
      }
      return 0;
    },
  },

  bench: {
    usage: `ordo bench
  Runs the benchmark suite (npm run bench) against --database-url / DATABASE_URL, or an embedded PostgreSQL.
  Needs the ordo repository (the benchmarks are not part of the published package).`,
    options: {},
    check: noArguments('bench'),
    standalone: true,
    async run(_ordo, _args, flags) {
      const root = fileURLToPath(new URL('../../', import.meta.url));
      if (!existsSync(`${root}bench/index.ts`)) throw usage('ordo bench runs from the ordo repository only');
      const env = { ...process.env };
      if (flags['database-url']) env.DATABASE_URL = flags['database-url'] as string;
      const child = spawn(process.execPath, ['--import', 'tsx', 'bench/index.ts'], {
        cwd: root,
        env,
        stdio: 'inherit',
      });
      return new Promise<number>((resolve) => child.on('exit', (code) => resolve(code ?? 1)));
    },
  },
};

const USAGE = `ordo — numbers and order you can trust on PostgreSQL

Usage:
  ordo serve [--port 7070] [--host 127.0.0.1]   the HTTP API (and --relays FILE)
  ordo relay FILE                               the relays of FILE, until SIGTERM
  ordo sql "<statements>" [--json]              SurrealQL-compatible statements
  ordo next <name> [--scope s] [--count n]      take values
  ordo status [--json]                          sequences, subscriptions and throttles
  ordo migrate                                  apply migrations
  ordo psql [-- args]                           psql on the database ordo uses
  ordo url                                      that database's URL
  ordo bench                                    run the benchmarks

Every command:
${COMMON_HELP}

ordo <command> --help shows a command's own options.
`;

function describeDatabase(d: DatabaseInfo, server: string | undefined): string {
  if (d.kind === 'embedded') {
    const how = d.created ? 'created now' : d.adopted ? 'left running by an earlier process' : 'started';
    return `database: the embedded PostgreSQL in ${d.dataDir} (${how}), on ${d.host}:${d.port}; \`npx ordo psql\` opens it`;
  }
  if (d.kind === 'url') {
    const on = `database: ${d.database} on ${d.hosts.map((h) => describeHost(h.host, h.port)).join(', ')} as ${d.user}`;
    // With several hosts, the one that gave the last session: the primary in use.
    return d.hosts.length > 1 && server !== undefined ? `${on}, connected to ${server}` : on;
  }
  return 'database: a pool given by the application';
}

function describeBlocker(
  b: Pick<Blocker, 'pid' | 'preparedGid' | 'openForMs' | 'state' | 'applicationName'>,
): string {
  const who = b.pid === null ? `prepared transaction '${b.preparedGid}'` : `pid ${b.pid}`;
  const open = b.openForMs === null ? '' : `, open ${Math.round(b.openForMs / 1000)} s`;
  const state = b.state ? `, ${b.state}` : '';
  const app = b.applicationName ? ` (${b.applicationName})` : '';
  return `${who}${app}${state}${open}`;
}

/** A key's own limits as `define` takes them: 'concurrency 5, 10/1m'. */
function describeOwnLimits(own: ThrottleState['ownLimits']): string {
  const parts: string[] = [];
  if (own.everyMs !== null) parts.push(`every ${formatDuration(own.everyMs)}`);
  if (own.limit !== null) parts.push(`${own.limit}/${own.perMs === null ? '…' : formatDuration(own.perMs)}`);
  if (own.concurrency !== null) parts.push(`concurrency ${own.concurrency}`);
  return parts.join(', ');
}

/** Exit status 2: the command line itself is wrong. */
class UsageError extends Error {}
const usage = (message: string) => new UsageError(message);

export async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (name === undefined || name === '--help' || name === '-h' || name === 'help') {
    console.log(USAGE);
    return name === undefined ? 2 : 0;
  }
  const command = COMMANDS[name];
  if (!command) {
    console.error(`ordo: unknown command '${name}' (try ordo --help)`);
    return 2;
  }
  let flags: Flags;
  let args: string[];
  try {
    const parsed = parseArgs({
      args: rest,
      options: { ...COMMON, ...command.options },
      allowPositionals: true,
      strict: true,
    });
    flags = parsed.values as Flags;
    args = parsed.positionals;
    if (flags.help) {
      console.log(`${command.usage}\n\nEvery command:\n${COMMON_HELP}`);
      return 0;
    }
    command.check?.(flags, args);
  } catch (e) {
    // node's parseArgs explains some refusals over several lines: the first says what is wrong.
    console.error(`ordo: ${(e as Error).message.split('\n')[0]}`);
    return 2;
  }
  let ordo: Ordo | undefined;
  try {
    if (!command.standalone) ordo = await open(flags);
    return await command.run(ordo as Ordo, args, flags);
  } catch (e) {
    if (e instanceof UsageError) {
      console.error(`ordo: ${e.message}`);
      return 2;
    }
    const code = e instanceof OrdoError ? e.code : 'error';
    console.error(`ordo: ${code}: ${(e as Error).message}`);
    return 1;
  } finally {
    await ordo?.close();
  }
}

/** Where ordo's warnings go: stderr, until `serve` hands them to its logger. */
const log: { current: (entry: LogEntry) => void } = {
  current: (entry) => console.error(`ordo: ${entry.level === 'warn' ? 'warning: ' : ''}${entry.message}`),
};

async function open(flags: Flags): Promise<Ordo> {
  const url = (flags['database-url'] as string | undefined) ?? envDatabaseUrl();
  const listenUrl = flags['listen-url'] as string | undefined;
  const common = {
    schema: flags.schema as string | undefined,
    listenUrl,
    log: (e: LogEntry) => log.current(e),
  };
  if (url) return createOrdo({ databaseUrl: url, ...common });
  const dataDir = join((flags['data-dir'] as string | undefined) ?? nearestDataDir(), 'pg');
  const ordo = await createOrdo({ embedded: { dataDir }, ...common });
  // A new database in an unexpected folder must not go unnoticed (the usual one is above).
  if (ordo.database.kind === 'embedded' && ordo.database.created) {
    console.error(`ordo: created a new embedded PostgreSQL in ${ordo.database.dataDir}`);
  }
  return ordo;
}

/** The nearest `.ordo` holding an embedded database, in this folder or above it; else ./.ordo. */
function nearestDataDir(): string {
  for (let dir = process.cwd(); ; dir = dirname(dir)) {
    if (existsSync(join(dir, '.ordo', 'pg', 'PG_VERSION'))) return join(dir, '.ordo');
    if (dirname(dir) === dir) return resolve('.ordo');
  }
}

function noArguments(command: string): (flags: Flags, args: string[]) => void {
  return (_flags, args) => {
    if (args.length > 0) throw usage(`ordo ${command} takes no arguments (got '${args[0]}')`);
  };
}

function port(value: unknown): number {
  if (value === undefined) return 7070;
  const n = Number(value);
  if (typeof value !== 'string' || !/^\d+$/.test(value) || n > 65535) {
    throw usage(`--port must be a whole number from 0 to 65535 (got '${String(value)}')`);
  }
  return n;
}

function serverLimits(flags: Flags): { requestTimeoutMs?: number; maxConnections?: number } {
  const limits: { requestTimeoutMs?: number; maxConnections?: number } = {};
  const timeout = flags['request-timeout'] as string | undefined;
  if (timeout !== undefined) {
    try {
      limits.requestTimeoutMs = durationOption('--request-timeout', timeout, 100, 3_600_000);
    } catch (e) {
      throw usage((e as Error).message);
    }
  }
  const max = flags['max-connections'] as string | undefined;
  if (max !== undefined) {
    if (!/^\d+$/.test(max) || Number(max) < 1 || Number(max) > 1_000_000) {
      throw usage(`--max-connections must be a whole number from 1 to 1000000 (got '${max}')`);
    }
    limits.maxConnections = Number(max);
  }
  return limits;
}

function tokensFrom(flags: Flags): Token[] {
  const file = flags['tokens-file'] as string | undefined;
  if (file) return readTokensFile(file);
  return process.env.ORDO_TOKENS ? parseTokens(process.env.ORDO_TOKENS) : [];
}

function loopback(host: string): boolean {
  return host === 'localhost' || host === '::1' || /^127(\.\d{1,3}){3}$/.test(host);
}

/** The relays of a file (a JSON array of relay options): the path given, else ORDO_RELAYS. */
function relaysFrom(file: string | undefined): Record<string, unknown>[] {
  const path = file ?? process.env.ORDO_RELAYS;
  if (path === undefined || path === '') return [];
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw usage(`cannot read the relays file ${path}: ${(e as Error).message}`);
  }
  let list: unknown;
  try {
    list = JSON.parse(text);
  } catch (e) {
    throw usage(`the relays file ${path} is not JSON: ${(e as Error).message}`);
  }
  if (!Array.isArray(list) || list.some((r) => typeof r !== 'object' || r === null || Array.isArray(r))) {
    throw usage(
      `the relays file ${path} must hold a JSON array of relay options, such as [{ "name": …, "topic": …, "to": { "nats": { … } } }]`,
    );
  }
  return list as Record<string, unknown>[];
}

/** Starts every relay, or none: a relay refused stops those started before it. */
async function startRelays(
  ordo: Ordo,
  list: Record<string, unknown>[],
  say: (message: string) => void,
): Promise<Relay[]> {
  const started: Relay[] = [];
  for (const [i, options] of list.entries()) {
    try {
      const relay = await ordo.outbox.relay(options as unknown as RelayOptions);
      started.push(relay);
      say(`relay ${relay.name}: ${relay.topic} to ${relay.state().target}`);
    } catch (e) {
      await Promise.all(started.map((r) => r.stop()));
      const error = toOrdoError(e);
      throw new OrdoError(error.code, `relay ${i} (${String(options.name)}): ${error.message}`, { cause: e });
    }
  }
  return started;
}

/** What the primary of `ordo serve --workers` sends a worker to stop it, with the signal it got. */
const STOP = 'ordo:stop';

/** In a worker, its primary's stop, heard from the start: it may come before the server listens. */
const primaryStop =
  cluster.isWorker &&
  new Promise<NodeJS.Signals>((resolve) => {
    const told = (m: { type?: string; signal?: NodeJS.Signals }) => {
      if (m?.type !== STOP) return;
      process.removeListener('message', told);
      resolve(m.signal ?? 'SIGTERM');
    };
    process.on('message', told);
  });

/** Resolves with the first SIGINT or SIGTERM (in a worker, or its primary's stop). */
function stopSignal(): Promise<NodeJS.Signals> {
  const signalled = new Promise<NodeJS.Signals>((resolve) => {
    const stop = (signal: NodeJS.Signals) => {
      process.removeListener('SIGINT', stop);
      process.removeListener('SIGTERM', stop);
      resolve(signal);
    };
    process.on('SIGINT', stop);
    process.on('SIGTERM', stop);
  });
  return primaryStop ? Promise.race([signalled, primaryStop]) : signalled;
}

function warnIfInsecure(logger: FastifyBaseLogger, host: string, flags: Flags): void {
  if (!loopback(host) && tokensFrom(flags).length === 0) {
    logger.warn(
      { host },
      `--insecure: every route, /v1/query included, is open to anyone who can reach ${host}; set ORDO_TOKENS or --tokens-file`,
    );
  }
}

function workersFrom(flags: Flags): number {
  const value = flags.workers as string | undefined;
  if (value === undefined) return 1;
  if (!/^\d+$/.test(value) || Number(value) < 1 || Number(value) > 64) {
    throw usage(`--workers must be a whole number from 1 to 64 (got '${value}')`);
  }
  return Number(value);
}

interface WorkerExit {
  worker: Worker;
  code: number | null;
  signal: string | null;
}

/**
 * `ordo serve --workers N`: this process (the primary) forks N workers that serve on one port
 * (node:cluster hands each connection to one of them), each with an ordo of its own: its own
 * pool, and its own ranges of batched sequences, as any node has. The primary holds the
 * database (the embedded PostgreSQL lives as long as it does), runs the relays, sums the
 * workers' metrics, and logs what the server does. A worker that exits unasked stops the
 * others and the primary exits 1, for whatever supervises it to start the whole again; on
 * SIGINT or SIGTERM every worker answers the requests it has in flight, then all exit 0.
 */
async function serveWorkers(ordo: Ordo, flags: Flags, count: number): Promise<number> {
  const logger = serverLogger({ level: 'info' });
  log.current = (entry) =>
    entry.level === 'warn'
      ? logger.warn({ code: entry.code }, entry.message)
      : logger.info({ code: entry.code }, entry.message);
  logger.info(
    { database: ordo.database, server: ordo.server() },
    describeDatabase(ordo.database, ordo.server()),
  );
  answerWorkerScrapes(ordo);
  const stopping = stopSignal();
  // The workers use the database this process opened (the embedded one's URL changes at each start).
  const url = ordo.connectionUrl();
  const workers = Array.from({ length: count }, () => cluster.fork(url ? { ORDO_DATABASE_URL: url } : {}));
  const exits = workers.map(
    (worker) =>
      new Promise<WorkerExit>((resolve) =>
        worker.once('exit', (code, signal) => resolve({ worker, code, signal })),
      ),
  );
  const listening = Promise.all(
    workers.map((w) => new Promise<Address>((resolve) => w.once('listening', resolve))),
  );
  let stopped = false;
  const stopAll = async (signal: NodeJS.Signals) => {
    stopped = true;
    for (const w of workers) {
      if (w.isConnected()) w.send({ type: STOP, signal }, () => undefined);
    }
    return Promise.all(exits);
  };
  const said = (e: WorkerExit) => ({ worker: e.worker.process.pid, code: e.code, signal: e.signal });
  let relays: Relay[] = [];
  try {
    const start = await Promise.race([
      listening.then((addresses) => ({ listening: addresses[0]! })),
      Promise.race(exits).then((exit) => ({ exit })),
      stopping.then((signal) => ({ signal })),
    ]);
    if ('exit' in start) {
      logger.error(said(start.exit), 'a worker exited before listening: stopping the others');
      await stopAll('SIGTERM');
      return 1;
    }
    if ('listening' in start) {
      const host = (flags.host as string | undefined) ?? '127.0.0.1';
      logger.info({ url: `http://${host}:${start.listening.port}`, workers: count }, 'ordo is listening');
      warnIfInsecure(logger, host, flags);
      void ordo.notifications().catch(() => undefined);
      relays = await startRelays(ordo, relaysFrom(flags.relays as string | undefined), (m) => logger.info(m));
    }
    const end = await Promise.race([
      'signal' in start ? start : stopping.then((signal) => ({ signal })),
      Promise.race(exits).then((exit) => ({ exit })),
    ]);
    if ('exit' in end) logger.error(said(end.exit), 'a worker exited: stopping the others');
    else logger.info({ signal: end.signal }, 'stopping: finishing requests in flight');
    if (relays.length > 0) logger.info({ relays: relays.length }, 'stopping: finishing the relays in flight');
    const [ended] = await Promise.all([
      stopAll('signal' in end ? end.signal : 'SIGTERM'),
      ...relays.map((r) => r.stop()),
    ]);
    const failed = ended.filter((e) => e.code !== 0);
    for (const e of failed)
      if (e !== ('exit' in end ? end.exit : undefined)) logger.error(said(e), 'a worker failed to stop');
    return 'exit' in end || failed.length > 0 ? 1 : 0;
  } finally {
    if (!stopped) await stopAll('SIGTERM');
  }
}
