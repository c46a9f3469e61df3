// What the tests (and a benchmark) run for real from Debian's packages, beside Node and
// PostgreSQL: installed by the test set-up when missing, so that `npm test` alone works on a
// fresh machine; `npm run bench -- http` installs its own the same way.
import { execFileSync } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { join } from 'node:path';

/** A program a test runs, where it looks for it, and the Debian package that provides it. */
interface SystemProgram {
  path: string;
  debianPackage: string;
  usedBy: string;
  /**
   * A file that a server loads rather than a program (a PostgreSQL extension's library, which
   * Debian installs without execute bits): it need only be readable.
   */
  loaded?: true;
}

const PG_BINDIR = process.env.PG_BINDIR ?? '/usr/lib/postgresql/15/bin';

/** Paths may be moved with the variables the tests read them from. */
export const SYSTEM_PROGRAMS: SystemProgram[] = [
  {
    path: process.env.PGBOUNCER ?? '/usr/sbin/pgbouncer',
    debianPackage: 'pgbouncer',
    usedBy: 'test/pgbouncer.int.test.ts',
  },
  {
    path: process.env.ORDO_TEST_CHROMIUM ?? '/usr/bin/chromium',
    debianPackage: 'chromium',
    usedBy: 'test/dashboard.int.test.ts',
  },
  {
    path: join(PG_BINDIR, 'initdb'),
    debianPackage: 'postgresql-15',
    usedBy: 'servers of a test file its own (test/support/restartable-postgres.ts)',
  },
  {
    path: process.env.ORDO_TEST_RABBITMQ_SERVER ?? '/usr/lib/rabbitmq/bin/rabbitmq-server',
    debianPackage: 'rabbitmq-server',
    usedBy: 'RabbitMQ nodes of a test its own (test/support/broker-servers.ts)',
  },
  { path: '/usr/sbin/nats-server', debianPackage: 'nats-server', usedBy: 'test/support/broker-servers.ts' },
  { path: '/usr/bin/redis-server', debianPackage: 'redis-server', usedBy: 'test/support/broker-servers.ts' },
  { path: '/usr/sbin/mosquitto', debianPackage: 'mosquitto', usedBy: 'test/support/broker-servers.ts' },
  {
    path: process.env.PG_AUTOCTL ?? '/usr/bin/pg_autoctl',
    debianPackage: 'pg-auto-failover-cli',
    usedBy: 'failover pairs (test/support/failover-pair.ts)',
  },
  {
    // The monitor's extension, in the library folder beside PG_BINDIR's PostgreSQL.
    path: join(PG_BINDIR, '..', 'lib', 'pgautofailover.so'),
    debianPackage: 'postgresql-15-auto-failover',
    usedBy: 'failover pairs (test/support/failover-pair.ts)',
    loaded: true,
  },
  {
    path: process.env.WRK ?? '/usr/bin/wrk',
    debianPackage: 'wrk',
    usedBy: 'the HTTP load of bench/http.ts',
  },
];

function installed(p: SystemProgram): boolean {
  try {
    accessSync(p.path, p.loaded ? constants.R_OK : constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/**
 * Installs the missing programs (those of the Debian packages named, or all) with apt-get,
 * quietly and once, when running as root; otherwise throws one line naming the command to run.
 */
export function ensureSystemPrograms(
  log: (line: string) => void = () => undefined,
  debianPackages?: readonly string[],
): void {
  const missing = SYSTEM_PROGRAMS.filter(
    (p) => (debianPackages === undefined || debianPackages.includes(p.debianPackage)) && !installed(p),
  );
  if (missing.length === 0) return;
  const packages = [...new Set(missing.map((p) => p.debianPackage))];
  const command = `apt-get update && apt-get install -y ${packages.join(' ')}`;
  if (process.getuid?.() !== 0) {
    throw new Error(`The tests need ${packages.join(', ')} from Debian's packages; run as root: ${command}`);
  }
  log(
    `ordo tests: installing ${packages.join(', ')} from Debian's packages (${missing.map((p) => p.usedBy).join('; ')})`,
  );
  try {
    aptGet(['update', '-qq']);
    aptGet(['install', '-y', '-qq', ...packages]);
  } catch (e) {
    const stderr = (e as { stderr?: Buffer }).stderr?.toString().trim();
    throw new Error(`Installing ${packages.join(', ')} failed (${stderr || String(e)}); run: ${command}`, {
      cause: e,
    });
  }
  const still = missing.filter((p) => !installed(p));
  if (still.length > 0) {
    throw new Error(
      `${still.map((p) => p.path).join(', ')} still missing after apt-get install ${packages.join(' ')}`,
    );
  }
}

/** How long apt-get waits for another run that holds its locks. */
const LOCK_WAIT_MS = 300_000;

/**
 * apt-get, waiting while another test run installs at the same moment: DPkg::Lock::Timeout
 * waits for dpkg's lock, but `update` fails at once on the lock of the package lists, so that
 * failure is tried again every 2 s.
 */
function aptGet(args: string[]): void {
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  const deadline = Date.now() + LOCK_WAIT_MS;
  for (;;) {
    try {
      execFileSync('apt-get', ['-o', `DPkg::Lock::Timeout=${LOCK_WAIT_MS / 1000}`, ...args], {
        env,
        stdio: ['ignore', 'ignore', 'pipe'],
      });
      return;
    } catch (e) {
      const stderr = (e as { stderr?: Buffer }).stderr?.toString() ?? '';
      if (!/Could not get lock/.test(stderr) || Date.now() > deadline) throw e;
      execFileSync('sleep', ['2']);
    }
  }
}
