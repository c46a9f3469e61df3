/**
 * Connection strings with several hosts, as libpq and `pg_autoctl show uri` write them: every
 * new connection tries the hosts in turn and keeps the first session target_session_attrs
 * accepts. Servers of the test's own: a primary, a hot standby of it, and a server with TLS.
 */
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { type AddressInfo, createServer } from 'node:net';
import { chmod, chown, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConnectionString } from '../src/db/connection-string.js';
import { freePort } from '../src/db/embedded.js';
import { currentHost, hostMemoryOf, multiHostConfig } from '../src/db/multi-host-client.js';
import { createOrdo, type Ordo, OrdoError } from '../src/index.js';
import {
  postgresUser,
  type RestartablePostgres,
  restartablePostgres,
} from './support/restartable-postgres.js';
import { type Standby, standbyOf } from './support/standby.js';

let primary: RestartablePostgres;
let standby: Standby;
/** Ports nobody listens on. */
let dead: number;
let dead2: number;
/** A folder for the primary's (and its standby's) Unix sockets. */
let socketDir: string;

beforeAll(async () => {
  socketDir = await ownedFolder('ordo-sockets-');
  primary = await restartablePostgres({ unix_socket_directories: socketDir });
  standby = await standbyOf(primary);
  dead = await freePort();
  do dead2 = await freePort();
  while (dead2 === dead);
}, 120_000);

afterAll(async () => {
  await standby?.cleanup();
  await primary?.cleanup();
  if (socketDir) await rm(socketDir, { recursive: true, force: true });
});

const at = (ports: number[], query = '') =>
  `postgres://postgres@${ports.map((p) => `127.0.0.1:${p}`).join(',')}/postgres${query}`;

/** Runs `fn` with an ordo on `databaseUrl`, closed after. */
async function withOrdo<T>(databaseUrl: string, fn: (ordo: Ordo) => Promise<T>): Promise<T> {
  const ordo = await createOrdo({ databaseUrl, connectTimeout: '5s' });
  try {
    return await fn(ordo);
  } finally {
    await ordo.close();
  }
}

/** The port and TLS of the server session a transaction of ordo's runs on. */
async function session(ordo: Ordo): Promise<{ port: number; ssl: boolean }> {
  return ordo.transaction(async (tx) => {
    const { rows } = await tx.query(
      'SELECT inet_server_port() AS port, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()',
    );
    return { port: rows[0].port, ssl: rows[0].ssl };
  });
}

