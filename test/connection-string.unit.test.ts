/**
 * Connection URLs read as libpq reads them: every form, and every refusal with its message.
 * Refusals come before any connection, so createOrdo shows them with no server at all.
 */
import { describe, expect, it } from 'vitest';
import { parseConnectionString } from '../src/db/connection-string.js';
import { HostMemory } from '../src/db/multi-host-client.js';
import { tlsTries } from '../src/db/ssl-mode.js';
import { sessionRefusal } from '../src/db/target-session.js';
import { createOrdo, OrdoError } from '../src/index.js';

const parse = (url: string) => parseConnectionString('databaseUrl', url);

function refused(url: unknown, message: string): void {
  let error: unknown;
  try {
    parseConnectionString('databaseUrl', url);
  } catch (e) {
    error = e;
  }
  expect(error).toBeInstanceOf(OrdoError);
  expect((error as OrdoError).code).toBe('invalid_argument');
  expect((error as OrdoError).message).toBe(message);
}

describe('the forms libpq reads', () => {
  it('one host: user, password, port, database', () => {
    expect(parse('postgres://app:secret@db.example.com:6543/orders')).toEqual({
      hosts: [{ host: 'db.example.com', port: 6543 }],
      user: 'app',
      password: 'secret',
      database: 'orders',
      targetSessionAttrs: 'any',
    });
    expect(parse('postgresql://db.example.com/orders')).toEqual({
      hosts: [{ host: 'db.example.com', port: 5432 }],
      database: 'orders',
      targetSessionAttrs: 'any',
    });
  });

  it('several hosts, as pg_autoctl show uri prints them', () => {
    expect(
      parse(
        'postgres://autoctl@127.0.0.1:6001,127.0.0.1:6002/ordo?target_session_attrs=read-write&sslmode=prefer',
      ),
    ).toEqual({
      hosts: [
        { host: '127.0.0.1', port: 6001 },
        { host: '127.0.0.1', port: 6002 },
      ],
      user: 'autoctl',
      database: 'ordo',
      targetSessionAttrs: 'read-write',
      sslmode: 'prefer',
    });
  });

  it('a port per host, or the default one', () => {
    expect(parse('postgres://h1:6001,h2,h3:6003/db').hosts).toEqual([
      { host: 'h1', port: 6001 },
      { host: 'h2', port: 5432 },
      { host: 'h3', port: 6003 },
    ]);
    expect(parse('postgres://h1:,h2/db').hosts).toEqual([
      { host: 'h1', port: 5432 },
      { host: 'h2', port: 5432 },
    ]);
  });

  it('IPv6 addresses in brackets, a zone percent-encoded', () => {
    expect(parse('postgres://[::1]:6001,[fe80::1%25eth0],127.0.0.1/db').hosts).toEqual([
      { host: '::1', port: 6001 },
      { host: 'fe80::1%eth0', port: 5432 },
      { host: '127.0.0.1', port: 5432 },
    ]);
  });

  it('no host: localhost (what node-postgres connects to); no path, or a query right after the hosts', () => {
    expect(parse('postgres:///db').hosts).toEqual([{ host: 'localhost', port: 5432 }]);
    expect(parse('postgres://')).toEqual({
      hosts: [{ host: 'localhost', port: 5432 }],
      targetSessionAttrs: 'any',
    });
    expect(parse('postgres://h?sslmode=disable')).toEqual({
      hosts: [{ host: 'h', port: 5432 }],
      targetSessionAttrs: 'any',
      sslmode: 'disable',
    });
    expect(parse('postgres://,h2:7/db').hosts).toEqual([
      { host: 'localhost', port: 5432 },
      { host: 'h2', port: 7 },
    ]);
  });

  it('percent-decoding in every part; an unencoded "@" in the password is read whole', () => {
    expect(parse('postgres://us%65r:p%40ss%3Aw%2Fd@h/my%20db')).toMatchObject({
      user: 'user',
      password: 'p@ss:w/d',
      database: 'my db',
    });
    expect(parse('postgres://u:p@ss@h/db')).toMatchObject({
      user: 'u',
      password: 'p@ss',
      hosts: [{ host: 'h' }],
    });
    expect(parse('postgres://u:@h/db')).toEqual({
      hosts: [{ host: 'h', port: 5432 }],
      user: 'u',
      database: 'db',
      targetSessionAttrs: 'any',
    });
  });

  it('a Unix socket directory: in host=, or percent-encoded in the host list', () => {
    expect(parse('postgres://app@/db?host=/var/run/postgresql').hosts).toEqual([
      { host: '/var/run/postgresql', port: 5432 },
    ]);
    expect(parse('postgres://%2Fvar%2Frun%2Fpostgresql:5433,h2/db').hosts).toEqual([
      { host: '/var/run/postgresql', port: 5433 },
      { host: 'h2', port: 5432 },
    ]);
  });

  it('query parameters replace the parts of the URL, as in libpq', () => {
    expect(parse('postgres://u@ignored:1/d?host=a,b&port=6001,6002&user=v&password=w&dbname=e')).toEqual({
      hosts: [
        { host: 'a', port: 6001 },
        { host: 'b', port: 6002 },
      ],
      user: 'v',
      password: 'w',
      database: 'e',
      targetSessionAttrs: 'any',
    });
    // One port for every host.
    expect(parse('postgres:///d?host=a,b&port=7').hosts).toEqual([
      { host: 'a', port: 7 },
      { host: 'b', port: 7 },
    ]);
    // The last of a parameter given twice wins; one "&" may end the query.
    expect(parse('postgres://h/d?sslmode=disable&sslmode=require&').sslmode).toBe('require');
  });

  it('target_session_attrs any, read-write, primary', () => {
    for (const attrs of ['any', 'read-write', 'primary']) {
      expect(parse(`postgres://h/d?target_session_attrs=${attrs}`).targetSessionAttrs).toBe(attrs);
    }
  });

  it("every sslmode, and JDBC's ssl=true as libpq reads it (require)", () => {
    for (const mode of ['disable', 'allow', 'prefer', 'require', 'verify-ca', 'verify-full']) {
      expect(parse(`postgres://h/d?sslmode=${mode}`).sslmode).toBe(mode);
    }
    expect(parse('postgres://h/d?ssl=true').sslmode).toBe('require');
    expect(
      parse(
        'postgres://h/d?sslmode=verify-full&sslrootcert=%2Fetc%2Froot.crt&sslcert=c.crt&sslkey=c.key&sslpassword=pw',
      ),
    ).toMatchObject({ sslrootcert: '/etc/root.crt', sslcert: 'c.crt', sslkey: 'c.key', sslpassword: 'pw' });
  });

  it('connect_timeout in whole seconds, as libpq: 1 is 2, zero or less is no limit', () => {
    expect(parse('postgres://h/d?connect_timeout=10').connectTimeoutMs).toBe(10_000);
    expect(parse('postgres://h/d?connect_timeout=1').connectTimeoutMs).toBe(2_000);
    expect(parse('postgres://h/d?connect_timeout=0')).not.toHaveProperty('connectTimeoutMs');
    expect(parse('postgres://h/d?connect_timeout=-5')).not.toHaveProperty('connectTimeoutMs');
  });

  it('application_name, fallback_application_name, options, keepalives, client_encoding', () => {
    expect(
      parse(
        'postgres://h/d?application_name=billing%20api&fallback_application_name=fb' +
          '&options=-c%20search_path%3Dapp&keepalives=1&keepalives_idle=30&client_encoding=UTF8',
      ),
    ).toMatchObject({
      applicationName: 'billing api',
      fallbackApplicationName: 'fb',
      options: '-c search_path=app',
      keepalives: true,
      keepalivesIdleMs: 30_000,
      clientEncoding: 'UTF8',
    });
    expect(parse('postgres://h/d?keepalives=0').keepalives).toBe(false);
  });
});

