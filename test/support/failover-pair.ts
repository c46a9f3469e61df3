// A pg_auto_failover formation of a test's own: a monitor and two PostgreSQL 15 nodes, a
// primary and its synchronous standby, on free ports of 127.0.0.1 with every file in one
// temporary folder, never the machine's PostgreSQL. A test fails the primary over as an
// operator does (`pg_autoctl perform failover`) or as a crash does (SIGKILL of the primary's
// postgres and of its keeper), and brings a killed node back as the new standby. Debian's
// packages pg-auto-failover-cli and postgresql-15-auto-failover, which the test set-up installs
// when missing (test/support/system-packages.ts).
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { closeSync, existsSync, openSync, readFileSync, rmSync } from 'node:fs';
import { appendFile, chmod, chown, mkdir, mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { embeddedPostgres, freePort, type RunAs } from '../../src/db/embedded.js';

const BINDIR = process.env.PG_BINDIR ?? '/usr/lib/postgresql/15/bin';
const PG_AUTOCTL = process.env.PG_AUTOCTL ?? '/usr/bin/pg_autoctl';

/** How long the pair may take to come up, and a failover or a rejoin to settle. */
const UP_TIMEOUT_MS = 90_000;
const SWITCH_TIMEOUT_MS = 60_000;
/** How long a keeper may take to stop on SIGTERM (it stops its postgres, fast) before SIGKILL. */
const STOP_TIMEOUT_MS = 15_000;

/**
 * The monitor's clock, lowered from its defaults (a health check every 20 s, a node unhealthy
 * after 20 s without news, a demotion awaited 30 s) so that an unplanned failover takes
 * seconds. Not lower: on two busy cores a keeper or a health check can be late by a second,
 * and a failover that a test did not ask for would fail it. The grace period after the monitor
 * starts is shortened too, or a primary killed in a pair's first 10 s would wait for its end.
 */
const MONITOR_SETTINGS: Record<string, string | number> = {
  'pgautofailover.health_check_period': 1000,
  'pgautofailover.health_check_timeout': 1000,
  'pgautofailover.health_check_max_retries': 1,
  'pgautofailover.health_check_retry_delay': 200,
  'pgautofailover.node_considered_unhealthy_timeout': 2000,
  // The promoted node stays read-only (stop_replication) until the old primary reports that it
  // is demoted, or this long after it was last heard of: a killed one never reports.
  'pgautofailover.primary_demote_timeout': 2000,
  'pgautofailover.startup_grace_period': 2000,
};

/**
 * The nodes' settings, in the first node's postgresql.conf, which pg_basebackup copies to the
 * second. pg_auto_failover's own (replication, synchronous_standby_names, read-only while
 * promoting) are in files it includes or set with ALTER SYSTEM, and stay its own; the port and
 * listen address it passes on postgres's command line.
 */
const NODE_SETTINGS: Record<string, string | number> = {
  // pg_basebackup begins with a checkpoint spread over this part of checkpoint_timeout (~90 s
  // by default): 0 makes the second node's copy start at once.
  checkpoint_completion_target: 0,
  // A standby whose primary went away sleeps this long between attempts to read more WAL, and a
  // promotion asked for during the sleep waits for its end (5 s by default).
  wal_retrieve_retry_interval: '100ms',
  // What the tests simulate is a server's processes dying, not the machine: WAL written and
  // streamed is enough. full_page_writes stays on: pg_rewind needs it to bring a node back.
  fsync: 'off',
  shared_buffers: '32MB',
  max_connections: 200,
  log_line_prefix: '%m [%p] %a ',
};

const NODE_NAMES = ['node1', 'node2'] as const;

/** One node of the pair. */
export interface PairNode {
  /** `node1` (the first primary) or `node2`. */
  name: string;
  port: number;
  /** postgres://postgres@127.0.0.1:<port>/<database>: this node alone (trust, no password). */
  url: string;
}

/** A node as the monitor sees it. */
export interface NodeState extends PairNode {
  /** The state its keeper last reported: primary, secondary, wait_primary, catchingup, … */
  reported: string;
  /** The state the monitor assigned it. */
  assigned: string;
  /** Whether the monitor's last health check reached its postgres. */
  healthy: boolean;
}

/** A failover that happened: the primary before, the writable primary after, how long it took. */
export interface Switch {
  from: PairNode;
  to: PairNode;
  /** From the command or the kill to the other node answering as a writable primary. */
  ms: number;
}

export interface FailoverPairOptions {
  /** The database created on the pair and named in every URL (default `ordo`). */
  database?: string;
  /** More PostgreSQL settings for both nodes (postgresql.conf), beside NODE_SETTINGS. */
  settings?: Record<string, string | number>;
}

export interface FailoverPair {
  /**
   * The formation's URL as `pg_autoctl show uri --formation default` prints it:
   * postgres://127.0.0.1:<p1>,127.0.0.1:<p2>/<database>?target_session_attrs=read-write&sslmode=prefer.
   * It names no user: libpq takes PGUSER or the system user's name; `postgres` exists, and
   * every role is trusted from 127.0.0.1.
   */
  url: string;
  database: string;
  /** The monitor's database: postgres://autoctl_node@127.0.0.1:<port>/pg_auto_failover. */
  monitorUrl: string;
  /** Both nodes, node1 first. */
  nodes: readonly [PairNode, PairNode];
  /** The temporary folder holding everything: data folders, keepers' files, logs. */
  dir: string;
  /** A node by name. */
  node(name: string): PairNode;
  /** Both nodes as the monitor sees them now. */
  states(): Promise<NodeState[]>;
  /**
   * The primary now: the one node the monitor has settled as primary (its reported state is
   * the assigned one: primary, or wait_primary while it has no standby) and that accepts writes
   * (out of recovery, transaction_read_only off). Waits for one while a failover is under way.
   */
  primary(timeoutMs?: number): Promise<PairNode>;
  /**
   * Waits until the pair is whole: one node primary, the other a secondary in recovery that the
   * primary streams to synchronously (pg_stat_replication's sync_state quorum or sync), so that
   * a commit the primary acknowledges is on both. Returns the standby.
   */
  standby(timeoutMs?: number): Promise<PairNode>;
  /**
   * A planned failover: `pg_autoctl perform failover`. Resolves once the other node is a
   * writable primary; the old primary goes on to become its standby (standby() waits for it).
   */
  failover(): Promise<Switch>;
  /**
   * An unplanned failover: SIGKILL of the primary's keeper and of its postgres at once, so
   * that nothing restarts the server or tells the monitor. Resolves once the other node is a
   * writable primary, which the monitor decides after its health checks fail, the keeper is
   * silent for node_considered_unhealthy_timeout and primary_demote_timeout passes. The other
   * node must be running; only commits made while it was a synchronous standby (standby()
   * resolved) are sure to be on it: a primary without one (wait_primary) commits alone.
   */
  killPrimary(): Promise<Switch>;
  /**
   * Starts the keeper of the killed node again: it finds itself demoted, rewinds its data
   * (pg_rewind) and follows the new primary. Resolves once the pair is whole (standby()).
   */
  rejoin(): Promise<{ node: PairNode; ms: number }>;
  /** The keepers' output and the servers' logs, their last lines, for failure messages. */
  log(): Promise<string>;
  /**
   * Stops every keeper as an operator does (SIGTERM: each stops its postgres, fast), SIGKILL
   * after STOP_TIMEOUT_MS; the folder stays. Safe to call twice.
   */
  stop(): Promise<void>;
  /** SIGKILL of everything still running, then removes the folder. Safe to call twice. */
  remove(): Promise<void>;
}

/** Whether pg_autoctl, the monitor's extension and PostgreSQL's binaries are installed. */
export function failoverPairAvailable(): boolean {
  return [PG_AUTOCTL, join(BINDIR, 'initdb'), join(BINDIR, '..', 'lib', 'pgautofailover.so')].every((f) =>
    existsSync(f),
  );
}

/** A running `pg_autoctl`: a process group of its own (it, its services, the postmaster). */
interface Keeper {
  name: string;
  child: ChildProcess;
  exited: Promise<void>;
}

/** Pairs started here and not yet removed: killed and removed if the test process exits first. */
const live = new Map<string, () => void>();
process.once('exit', () => {
  for (const kill of live.values()) kill();
});

/**
 * Starts a monitor and two nodes; resolves once node1 is primary and node2 its synchronous
 * standby. As root, everything runs as the system user `postgres` (PostgreSQL refuses root).
 */
export async function failoverPair(options: FailoverPairOptions = {}): Promise<FailoverPair> {
  if (!failoverPairAvailable()) {
    throw new Error(
      `pg_auto_failover not found (${PG_AUTOCTL}, ${BINDIR}): ` +
        'apt-get install pg-auto-failover-cli postgresql-15-auto-failover',
    );
  }
  const database = options.database ?? 'ordo';
  if (!/^[a-z_][a-z0-9_]*$/.test(database)) throw new Error(`not a plain database name: ${database}`);
  const { runAs } = await embeddedPostgres(BINDIR);
  // A port can be taken between finding it free and a server binding it: try a few pairs.
  for (let attempt = 1; ; attempt++) {
    try {
      return await startPair(database, options.settings ?? {}, runAs);
    } catch (e) {
      if (attempt >= 3 || !/could not bind|Address already in use/i.test((e as Error).message)) throw e;
    }
  }
}

async function startPair(
  database: string,
  settings: Record<string, string | number>,
  runAs: RunAs,
): Promise<FailoverPair> {
  const dir = await mkdtemp(join(tmpdir(), 'ordo-failover-'));
  // The user postgres must reach the folder (mkdtemp makes it 0700) and own what is in it.
  await chmod(dir, 0o755);
  await own(dir, runAs);
  const pgdata = (name: string) => join(dir, name, 'pgdata');
  const logFile = (name: string) => join(dir, `${name}.log`);
  // The three servers' Unix sockets, and the keepers' way to their own server.
  const sockets = join(dir, 'sockets');

  const keepers = new Map<string, Keeper>();
  /** Commands under way: pg_autoctl perform failover goes on after failover() resolves. */
  const commands = new Set<ChildProcess>();
  let killedNode: string | undefined;
  /**
   * One session on the monitor, kept open: the waits ask it every 100 ms, and a connection each
   * time would cost a backend's start each time, on cores that the servers share.
   */
  let monitorSession: Promise<pg.Client> | undefined;
  const closeMonitorSession = async () => {
    const session = monitorSession;
    monitorSession = undefined;
    await session?.then((c) => c.end()).catch(() => undefined);
  };
  let stopped: Promise<void> | undefined;
  let removed = false;

  const killAll = () => {
    for (const c of commands) c.kill('SIGKILL');
    for (const [name, k] of keepers) {
      killGroup(k.child);
      releaseSharedMemory(pgdata(name));
    }
  };
  live.set(dir, () => {
    killAll();
    rmSync(dir, { recursive: true, force: true, maxRetries: 3 });
  });

  const env = (name: string): NodeJS.ProcessEnv => ({
    PATH: `${BINDIR}:/usr/bin:/bin`,
    HOME: join(dir, name),
    // pg_autoctl keeps a node's configuration, state and pid files under these; left to the
    // user's own folders, two nodes being created at once race on them.
    XDG_CONFIG_HOME: join(dir, name, 'config'),
    XDG_DATA_HOME: join(dir, name, 'share'),
    XDG_RUNTIME_DIR: join(dir, name, 'run'),
    PGHOST: sockets,
    LC_ALL: 'C',
    LANG: 'C',
  });

  /** Runs one pg_autoctl command to completion; its output goes to the node's log. */
  const autoctl = (name: string, args: string[]) =>
    run(PG_AUTOCTL, [...args, '--pgdata', pgdata(name)], env(name), runAs, logFile(name), commands);

  /** Starts `pg_autoctl run`, or `pg_autoctl create … --run`, for a node. */
  const startKeeper = (name: string, args: string[] = ['run']) => {
    const fd = openSync(logFile(name), 'a');
    const child = spawn(PG_AUTOCTL, [...args, '--pgdata', pgdata(name)], {
      cwd: '/',
      env: env(name),
      stdio: ['ignore', fd, fd],
      // A group of its own, which the postmaster joins: one signal ends them all.
      detached: true,
      ...runAs,
    });
    closeSync(fd);
    const exited = new Promise<void>((resolve) => child.once('close', () => resolve()));
    child.once('error', () => undefined);
    keepers.set(name, { name, child, exited });
  };

  const stopKeeper = async (name: string) => {
    const keeper = keepers.get(name);
    if (!keeper) return;
    if (alive(keeper.child)) {
      keeper.child.kill('SIGTERM');
      const late = setTimeout(() => {
        killGroup(keeper.child);
        releaseSharedMemory(pgdata(name));
      }, STOP_TIMEOUT_MS);
      await keeper.exited;
      clearTimeout(late);
    }
    keepers.delete(name);
  };

  const logs = async () => {
    const parts: string[] = [];
    for (const name of ['monitor', ...NODE_NAMES]) {
      const keeper = await readFile(logFile(name), 'utf8').catch(() => '');
      parts.push(`== ${name}: pg_autoctl ==\n${lastLines(keeper, 60)}`);
      const logDir = join(pgdata(name), 'log');
      const files = (await readdir(logDir).catch(() => [] as string[])).sort();
      const server = files.length ? await readFile(join(logDir, files.at(-1)!), 'utf8').catch(() => '') : '';
      if (server) parts.push(`== ${name}: postgres (${files.at(-1)}) ==\n${lastLines(server, 30)}`);
    }
    return parts.join('\n');
  };

  try {
    await mkdir(sockets);
    await own(sockets, runAs);
    for (const name of ['monitor', ...NODE_NAMES]) {
      for (const sub of ['', 'config', 'share', 'run']) {
        await mkdir(join(dir, name, sub), { recursive: true });
        await own(join(dir, name, sub), runAs);
      }
    }
    const [monitorPort, port1, port2] = await distinctFreePorts(3);
    const nodeUrl = (port: number) => `postgres://postgres@127.0.0.1:${port}/${database}`;
    const nodes = [
      { name: NODE_NAMES[0], port: port1!, url: nodeUrl(port1!) },
      { name: NODE_NAMES[1], port: port2!, url: nodeUrl(port2!) },
    ] as const;
    const monitorUrl = `postgres://autoctl_node@127.0.0.1:${monitorPort}/pg_auto_failover`;

    const node = (name: string): PairNode => {
      const found = nodes.find((n) => n.name === name);
      if (!found) throw new Error(`no node ${name} in the pair (${NODE_NAMES.join(', ')})`);
      return found;
    };
    const other = (n: PairNode) => nodes.find((m) => m.name !== n.name)!;

    // The monitor's and the first node's data folders at once, made here rather than by
    // pg_autoctl: without syncing every file (the tests do not survive the machine crashing),
    // and with the settings in place before either server first starts.
    const initdb = async (name: string, settings: Record<string, string | number>) => {
      await run(
        join(BINDIR, 'initdb'),
        ['-D', pgdata(name), '-U', 'postgres', '--auth=trust', '--encoding=UTF8', '--locale=C', '--no-sync'],
        env(name),
        runAs,
        logFile(name),
      );
      const conf = { unix_socket_directories: sockets, ...settings };
      await appendFile(
        join(pgdata(name), 'postgresql.conf'),
        `\n# test/support/failover-pair.ts\n${Object.entries(conf)
          .map(([k, v]) => `${k} = '${String(v).replaceAll("'", "''")}'`)
          .join('\n')}\n`,
      );
    };
    await Promise.all([
      initdb('monitor', { ...MONITOR_SETTINGS, fsync: 'off', shared_buffers: '32MB' }),
      initdb('node1', { ...NODE_SETTINGS, ...settings }),
    ]);

    // The monitor is created, then run: created with --run, it would listen on every address,
    // since its listen_addresses is pg_autoctl's setting (passed as -h), not postgresql.conf's.
    await autoctl('monitor', [
      'create',
      'monitor',
      '--pgport',
      String(monitorPort),
      '--hostname',
      '127.0.0.1',
      '--auth',
      'trust',
      '--no-ssl',
      '--pgctl',
      join(BINDIR, 'pg_ctl'),
    ]);
    await autoctl('monitor', ['config', 'set', 'postgresql.listen_addresses', '127.0.0.1']);
    startKeeper('monitor');
    await until('the monitor accepts connections', UP_TIMEOUT_MS, keepers, async () => {
      await query(monitorUrl, 'SELECT 1 FROM pgautofailover.formation');
      return true;
    });

    // A node is created and run by one process (--run): created apart, its postgres would be
    // stopped at the end of the creation and started again by `pg_autoctl run`.
    const create = (n: PairNode) => [
      'create',
      'postgres',
      '--pgport',
      String(n.port),
      '--hostname',
      '127.0.0.1',
      '--listen',
      '127.0.0.1',
      '--name',
      n.name,
      '--dbname',
      database,
      '--monitor',
      monitorUrl,
      // pg_autoctl's own pg_hba.conf rules, trusting the monitor and the other node.
      '--auth',
      'trust',
      '--no-ssl',
      '--pgctl',
      join(BINDIR, 'pg_ctl'),
      '--run',
    ];

    const askMonitor = async (text: string) => {
      monitorSession ??= connect(monitorUrl);
      const session = monitorSession;
      try {
        return await (await session).query(text);
      } catch (e) {
        if (monitorSession === session) await closeMonitorSession();
        throw e;
      }
    };
    const states = async (): Promise<NodeState[]> => {
      const { rows } = await askMonitor(
        `SELECT nodename, reportedstate::text AS reported, goalstate::text AS assigned, health = 1 AS healthy
           FROM pgautofailover.node ORDER BY nodeid`,
      );
      return rows.map((r) => ({
        ...node(r.nodename as string),
        reported: r.reported as string,
        assigned: r.assigned as string,
        healthy: r.healthy as boolean,
      }));
    };

    const settledPrimary = async (): Promise<PairNode | undefined> => {
      const settled = (await states()).filter(
        (s) => s.reported === s.assigned && ['primary', 'wait_primary', 'single'].includes(s.reported),
      );
      if (settled.length !== 1) return undefined;
      const found = node(settled[0]!.name);
      return (await writable(found.url)) ? found : undefined;
    };
    const primary = async (timeoutMs = SWITCH_TIMEOUT_MS) => {
      let found: PairNode | undefined;
      await until('a writable primary', timeoutMs, keepers, async () => {
        found = await settledPrimary();
        return found !== undefined;
      });
      return found!;
    };
    const standby = async (timeoutMs = SWITCH_TIMEOUT_MS) => {
      let found: PairNode | undefined;
      await until('a primary and its synchronous standby', timeoutMs, keepers, async () => {
        const now = await states();
        const p = now.find((s) => s.reported === 'primary' && s.assigned === 'primary');
        const s = now.find((s) => s.reported === 'secondary' && s.assigned === 'secondary');
        if (!p || !s || !(await writable(p.url))) return false;
        const { rows } = await query(
          p.url,
          `SELECT count(*)::int AS n FROM pg_stat_replication
            WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum')`,
        );
        if (rows[0].n !== 1) return false;
        const { rows: recovery } = await query(s.url, 'SELECT pg_is_in_recovery() AS yes');
        if (recovery[0].yes !== true) return false;
        found = node(s.name);
        return true;
      });
      return found!;
    };
    /**
     * `pg_autoctl perform failover`, again while the monitor's perform_failover() dies of a
     * deadlock with a keeper's report (node_active) taking the same locks in the other order
     * (pg_auto_failover issue 1004, in 2.0): the transaction rolled back, nothing was begun.
     */
    const performFailover = async () => {
      for (let attempt = 1; ; attempt++) {
        try {
          return await autoctl('monitor', ['perform', 'failover', '--formation', 'default']);
        } catch (e) {
          const message = (e as Error).message;
          const deadlock = /deadlock detected/.test(message) && /Failed to perform failover/.test(message);
          if (!deadlock || attempt >= 5) throw e;
        }
      }
    };
    const becomesPrimary = (to: PairNode) =>
      until(`${to.name} a writable primary`, SWITCH_TIMEOUT_MS, keepers, async () => {
        const found = await settledPrimary();
        return found?.name === to.name;
      });

    // node1 alone first (state single), then node2, copied from it by pg_basebackup.
    startKeeper('node1', create(nodes[0]));
    await primary(UP_TIMEOUT_MS);
    // pg_basebackup waits for a checkpoint to begin its copy: one now leaves it little to do.
    await query(nodes[0].url, 'CHECKPOINT');
    startKeeper('node2', create(nodes[1]));
    await standby(UP_TIMEOUT_MS);

    const { stdout } = await run(
      PG_AUTOCTL,
      ['show', 'uri', '--formation', 'default', '--pgdata', pgdata('monitor')],
      env('monitor'),
      runAs,
      undefined,
    );

    return {
      url: stdout.trim(),
      database,
      monitorUrl,
      nodes,
      dir,
      node,
      states,
      primary,
      standby,
      async failover() {
        const from = await primary();
        const to = other(from);
        const started = performance.now();
        // The command waits until the new primary has its standby back (the old primary,
        // rewound): seconds after it accepts writes. It goes on alone; stop() ends it. Its
        // failure (the monitor refusing) fails this; its success decides nothing.
        const command = performFailover();
        const refused = command.then(() => new Promise<never>(() => undefined));
        await Promise.race([becomesPrimary(to), refused]);
        return { from, to, ms: Math.round(performance.now() - started) };
      },
      async killPrimary() {
        const from = await primary();
        const to = other(from);
        const keeper = keepers.get(from.name);
        if (!keeper) throw new Error(`${from.name}'s keeper is not running`);
        if (!keepers.has(to.name))
          throw new Error(`${to.name} is not running to take over: rejoin() it first`);
        const started = performance.now();
        killGroup(keeper.child);
        releaseSharedMemory(pgdata(from.name));
        await keeper.exited;
        keepers.delete(from.name);
        killedNode = from.name;
        await becomesPrimary(to);
        return { from, to, ms: Math.round(performance.now() - started) };
      },
      async rejoin() {
        const name = killedNode;
        if (name === undefined) throw new Error('no node was killed');
        const started = performance.now();
        killedNode = undefined;
        startKeeper(name);
        const back = await standby();
        if (back.name !== name) throw new Error(`${name} came back as the primary, not as the standby`);
        return { node: back, ms: Math.round(performance.now() - started) };
      },
      log: logs,
      stop() {
        stopped ??= (async () => {
          for (const c of commands) c.kill('SIGKILL');
          await closeMonitorSession();
          await Promise.all(NODE_NAMES.map(stopKeeper));
          await stopKeeper('monitor');
        })();
        return stopped;
      },
      async remove() {
        if (removed) return;
        removed = true;
        await closeMonitorSession();
        killAll();
        await Promise.all([...keepers.values()].map((k) => k.exited));
        keepers.clear();
        live.delete(dir);
        await rm(dir, { recursive: true, force: true, maxRetries: 3 });
      },
    };
  } catch (e) {
    const output = await logs();
    await closeMonitorSession();
    killAll();
    await Promise.all([...keepers.values()].map((k) => k.exited));
    live.delete(dir);
    await rm(dir, { recursive: true, force: true, maxRetries: 3 });
    throw new Error(`the failover pair did not come up: ${(e as Error).message}\n${output}`, { cause: e });
  }
}