async function refusal(databaseUrl: string): Promise<OrdoError> {
  const error = await createOrdo({ databaseUrl, connectTimeout: '5s' }).then(
    async (ordo) => {
      await ordo.close();
      throw new Error('ordo connected');
    },
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(OrdoError);
  return error as OrdoError;
}

describe('several hosts, the standby first', () => {
  it('target_session_attrs=read-write: ordo works on the primary (sequences, outbox, LISTEN)', async () => {
    await withOrdo(at([standby.port, primary.port], '?target_session_attrs=read-write'), async (ordo) => {
      expect(ordo.database).toMatchObject({
        kind: 'url',
        host: '127.0.0.1',
        port: standby.port,
        hosts: [
          { host: '127.0.0.1', port: standby.port },
          { host: '127.0.0.1', port: primary.port },
        ],
        database: 'postgres',
        user: 'postgres',
      });
      expect((await session(ordo)).port).toBe(primary.port);
      await ordo.sequences.define({ name: 'mh_invoice', kind: 'gapless', ifNotExists: true });
      const first = (await ordo.sequences.next('mh_invoice')).value;
      expect((await ordo.sequences.next('mh_invoice')).value).toBe(first + 1);
      const [appended] = await ordo.outbox.append('multi-host', { type: 'Tick', data: { n: 1 } });
      expect(appended!.position).toBeTypeOf('number');
      // LISTEN is refused on a standby: arriving notifications prove the primary.
      expect(await ordo.notifications()).toMatchObject({ route: 'database', state: 'ok' });
    });
  });

  it('target_session_attrs=primary: the same', async () => {
    await withOrdo(at([standby.port, primary.port], '?target_session_attrs=primary'), async (ordo) => {
      expect((await session(ordo)).port).toBe(primary.port);
      expect(await ordo.nextval('mh_batched').catch((e: OrdoError) => e.code)).toBe('sequence_not_found');
    });
  });

  it('the host that gave the last session is tried first: the standby sees one try, not one per connection', async () => {
    const sessionsOnStandby = async () =>
      (
        (await standby.log()).match(
          /connection authorized: user=postgres database=postgres application_name=ordo\b/g,
        ) ?? []
      ).length;
    const before = await sessionsOnStandby();
    await withOrdo(at([standby.port, primary.port], '?target_session_attrs=read-write'), async (ordo) => {
      // Six transactions at once: the pool opens new connections for them.
      const ports = await Promise.all(Array.from({ length: 6 }, () => session(ordo)));
      expect(ports.map((s) => s.port)).toEqual(Array(6).fill(primary.port));
      await ordo.notifications();
    });
    // The standby's log is written by its own process: a moment for the last line.
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect((await sessionsOnStandby()) - before).toBe(1);
  });
});

describe('for failover: which host gives the session now', () => {
  it('asked of a pool, with the remembered host forgotten or not', async () => {
    const url = at([standby.port, primary.port], '?target_session_attrs=read-write');
    const pool = new pg.Pool(
      multiHostConfig('databaseUrl', parseConnectionString('databaseUrl', url), {
        connectionTimeoutMillis: 5_000,
      }),
    );
    try {
      const memory = hostMemoryOf(pool)!;
      expect(memory.last).toBeUndefined();
      expect(await currentHost(pool)).toEqual({ host: '127.0.0.1', port: primary.port });
      expect(memory.last).toEqual({ host: '127.0.0.1', port: primary.port });
      memory.forget();
      expect(memory.order().map((h) => h.port)).toEqual([standby.port, primary.port]);
      const { rows } = await pool.query('SELECT inet_server_port() AS port');
      expect(rows[0].port).toBe(primary.port);
      expect(hostMemoryOf(new pg.Pool())).toBeUndefined();
    } finally {
      await pool.end();
    }
  });
});

describe('hosts that do not answer', () => {
  it('a dead host first (and an IPv6 address in brackets): the next host is used', async () => {
    await withOrdo(at([dead, primary.port]), async (ordo) => {
      expect((await session(ordo)).port).toBe(primary.port);
    });
    const url = `postgres://postgres@[::1]:${dead},127.0.0.1:${dead},127.0.0.1:${primary.port}/postgres?target_session_attrs=read-write`;
    await withOrdo(url, async (ordo) => {
      expect(ordo.database).toMatchObject({ host: '::1', port: dead });
      expect(await ordo.nextval('mh_batched').catch((e: OrdoError) => e.code)).toBe('sequence_not_found');
    });
  });

  it('a host that accepts and never answers: connect_timeout moves on; without it, connectTimeout ends the search', async () => {
    const silent = createServer(() => undefined);
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    const port = (silent.address() as AddressInfo).port;
    try {
      const started = performance.now();
      await withOrdo(at([port, primary.port], '?connect_timeout=2'), async (ordo) => {
        expect((await session(ordo)).port).toBe(primary.port);
      });
      expect(performance.now() - started).toBeGreaterThanOrEqual(2_000);
      const error = await createOrdo({ databaseUrl: at([port, primary.port]), connectTimeout: '1s' }).then(
        (ordo) => ordo.close().then(() => undefined),
        (e: unknown) => e as OrdoError,
      );
      expect(error).toBeInstanceOf(OrdoError);
      expect(error!.code).toBe('database_unavailable');
      // The pool says its connectTimeout ran out; the hosts tried, and the one not tried, are its cause.
      const cause = (error!.cause as Error).cause as Error;
      // The silent host's try is cut by its own timer or by the pool's, whichever fires first.
      expect(cause.message).toMatch(
        new RegExp(
          `^no host of databaseUrl could be connected to: 127\\.0\\.0\\.1:${port} \\((timeout expired|Connection terminated unexpectedly)\\), ` +
            // Not tried, or (when the pool's timer fired a moment early) given the moment left.
            `127\\.0\\.0\\.1:${primary.port} \\((not tried: connectTimeout ran out|timeout expired)\\)$`,
        ),
      );
    } finally {
      silent.close();
    }
  });

  it('only the standby: database_unavailable, its cause naming every host tried and why', async () => {
    const readWrite = await refusal(at([standby.port], '?target_session_attrs=read-write'));
    expect(readWrite.code).toBe('database_unavailable');
    // The message a client may be shown names no host; the cause does, for the logs.
    expect(readWrite.message).toBe('PostgreSQL cannot be reached (08001); retry later');
    expect((readWrite.cause as Error).message).toContain(
      `no host of databaseUrl accepted a read-write session: 127.0.0.1:${standby.port} (session is read-only)`,
    );
    const both = await refusal(at([dead, standby.port], '?target_session_attrs=primary'));
    expect(both.code).toBe('database_unavailable');
    expect((both.cause as Error).message).toContain(
      `no host of databaseUrl is a primary: 127.0.0.1:${dead} (ECONNREFUSED), ` +
        `127.0.0.1:${standby.port} (server is in hot standby mode)`,
    );
  });

  it('no host answers at all: database_unavailable, its cause naming each', async () => {
    const error = await refusal(at([dead, dead2]));
    expect(error.code).toBe('database_unavailable');
    expect((error.cause as Error).message).toContain(
      `no host of databaseUrl could be connected to: 127.0.0.1:${dead} (ECONNREFUSED), 127.0.0.1:${dead2} (ECONNREFUSED)`,
    );
  });
});

describe('a Unix socket directory as the host', () => {
  it('in the host= parameter, or percent-encoded in the host list', async () => {
    const viaParameter = `postgres://postgres@/postgres?host=${encodeURIComponent(socketDir)}&port=${primary.port}`;
    await withOrdo(viaParameter, async (ordo) => {
      expect(ordo.database).toMatchObject({ host: socketDir, port: primary.port });
      expect((await session(ordo)).port).toBeNull(); // no TCP port: a Unix socket session
    });
    const inList = `postgres://postgres@${encodeURIComponent(socketDir)}:${standby.port},${encodeURIComponent(socketDir)}:${primary.port}/postgres?target_session_attrs=read-write`;
    await withOrdo(inList, async (ordo) => {
      expect(await ordo.notifications()).toMatchObject({ state: 'ok' });
    });
  });
});

describe('sslmode, as libpq reads it', () => {
  let tls: RestartablePostgres;
  let certs: string;

  beforeAll(async () => {
    certs = await ownedFolder('ordo-certs-');
    makeCertificates(certs);
    tls = await restartablePostgres({
      ssl: 'on',
      ssl_cert_file: join(certs, 'server.crt'),
      ssl_key_file: join(certs, 'server.key'),
    });
  }, 120_000);

  afterAll(async () => {
    await tls?.cleanup();
    if (certs) await rm(certs, { recursive: true, force: true });
  });

  it('prefer against a server without TLS: a plain session (node-postgres alone fails)', async () => {
    await withOrdo(at([primary.port], '?sslmode=prefer'), async (ordo) => {
      expect(await session(ordo)).toEqual({ port: primary.port, ssl: false });
    });
    await withOrdo(
      at([standby.port, primary.port], '?target_session_attrs=read-write&sslmode=prefer'),
      async (ordo) => {
        expect(await session(ordo)).toEqual({ port: primary.port, ssl: false });
      },
    );
  });

  it('prefer against a server with TLS: a TLS session, its certificate not checked', async () => {
    await withOrdo(at([tls.port], '?sslmode=prefer'), async (ordo) => {
      expect(await session(ordo)).toEqual({ port: tls.port, ssl: true });
    });
  });

  it('disable and allow: plain; require: TLS without checking the certificate', async () => {
    for (const mode of ['disable', 'allow']) {
      await withOrdo(at([tls.port], `?sslmode=${mode}`), async (ordo) => {
        expect((await session(ordo)).ssl).toBe(false);
      });
    }
    await withOrdo(at([tls.port], '?sslmode=require'), async (ordo) => {
      expect((await session(ordo)).ssl).toBe(true);
    });
  });

  it('require against a server without TLS is refused', async () => {
    const error = await refusal(at([primary.port], '?sslmode=require'));
    expect(error.message).toMatch(/SSL/);
  });

  it('verify-ca checks the chain, verify-full the name too', async () => {
    const root = `sslrootcert=${encodeURIComponent(join(certs, 'ca.crt'))}`;
    // The certificate names 127.0.0.1, signed by a CA of the test's own.
    await withOrdo(at([tls.port], `?sslmode=verify-full&${root}`), async (ordo) => {
      expect((await session(ordo)).ssl).toBe(true);
    });
    const byName = `postgres://postgres@localhost:${tls.port}/postgres`;
    await withOrdo(`${byName}?sslmode=verify-ca&${root}`, async (ordo) => {
      expect((await session(ordo)).ssl).toBe(true);
    });
    // require with a root certificate checks as verify-ca does.
    await withOrdo(`${byName}?sslmode=require&${root}`, async (ordo) => {
      expect((await session(ordo)).ssl).toBe(true);
    });
    expect((await refusal(`${byName}?sslmode=verify-full&${root}`)).message).toMatch(/localhost/);
    expect((await refusal(at([tls.port], '?sslmode=verify-full'))).message).toMatch(/certificate/);
  });

  it('a root certificate that cannot be read: invalid_argument before any connection', async () => {
    const error = await refusal(at([tls.port], '?sslmode=verify-full&sslrootcert=/nonexistent/root.crt'));
    expect(error.code).toBe('invalid_argument');
    expect(error.message).toBe(
      'databaseUrl: sslrootcert names "/nonexistent/root.crt", which cannot be read (ENOENT)',
    );
  });
});

// Last: it turns the primary read-only for a while.
describe('a server that becomes read-only', () => {
  /** One statement on the primary, on a session of its own (killBackends ends every other). */
  const onPrimary = async (sql: string) => {
    const admin = new pg.Client({ connectionString: primary.url });
    await admin.connect();
    try {
      await admin.query(sql);
    } finally {
      await admin.end();
    }
  };
  const readOnly = async (on: boolean) => {
    await onPrimary(
      on
        ? 'ALTER SYSTEM SET default_transaction_read_only = on'
        : 'ALTER SYSTEM RESET default_transaction_read_only',
    );
    await onPrimary('SELECT pg_reload_conf()');
  };

  it('is refused on the next new connection, and taken again once writable', async () => {
    try {
      await withOrdo(at([primary.port], '?target_session_attrs=read-write'), async (ordo) => {
        await ordo.ping();
        await readOnly(true);
        // Every session ends: ordo's next call needs a new connection.
        await primary.killBackends();
        const error = await ordo.ping().catch((e: unknown) => e as OrdoError);
        expect(error).toBeInstanceOf(OrdoError);
        expect((error as OrdoError).code).toBe('database_unavailable');
        expect(((error as OrdoError).cause as Error).message).toContain(
          `127.0.0.1:${primary.port} (session is read-only)`,
        );
        expect((await refusal(at([primary.port], '?target_session_attrs=read-write'))).code).toBe(
          'database_unavailable',
        );
        await readOnly(false);
        await expect(ordo.ping()).resolves.toBeTypeOf('number');
      });
    } finally {
      await readOnly(false);
    }
  });
});

/** A temporary folder the server's user (postgres, when tests run as root) owns. */
async function ownedFolder(prefix: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), prefix));
  await chmod(dir, 0o755);
  if (userInfo().uid === 0) {
    const { uid, gid } = postgresUser();
    await chown(dir, uid, gid);
  }
  return dir;
}