describe('what is refused, and the message', () => {
  it('anything but a postgres:// or postgresql:// URL', () => {
    for (const url of ['mysql://u:secret@h/db', 'host=h dbname=d', ' postgres://h/db', 42, undefined]) {
      refused(url, 'databaseUrl must be a postgres:// or postgresql:// URL');
    }
  });

  it('a malformed host list', () => {
    refused(
      'postgres://[::1/db',
      'databaseUrl: an IPv6 address in the host list lacks its closing "]"; write it as [::1]',
    );
    refused(
      'postgres://[]:5432/db',
      'databaseUrl: the host list has empty brackets "[]"; put the IPv6 address in them',
    );
    refused(
      'postgres://[::1]x/db',
      'databaseUrl: unexpected "x" after the host [::1]; a host is followed by ":port", "," and the next host, "/database" or "?parameters"',
    );
    refused(
      'postgres://h1:6001:7/db',
      'databaseUrl: the port of h1 must be a number from 1 to 65535 (got "6001:7")',
    );
  });

  it('a port that is not one', () => {
    refused(
      'postgres://h1:abc/db',
      'databaseUrl: the port of h1 must be a number from 1 to 65535 (got "abc")',
    );
    refused(
      'postgres://h1,h2:0/db',
      'databaseUrl: the port of h2 must be a number from 1 to 65535 (got "0")',
    );
    refused(
      'postgres://[::1]:65536/db',
      'databaseUrl: the port of [::1] must be a number from 1 to 65535 (got "65536")',
    );
    refused(
      'postgres:///db?host=/tmp&port=x',
      'databaseUrl: the port of "/tmp" must be a number from 1 to 65535 (got "x")',
    );
  });

  it('as many ports as hosts, or one', () => {
    refused(
      'postgres:///db?host=a,b,c&port=1,2',
      'databaseUrl names 3 hosts and 2 ports; give one port for every host, or one for all',
    );
    refused(
      'postgres://a:1,b:2/db?port=1,2,3',
      'databaseUrl names 2 hosts and 3 ports; give one port for every host, or one for all',
    );
  });

  it('bad percent-encoding, never echoing the password', () => {
    refused(
      'postgres://u:se%zzcret@h/db',
      'databaseUrl: the password has a "%" that does not start a percent-encoded byte (%XX); write a literal "%" as %25',
    );
    refused(
      'postgres://h/50%',
      'databaseUrl: the database name has a "%" that does not start a percent-encoded byte (%XX); write a literal "%" as %25',
    );
    refused(
      'postgres://u:se%00cret@h/db',
      'databaseUrl: the password contains %00, which PostgreSQL cannot take',
    );
    refused(
      'postgres://h/db?application_name=%C3%28',
      'databaseUrl: the parameter application_name has percent-encoded bytes that are not UTF-8',
    );
  });

  it('a query parameter without one "="', () => {
    const hint =
      'write each one as name=value, separated by "&" (percent-encode a "=" inside a value as %3D)';
    refused('postgres://h/db?sslmode', `databaseUrl: the query parameter "sslmode" has no "="; ${hint}`);
    refused(
      'postgres://h/db?sslmode=disable&&user=u',
      'databaseUrl: the query has an empty parameter ("&&" or "?&"); remove the extra "&"',
    );
    refused(
      'postgres://h/db?options=-c%20a=b',
      `databaseUrl: the query parameter "options" has more than one "="; ${hint}`,
    );
  });

  it('a parameter ordo does not read', () => {
    refused(
      'postgres://h/db?statement_timeout=5',
      'databaseUrl: the parameter "statement_timeout" is not one ordo reads; ordo reads these libpq parameters: ' +
        'host, port, dbname, user, password, target_session_attrs, sslmode, sslrootcert, sslcert, sslkey, ' +
        'sslpassword, connect_timeout, application_name, fallback_application_name, options, keepalives, ' +
        'keepalives_idle, client_encoding',
    );
    refused(
      'postgres://h/db?hostaddr=10.0.0.1',
      'databaseUrl: the parameter "hostaddr" is not one ordo reads; put the address in the host list instead',
    );
    refused(
      'postgres://h/db?schema=public',
      'databaseUrl: the parameter "schema" is not one ordo reads; ordo\'s schema is the schema option (ORDO_SCHEMA), not a URL parameter',
    );
    refused(
      'postgres://h/db?ssl=false',
      "databaseUrl: ssl=false is not libpq's; write sslmode=disable, prefer, require or verify-full",
    );
  });

  it('target_session_attrs asking for a standby: ordo always needs the primary', () => {
    for (const attrs of ['read-only', 'standby', 'prefer-standby']) {
      refused(
        `postgres://h1,h2/db?target_session_attrs=${attrs}`,
        `databaseUrl: target_session_attrs=${attrs} would connect ordo to a standby, but ordo writes on every ` +
          'connection and always needs the primary; write target_session_attrs=read-write or primary',
      );
    }
    refused(
      'postgres://h/db?target_session_attrs=readwrite',
      'databaseUrl: target_session_attrs must be any, read-write or primary (got "readwrite")',
    );
  });

  it('an sslmode libpq does not know', () => {
    refused(
      'postgres://h/db?sslmode=no-verify',
      'databaseUrl: sslmode must be one of disable, allow, prefer, require, verify-ca, verify-full (got "no-verify")' +
        " (node-postgres's no-verify is libpq's require: TLS, certificate not checked)",
    );
    refused(
      'postgres://h/db?sslmode=on',
      'databaseUrl: sslmode must be one of disable, allow, prefer, require, verify-ca, verify-full (got "on")',
    );
  });

  it('numbers that are not', () => {
    refused(
      'postgres://h/db?connect_timeout=5s',
      'databaseUrl: connect_timeout must be a whole number of seconds (got "5s")',
    );
    refused('postgres://h/db?keepalives=yes', 'databaseUrl: keepalives must be 1 or 0 (got "yes")');
    refused(
      'postgres://h/db?keepalives_idle=-1',
      'databaseUrl: keepalives_idle must be a whole number of seconds (got "-1")',
    );
  });

  it('createOrdo refuses them before connecting, for databaseUrl and listenUrl, naming which', async () => {
    const standby = createOrdo({ databaseUrl: 'postgres://h1,h2/db?target_session_attrs=standby' });
    await expect(standby).rejects.toMatchObject({
      code: 'invalid_argument',
      message: expect.stringMatching(/^databaseUrl: target_session_attrs=standby/),
    });
    const listen = createOrdo({ databaseUrl: 'postgres://h/db', listenUrl: 'postgres://h:x/db' });
    await expect(listen).rejects.toMatchObject({
      code: 'invalid_argument',
      message: 'listenUrl: the port of h must be a number from 1 to 65535 (got "x")',
    });
    const system = createOrdo({ databaseUrl: 'postgres://h/db?sslmode=require&sslrootcert=system' });
    await expect(system).rejects.toMatchObject({
      code: 'invalid_argument',
      message: 'databaseUrl: sslrootcert=system needs sslmode=verify-full (got sslmode=require)',
    });
  });
});