const alive = (child: ChildProcess) => child.exitCode === null && child.signalCode === null;

/** SIGKILL of a keeper's group: it, its services and the postmaster, whose children follow it. */
function killGroup(child: ChildProcess): void {
  if (child.pid === undefined || !alive(child)) return;
  try {
    process.kill(-child.pid, 'SIGKILL');
  } catch {
    // Already gone.
  }
}

/**
 * A postmaster killed with SIGKILL leaves its System V shared memory segment behind, which only
 * a later start on the same data folder would remove: marked for removal here (the kernel
 * frees it once the last process still attached exits), so no test leaves one per kill.
 */
function releaseSharedMemory(pgdata: string): void {
  let lines: string[];
  try {
    lines = readFileSync(join(pgdata, 'postmaster.pid'), 'utf8').split('\n');
  } catch {
    return;
  }
  // Line 7 of postmaster.pid: the segment's key and id.
  const shmid = lines[6]?.trim().split(/\s+/)[1];
  if (shmid && /^\d+$/.test(shmid)) spawnSync('ipcrm', ['-m', shmid], { stdio: 'ignore' });
}

async function own(path: string, runAs: RunAs): Promise<void> {
  if (runAs.uid !== undefined && runAs.gid !== undefined) await chown(path, runAs.uid, runAs.gid);
}