/** A CA of the test's own, and a server certificate it signed for 127.0.0.1 (and no name). */
function makeCertificates(dir: string): void {
  const openssl = (...args: string[]) => execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  openssl(
    'req',
    '-x509',
    ...ec,
    '-keyout',
    'ca.key',
    '-out',
    'ca.crt',
    '-days',
    '2',
    '-subj',
    '/CN=ordo test CA',
  );
  openssl('req', ...ec, '-keyout', 'server.key', '-out', 'server.csr', '-subj', '/CN=ordo test server');
  writeFileSync(join(dir, 'san.ext'), 'subjectAltName=IP:127.0.0.1\n');
  openssl(
    'x509',
    '-req',
    '-in',
    'server.csr',
    '-CA',
    'ca.crt',
    '-CAkey',
    'ca.key',
    '-CAcreateserial',
    '-out',
    'server.crt',
    '-days',
    '2',
    '-extfile',
    'san.ext',
  );
  // PostgreSQL refuses a key others can read; the server runs as postgres when tests run as root.
  execFileSync('chmod', ['600', join(dir, 'server.key')]);
  if (userInfo().uid === 0) {
    const { uid, gid } = postgresUser();
    for (const file of ['server.key', 'server.crt', 'ca.crt'])
      execFileSync('chown', [`${uid}:${gid}`, join(dir, file)]);
  }
}
