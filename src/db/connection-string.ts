/**
 * PostgreSQL connection URLs read as libpq reads them (`postgres://` or `postgresql://`):
 * several hosts (`h1:6001,h2:6002`, what `pg_autoctl show uri` prints), a port per host or
 * the default one, IPv6 addresses in brackets, percent-encoding in every part, a Unix socket
 * directory as a host (`?host=/var/run/postgresql`), and libpq's own query parameters.
 * node-postgres reads one host only and gives sslmode a meaning of its own, so ordo reads the
 * URL here and connects with multi-host-client.ts. Parsing is pure: files named by the URL
 * (certificates) are read when a pool is made (ssl-mode.ts).
 */
import { invalid } from '../validate.js';

export interface HostAddress {
  /** A name, an IP address (IPv6 without its brackets), or a Unix socket directory (starts with `/`). */
  host: string;
  port: number;
}

/**
 * Which sessions will do. libpq knows more (read-only, standby, prefer-standby); ordo writes on
 * every connection, so a URL asking for a standby is refused when it is read.
 */
export type TargetSessionAttrs = 'any' | 'read-write' | 'primary';

/** libpq's sslmode values, with libpq's meaning (ssl-mode.ts). */
export type SslMode = 'disable' | 'allow' | 'prefer' | 'require' | 'verify-ca' | 'verify-full';

export interface ConnectionTarget {
  /** In the order the URL gives them; tried in that order. */
  hosts: HostAddress[];
  user?: string;
  password?: string;
  database?: string;
  targetSessionAttrs: TargetSessionAttrs;
  /** Absent: node-postgres's own default (its reading of PGSSLMODE, else no TLS), as before. */
  sslmode?: SslMode;
  sslrootcert?: string;
  sslcert?: string;
  sslkey?: string;
  sslpassword?: string;
  /** libpq's connect_timeout: how long one host may take; absent, no limit of the URL's own. */
  connectTimeoutMs?: number;
  applicationName?: string;
  fallbackApplicationName?: string;
  /** Command-line options sent at startup (`-c search_path=app`). */
  options?: string;
  keepalives?: boolean;
  keepalivesIdleMs?: number;
  clientEncoding?: string;
}

export const DEFAULT_HOST = 'localhost';
export const DEFAULT_PORT = 5432;

/** The query parameters ordo reads; libpq's names. */
const PARAMETERS = [
  'host',
  'port',
  'dbname',
  'user',
  'password',
  'target_session_attrs',
  'sslmode',
  'sslrootcert',
  'sslcert',
  'sslkey',
  'sslpassword',
  'connect_timeout',
  'application_name',
  'fallback_application_name',
  'options',
  'keepalives',
  'keepalives_idle',
  'client_encoding',
] as const;
type Parameter = (typeof PARAMETERS)[number];
const KNOWN = new Set<string>(PARAMETERS);

const SSL_MODES: readonly SslMode[] = ['disable', 'allow', 'prefer', 'require', 'verify-ca', 'verify-full'];
const STANDBY_ATTRS = new Set(['read-only', 'standby', 'prefer-standby']);
const SCHEME = /^postgres(?:ql)?:\/\//;

/**
 * Reads a connection URL; `option` names it in messages (`databaseUrl`). Anything libpq would
 * refuse, and anything ordo cannot honour, is an `invalid_argument` saying what to change. No
 * message repeats the password.
 */
export function parseConnectionString(option: string, url: unknown): ConnectionTarget {
  if (typeof url !== 'string' || !SCHEME.test(url)) {
    // The value is not echoed: a URL may carry a password.
    throw invalid(`${option} must be a postgres:// or postgresql:// URL`);
  }
  const rest = url.replace(SCHEME, '');
  // The user part ends at the last "@" before the host list: a host has none, and a password
  // with an unencoded "@" is still read whole, as node-postgres reads it.
  const hostsEnd = firstOf(rest, '/?', 0);
  const at = rest.lastIndexOf('@', hostsEnd - 1);
  const values = new Map<Parameter, string>();
  if (at !== -1) {
    const userInfo = rest.slice(0, at);
    const colon = userInfo.indexOf(':');
    const user = decode(option, colon === -1 ? userInfo : userInfo.slice(0, colon), 'the user name');
    if (user !== '') values.set('user', user);
    if (colon !== -1) {
      const password = decode(option, userInfo.slice(colon + 1), 'the password');
      if (password !== '') values.set('password', password);
    }
  }
  const { hosts, ports } = hostList(option, rest.slice(at + 1, hostsEnd));
  values.set('host', hosts.join(','));
  // libpq sets port only when a host gave one; "h1:1,h2" is ports "1" and "" (the default).
  if (ports.some((p) => p !== '')) values.set('port', ports.join(','));
  let query = '';
  if (rest[hostsEnd] === '/') {
    const queryStart = rest.indexOf('?', hostsEnd);
    const path = rest.slice(hostsEnd + 1, queryStart === -1 ? undefined : queryStart);
    const database = decode(option, path, 'the database name');
    if (database !== '') values.set('dbname', database);
    if (queryStart !== -1) query = rest.slice(queryStart + 1);
  } else if (rest[hostsEnd] === '?') {
    query = rest.slice(hostsEnd + 1);
  }
  // Query parameters come last and replace what the URL's parts said, as in libpq.
  for (const [key, value] of queryParameters(option, query)) values.set(key, value);
  return target(option, values);
}