/** `count` different free ports (freePort may hand out the same one twice in a row). */
async function distinctFreePorts(count: number): Promise<number[]> {
  const ports = new Set<number>();
  while (ports.size < count) ports.add(await freePort());
  return [...ports];
}

function lastLines(text: string, n: number): string {
  return text.trimEnd().split('\n').slice(-n).join('\n');
}

/**
 * Runs a command to completion (as `runAs`), appending its output to `log` when given; rejects
 * with its output when it fails. `running` holds it while it runs.
 */
function run(
  command: string,
  args: string[],
  env: NodeJS.ProcessEnv,
  runAs: RunAs,
  log: string | undefined,
  running?: Set<ChildProcess>,
): Promise<{ stdout: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd: '/', env, stdio: ['ignore', 'pipe', 'pipe'], ...runAs });
    running?.add(child);
    let stdout = '';
    let output = '';
    child.stdout!.on('data', (chunk: Buffer) => {
      stdout += chunk.toString();
      output += chunk.toString();
    });
    child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), UP_TIMEOUT_MS);
    child.once('error', (e) => {
      clearTimeout(timer);
      running?.delete(child);
      reject(e);
    });
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      running?.delete(child);
      const logged = log ? appendFile(log, `$ ${command} ${args.join(' ')}\n${output}`) : Promise.resolve();
      void logged
        .catch(() => undefined)
        .then(() => {
          if (code === 0) resolve({ stdout });
          else
            reject(new Error(`${command} ${args.join(' ')}: ${signal ?? `exit ${code}`}\n${output.trim()}`));
        });
    });
  });
}

