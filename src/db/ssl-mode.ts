/**
 * What libpq's sslmode means, as the TLS settings node-postgres takes: node-postgres reads
 * `sslmode=prefer` and `require` as "TLS, certificate verified" and never falls back to a plain
 * session, so `prefer` fails against a server without TLS. Here each mode is a list of tries on
 * one host, in libpq's order; the client (multi-host-client.ts) moves to the next try when the
 * server answered but the session failed.
 */
import { readFileSync } from 'node:fs';
import type { ConnectionOptions } from 'node:tls';
import { invalid } from '../validate.js';
import type { ConnectionTarget } from './connection-string.js';

/** `false`: plain; options: TLS with them; `undefined`: node-postgres decides (no sslmode given). */
export type TlsTry = false | ConnectionOptions | undefined;

/**
 * - disable: plain.
 * - allow: plain, then TLS (certificate not checked) when the server refused the plain session.
 * - prefer: TLS (certificate not checked), then plain when the server refuses TLS or the TLS
 *   session fails.
 * - require: TLS, certificate not checked; with sslrootcert, checked as in verify-ca.
 * - verify-ca: TLS, the certificate must chain to sslrootcert (without it, to the CAs Node
 *   trusts; libpq would look for ~/.postgresql/root.crt); its name is not checked.
 * - verify-full: as verify-ca, and the certificate must name the host.
 * Certificate files are read now, once: a pool reads them when it is made.
 */
export function tlsTries(option: string, target: ConnectionTarget): TlsTry[] {
  const mode = target.sslmode;
  if (mode === undefined) return [undefined];
  if (mode === 'disable') return [false];
  const system = target.sslrootcert === 'system';
  if (system && mode !== 'verify-full') {
    // As libpq: the system's CAs vouch for any name they signed, so the name must be checked.
    throw invalid(`${option}: sslrootcert=system needs sslmode=verify-full (got sslmode=${mode})`);
  }
  const client: ConnectionOptions = {};
  if (target.sslcert !== undefined) client.cert = readFile(option, 'sslcert', target.sslcert);
  if (target.sslkey !== undefined) client.key = readFile(option, 'sslkey', target.sslkey);
  if (target.sslpassword !== undefined) client.passphrase = target.sslpassword;
  const ca =
    target.sslrootcert === undefined || system
      ? {}
      : { ca: readFile(option, 'sslrootcert', target.sslrootcert) };
  const unchecked: ConnectionOptions = { ...client, rejectUnauthorized: false };
  const chainOnly: ConnectionOptions = {
    ...client,
    ...ca,
    rejectUnauthorized: true,
    checkServerIdentity: () => undefined,
  };
  switch (mode) {
    case 'allow':
      return [false, unchecked];
    case 'prefer':
      return [unchecked, false];
    case 'require':
      return [target.sslrootcert === undefined ? unchecked : chainOnly];
    case 'verify-ca':
      return [chainOnly];
    case 'verify-full':
      return [{ ...client, ...ca, rejectUnauthorized: true }];
  }
}

function readFile(option: string, parameter: string, path: string): Buffer {
  try {
    return readFileSync(path);
  } catch (e) {
    const code = (e as { code?: unknown }).code;
    throw invalid(`${option}: ${parameter} names "${path}", which cannot be read (${String(code ?? e)})`);
  }
}