/** `host[:port]` entries separated by commas, IPv6 addresses in brackets; decoded. */
function hostList(option: string, spec: string): { hosts: string[]; ports: string[] } {
  const hosts: string[] = [];
  const ports: string[] = [];
  let i = 0;
  for (;;) {
    let host: string;
    if (spec[i] === '[') {
      const close = spec.indexOf(']', i);
      if (close === -1) {
        throw invalid(`${option}: an IPv6 address in the host list lacks its closing "]"; write it as [::1]`);
      }
      host = decode(option, spec.slice(i + 1, close), 'the host list');
      if (host === '')
        throw invalid(`${option}: the host list has empty brackets "[]"; put the IPv6 address in them`);
      i = close + 1;
    } else {
      const end = firstOf(spec, ':,', i);
      host = decode(option, spec.slice(i, end), 'the host list');
      i = end;
    }
    let port = '';
    if (spec[i] === ':') {
      const end = firstOf(spec, ',', i + 1);
      port = decode(option, spec.slice(i + 1, end), 'the host list');
      i = end;
    }
    if (i < spec.length && spec[i] !== ',') {
      throw invalid(
        `${option}: unexpected "${spec[i]}" after the host ${describeHost(host)}; ` +
          'a host is followed by ":port", "," and the next host, "/database" or "?parameters"',
      );
    }
    hosts.push(host);
    ports.push(port);
    if (i >= spec.length) return { hosts, ports };
    i++;
  }
}

function queryParameters(option: string, query: string): [Parameter, string][] {
  const parameters: [Parameter, string][] = [];
  // libpq allows one "&" at the very end.
  const pairs = query === '' ? [] : query.replace(/&$/, '').split('&');
  for (const pair of pairs) {
    if (pair === '')
      throw invalid(`${option}: the query has an empty parameter ("&&" or "?&"); remove the extra "&"`);
    const parts = pair.split('=');
    if (parts.length !== 2) {
      const what = parts.length < 2 ? 'has no "="' : 'has more than one "="';
      throw invalid(
        `${option}: the query parameter "${parts[0]}" ${what}; write each one as name=value, separated by "&" ` +
          '(percent-encode a "=" inside a value as %3D)',
      );
    }
    const key = decode(option, parts[0]!, 'a parameter name');
    const value = decode(option, parts[1]!, `the parameter ${key}`);
    if (key === 'ssl') {
      // libpq reads JDBC's ssl=true as sslmode=require.
      if (value !== 'true') {
        throw invalid(
          `${option}: ssl=${value} is not libpq's; write sslmode=disable, prefer, require or verify-full`,
        );
      }
      parameters.push(['sslmode', 'require']);
      continue;
    }
    if (!KNOWN.has(key)) throw invalid(unknownParameter(option, key));
    parameters.push([key as Parameter, value]);
  }
  return parameters;
}

function unknownParameter(option: string, key: string): string {
  const hint =
    key === 'hostaddr'
      ? 'put the address in the host list instead'
      : key === 'schema'
        ? "ordo's schema is the schema option (ORDO_SCHEMA), not a URL parameter"
        : `ordo reads these libpq parameters: ${PARAMETERS.join(', ')}`;
  return `${option}: the parameter "${key}" is not one ordo reads; ${hint}`;
}

