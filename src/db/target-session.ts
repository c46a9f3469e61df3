/**
 * Whether a new session is one target_session_attrs accepts, by libpq's rules. A server of
 * PostgreSQL 14 or newer reports default_transaction_read_only and in_hot_standby when the
 * session starts, and those reports decide with no round trip; an older server, or a pooler
 * that does not pass them on, is asked: `SHOW transaction_read_only` for read-write,
 * `pg_is_in_recovery()` for primary.
 */
import type { TargetSessionAttrs } from './connection-string.js';

/** The parameters the server reported at startup (ParameterStatus), by name. */
export type Reported = ReadonlyMap<string, string>;

/** Runs one statement on the session and returns the first column of its first row. */
export type AskSession = (sql: string) => Promise<unknown>;

/** Why the session will not do, in libpq's words, or undefined when it will. */
export async function sessionRefusal(
  attrs: TargetSessionAttrs,
  reported: Reported,
  ask: AskSession,
): Promise<string | undefined> {
  if (attrs === 'any') return undefined;
  const inHotStandby = reported.get('in_hot_standby');
  if (attrs === 'read-write') {
    const defaultReadOnly = reported.get('default_transaction_read_only');
    const readOnly =
      defaultReadOnly !== undefined && inHotStandby !== undefined
        ? defaultReadOnly === 'on' || inHotStandby === 'on'
        : (await ask('SHOW transaction_read_only')) === 'on';
    return readOnly ? 'session is read-only' : undefined;
  }
  const standby =
    inHotStandby !== undefined
      ? inHotStandby === 'on'
      : (await ask('SELECT pg_catalog.pg_is_in_recovery()')) === true;
  return standby ? 'server is in hot standby mode' : undefined;
}