describe('sslmode as TLS tries on each host (libpq order)', () => {
  const tries = (query: string) => tlsTries('databaseUrl', parse(`postgres://h/d${query}`));

  it('none given: node-postgres decides; disable: plain', () => {
    expect(tries('')).toEqual([undefined]);
    expect(tries('?sslmode=disable')).toEqual([false]);
  });

  it('allow: plain, then TLS; prefer: TLS, then plain; require: TLS; no certificate checked', () => {
    expect(tries('?sslmode=allow')).toEqual([false, { rejectUnauthorized: false }]);
    expect(tries('?sslmode=prefer')).toEqual([{ rejectUnauthorized: false }, false]);
    expect(tries('?sslmode=require')).toEqual([{ rejectUnauthorized: false }]);
  });

  it('verify-ca checks the chain and not the name; verify-full both', () => {
    const [ca] = tries('?sslmode=verify-ca');
    expect(ca).toMatchObject({ rejectUnauthorized: true });
    expect((ca as { checkServerIdentity: () => unknown }).checkServerIdentity()).toBeUndefined();
    expect(tries('?sslmode=verify-full')).toEqual([{ rejectUnauthorized: true }]);
    expect(tries('?sslmode=verify-full&sslrootcert=system')).toEqual([{ rejectUnauthorized: true }]);
  });
});