function target(option: string, values: Map<Parameter, string>): ConnectionTarget {
  const hostNames = (values.get('host') ?? '').split(',');
  const portTexts = (values.get('port') ?? '').split(',');
  if (portTexts.length !== 1 && portTexts.length !== hostNames.length) {
    throw invalid(
      `${option} names ${hostNames.length} hosts and ${portTexts.length} ports; give one port for every host, or one for all`,
    );
  }
  const hosts = hostNames.map((name, i) => {
    const host = name === '' ? DEFAULT_HOST : name;
    const text = portTexts.length === 1 ? portTexts[0]! : portTexts[i]!;
    return { host, port: text === '' ? DEFAULT_PORT : port(option, text, host) };
  });
  const result: ConnectionTarget = {
    hosts,
    targetSessionAttrs: targetSessionAttrs(option, values.get('target_session_attrs') ?? 'any'),
  };
  const text = (key: Parameter) => values.get(key);
  result.user = text('user');
  result.password = text('password');
  result.database = text('dbname');
  const sslmode = text('sslmode');
  if (sslmode !== undefined) result.sslmode = sslMode(option, sslmode);
  result.sslrootcert = text('sslrootcert');
  result.sslcert = text('sslcert');
  result.sslkey = text('sslkey');
  result.sslpassword = text('sslpassword');
  const timeout = text('connect_timeout');
  if (timeout !== undefined) result.connectTimeoutMs = connectTimeout(option, timeout);
  result.applicationName = text('application_name');
  result.fallbackApplicationName = text('fallback_application_name');
  result.options = text('options');
  const keepalives = text('keepalives');
  if (keepalives !== undefined) result.keepalives = flag(option, 'keepalives', keepalives);
  const idle = text('keepalives_idle');
  if (idle !== undefined) result.keepalivesIdleMs = seconds(option, 'keepalives_idle', idle) * 1000;
  result.clientEncoding = text('client_encoding');
  for (const key of Object.keys(result) as (keyof ConnectionTarget)[]) {
    if (result[key] === undefined) delete result[key];
  }
  return result;
}

function port(option: string, text: string, host: string): number {
  const n = /^\d{1,5}$/.test(text) ? Number(text) : NaN;
  if (!(n >= 1 && n <= 65535)) {
    throw invalid(
      `${option}: the port of ${describeHost(host)} must be a number from 1 to 65535 (got "${text}")`,
    );
  }
  return n;
}

function targetSessionAttrs(option: string, value: string): TargetSessionAttrs {
  if (value === 'any' || value === 'read-write' || value === 'primary') return value;
  if (STANDBY_ATTRS.has(value)) {
    throw invalid(
      `${option}: target_session_attrs=${value} would connect ordo to a standby, but ordo writes on every ` +
        'connection and always needs the primary; write target_session_attrs=read-write or primary',
    );
  }
  throw invalid(`${option}: target_session_attrs must be any, read-write or primary (got "${value}")`);
}

function sslMode(option: string, value: string): SslMode {
  if ((SSL_MODES as readonly string[]).includes(value)) return value as SslMode;
  const hint =
    value === 'no-verify'
      ? " (node-postgres's no-verify is libpq's require: TLS, certificate not checked)"
      : '';
  throw invalid(`${option}: sslmode must be one of ${SSL_MODES.join(', ')} (got "${value}")${hint}`);
}

/** libpq: whole seconds; zero or less waits as long as it takes; 1 is raised to 2. */
function connectTimeout(option: string, value: string): number | undefined {
  if (!/^-?\d+$/.test(value.trim())) {
    throw invalid(`${option}: connect_timeout must be a whole number of seconds (got "${value}")`);
  }
  const s = Number(value);
  if (s <= 0) return undefined;
  return Math.max(s, 2) * 1000;
}

function seconds(option: string, name: string, value: string): number {
  if (!/^\d+$/.test(value.trim())) {
    throw invalid(`${option}: ${name} must be a whole number of seconds (got "${value}")`);
  }
  return Number(value);
}

function flag(option: string, name: string, value: string): boolean {
  if (value === '1') return true;
  if (value === '0') return false;
  throw invalid(`${option}: ${name} must be 1 or 0 (got "${value}")`);
}

/** libpq's percent-decoding: every "%" starts two hex digits, and %00 is refused. */
function decode(option: string, text: string, where: string): string {
  const bad = /%(?![0-9a-fA-F]{2})/.exec(text);
  if (bad) {
    throw invalid(
      `${option}: ${where} has a "%" that does not start a percent-encoded byte (%XX); write a literal "%" as %25`,
    );
  }
  if (/%00/.test(text)) throw invalid(`${option}: ${where} contains %00, which PostgreSQL cannot take`);
  try {
    return decodeURIComponent(text);
  } catch {
    throw invalid(`${option}: ${where} has percent-encoded bytes that are not UTF-8`);
  }
}

function firstOf(text: string, characters: string, from: number): number {
  for (let i = from; i < text.length; i++) if (characters.includes(text[i]!)) return i;
  return text.length;
}

/** How messages name a host: a socket directory with its port as libpq writes it, IPv6 in brackets. */
export function describeHost(host: string, port?: number): string {
  if (host.startsWith('/')) return port === undefined ? `"${host}"` : `"${host}" port ${port}`;
  const name = host.includes(':') ? `[${host}]` : host;
  return port === undefined ? name : `${name}:${port}`;
}