/** A session whose errors (its server going away) fail its next query rather than the process. */
async function connect(url: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 2_000 });
  client.on('error', () => undefined);
  try {
    await client.connect();
  } catch (e) {
    await client.end().catch(() => undefined);
    throw e;
  }
  return client;
}

/** One statement on a session of its own. */
async function query(url: string, text: string, values: unknown[] = []): Promise<pg.QueryResult> {
  const client = await connect(url);
  try {
    return await client.query(text, values);
  } finally {
    await client.end().catch(() => undefined);
  }
}

/** Whether a new session on `url` may write: out of recovery, and not read-only by default. */
async function writable(url: string): Promise<boolean> {
  try {
    const { rows } = await query(
      url,
      `SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off' AS ok`,
    );
    return rows[0].ok === true;
  } catch {
    return false;
  }
}

/**
 * Polls `check` every 100 ms (an error counts as not yet) until it holds; throws naming `what`
 * and the last error after `ms`, or at once when one of the pair's keepers has exited.
 */
async function until(
  what: string,
  ms: number,
  keepers: Map<string, Keeper>,
  check: () => Promise<boolean>,
): Promise<void> {
  const end = performance.now() + ms;
  let last: unknown;
  for (;;) {
    try {
      if (await check()) return;
    } catch (e) {
      last = e;
    }
    const dead = [...keepers.values()].find((k) => !alive(k.child));
    if (dead) {
      throw new Error(`${dead.name}'s pg_autoctl exited (${dead.child.signalCode ?? dead.child.exitCode})`);
    }
    if (performance.now() > end) {
      throw new Error(`not within ${ms} ms: ${what}${last ? ` (last: ${(last as Error).message})` : ''}`);
    }
    await sleep(100);
  }
}