describe('target_session_attrs on a new session (libpq rules)', () => {
  const never = async () => {
    throw new Error('asked the server although it reported');
  };
  const reported = (entries: Record<string, string>) => new Map(Object.entries(entries));

  it('any: every session', async () => {
    expect(await sessionRefusal('any', reported({ in_hot_standby: 'on' }), never)).toBeUndefined();
  });

  it('read-write, from what PostgreSQL 14+ reports at startup', async () => {
    const writable = reported({ default_transaction_read_only: 'off', in_hot_standby: 'off' });
    expect(await sessionRefusal('read-write', writable, never)).toBeUndefined();
    for (const state of [
      { default_transaction_read_only: 'on', in_hot_standby: 'off' },
      { default_transaction_read_only: 'off', in_hot_standby: 'on' },
    ]) {
      expect(await sessionRefusal('read-write', reported(state), never)).toBe('session is read-only');
    }
  });

  it('read-write without reports (an older server, a pooler): SHOW transaction_read_only', async () => {
    const asked: string[] = [];
    const answer = (value: string) => async (sql: string) => (asked.push(sql), value);
    expect(await sessionRefusal('read-write', reported({ in_hot_standby: 'off' }), answer('on'))).toBe(
      'session is read-only',
    );
    expect(await sessionRefusal('read-write', reported({}), answer('off'))).toBeUndefined();
    expect(asked).toEqual(['SHOW transaction_read_only', 'SHOW transaction_read_only']);
  });

  it('primary: in_hot_standby, else pg_is_in_recovery()', async () => {
    expect(await sessionRefusal('primary', reported({ in_hot_standby: 'on' }), never)).toBe(
      'server is in hot standby mode',
    );
    // A primary that is read-only is still a primary.
    expect(
      await sessionRefusal(
        'primary',
        reported({ in_hot_standby: 'off', default_transaction_read_only: 'on' }),
        never,
      ),
    ).toBeUndefined();
    const asked: string[] = [];
    expect(await sessionRefusal('primary', reported({}), async (sql) => (asked.push(sql), true))).toBe(
      'server is in hot standby mode',
    );
    expect(await sessionRefusal('primary', reported({}), async () => false)).toBeUndefined();
    expect(asked).toEqual(['SELECT pg_catalog.pg_is_in_recovery()']);
  });
});

describe('the host tried first', () => {
  it('the URL order, then the host of the last accepted session first, until forgotten', () => {
    const { hosts } = parse('postgres://a,b,c/d');
    const memory = new HostMemory(hosts);
    expect(memory.order().map((h) => h.host)).toEqual(['a', 'b', 'c']);
    memory.remember(hosts[2]!);
    expect(memory.order().map((h) => h.host)).toEqual(['c', 'a', 'b']);
    expect(memory.last).toBe(hosts[2]);
    memory.forget();
    expect(memory.order().map((h) => h.host)).toEqual(['a', 'b', 'c']);
  });
});
