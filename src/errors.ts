/**
 * Every error ordo raises is an OrdoError with a stable `code`. The table below is the one
 * place where codes are listed, with the HTTP status the server answers them with.
 */
export const ERROR_CODES = {
  invalid_argument: 400,
  unauthorized: 401,
  forbidden: 403,
  not_found: 404,
  sequence_not_found: 404,
  sequence_exists: 409,
  sequence_exhausted: 409,
  serialization_failure: 409,
  subscription_not_found: 404,
  subscription_conflict: 409,
  subscription_busy: 409,
  receipt_expired: 409,
  throttle_not_found: 404,
  throttle_exists: 409,
  permit_not_found: 404,
  permit_expired: 409,
  throttled: 429,
  request_timeout: 408,
  payload_too_large: 413,
  unsupported_media_type: 415,
  headers_too_large: 431,
  closed: 503,
  timeout: 503,
  database_unavailable: 503,
  schema_too_new: 500,
  schema_outdated: 500,
  unsupported_server: 500,
  prepared_statement_missing: 500,
  embedded_failed: 500,
  handler_failed: 500,
  database_error: 500,
} as const;

export type OrdoErrorCode = keyof typeof ERROR_CODES;

export class OrdoError extends Error {
  override readonly name = 'OrdoError';
  readonly code: OrdoErrorCode;

  constructor(code: OrdoErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
  }

  get httpStatus(): number {
    return ERROR_CODES[this.code];
  }
}

/** The error for a name with no sequence, worded as SurrealDB words it. */
export function sequenceNotFound(name: string): OrdoError {
  return new OrdoError('sequence_not_found', `The sequence '${name}' does not exist`);
}

export function closedError(): OrdoError {
  return new OrdoError('closed', 'This ordo client is closed');
}

/** SQLSTATEs raised by ordo's own SQL functions and the PostgreSQL ones a caller can cause. */
const SQLSTATE_CODES: Record<string, OrdoErrorCode> = {
  OX001: 'sequence_not_found',
  OX002: 'sequence_exhausted',
  OX003: 'invalid_argument',
  OX004: 'invalid_argument', // the other kind: callers with a cached definition refresh it first
  OX005: 'throttle_not_found',
  OX006: 'throttle_exists',
  OX007: 'permit_not_found',
  OX008: 'permit_expired',
  OX010: 'subscription_not_found',
  OX011: 'subscription_conflict',
  OX020: 'subscription_busy',
  '22003': 'invalid_argument', // numeric_value_out_of_range
  '22008': 'invalid_argument', // datetime_field_overflow
  '22009': 'invalid_argument', // invalid_time_zone_displacement_value
  '22021': 'invalid_argument', // character_not_in_repertoire (a NUL in a text)
  '22P05': 'invalid_argument', // untranslatable_character
  '22023': 'invalid_argument', // invalid_parameter_value
  '23514': 'invalid_argument', // check_violation
  '57014': 'timeout', // query_canceled (statement_timeout)
  '55P03': 'timeout', // lock_not_available (lock_timeout)
};

/**
 * A database that is restarting, starting up, shutting down, in recovery, out of connection
 * slots, read-only after a failover, or unreachable: transient, answered 503 with Retry-After.
 * Class 08 (connection exceptions) counts whole.
 */
const UNAVAILABLE_SQLSTATES = new Set(['57P01', '57P02', '57P03', '53300', '25006']);
const NETWORK_ERRORS = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ENOTFOUND',
  'EAI_AGAIN',
  'ETIMEDOUT',
  'EPIPE',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ECONNABORTED',
  // Out of file descriptors: no new connection can be opened until some are closed.
  'EMFILE',
  'ENFILE',
  // postgres.js, for a caller's transaction on it.
  'CONNECTION_CLOSED',
  'CONNECTION_DESTROYED',
  'CONNECTION_ENDED',
  'CONNECT_TIMEOUT',
]);
/** Raised before a statement could reach the server: retrying it cannot run it twice. */
const BEFORE_SENDING = new Set([
  '57P03',
  '53300',
  '08001',
  '08004',
  'ECONNREFUSED',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EMFILE',
  'ENFILE',
  'CONNECT_TIMEOUT',
]);
const LOST_CONNECTION = /Connection terminated|connection timeout|Client has encountered a connection error/i;

/**
 * Turns anything thrown by the driver into an OrdoError. The statement text is attached
 * as a non-enumerable property: it helps debugging without leaking into logs.
 */
export function toOrdoError(error: unknown, statement?: string): OrdoError {
  if (error instanceof OrdoError) return error;
  const e = error as { code?: unknown; message?: unknown };
  const sqlstate = typeof e?.code === 'string' ? e.code : undefined;
  const message = typeof e?.message === 'string' ? e.message : String(error);
  let code: OrdoErrorCode = 'database_error';
  const table = (e as { table?: unknown }).table;
  if (sqlstate === '23503' && (table === 'counters' || table === 'sequence_batches')) {
    // counters or batches → sequences: the sequence was removed mid-call.
    return wrap(
      'sequence_not_found',
      'The sequence was removed while a value was being taken',
      error,
      statement,
    );
  }
  if (sqlstate === '40001' && table === 'counters') {
    // A REPEATABLE READ or SERIALIZABLE commit numbering rows of a counter another transaction
    // numbered since its snapshot (number_row(), numbering at commit): retry the transaction.
    return wrap('serialization_failure', message, error, statement);
  }
  if (/timeout exceeded when trying to connect/i.test(message)) {
    return wrap(
      'timeout',
      'No connection to PostgreSQL could be opened, or freed by other calls, within connectTimeout; retry later',
      error,
      statement,
    );
  }
  if (message === 'Query read timeout') {
    return wrap(
      'timeout',
      'The statement did not finish within statementTimeout; it was abandoned',
      error,
      statement,
    );
  }
  if (sqlstate === '26000') {
    // ordo sends no PREPARE of its own: a statement it named (createOrdo's prepare) is missing
    // on the server connection this transaction runs on.
    return wrap(
      'prepared_statement_missing',
      `${message}: the statement was prepared on another server connection, as a pooler in transaction mode ` +
        'hands each transaction to any (PgBouncer before 1.21 or without max_prepared_statements, ' +
        "Supabase's port 6543, Neon's -pooler host). Create ordo with prepare: false, or enable " +
        "the pooler's prepared statements",
      error,
      statement,
    );
  }
  if (sqlstate === '40P01') {
    // Transient like an unavailable database: the server rolled the statement back, and the
    // same call made again goes through.
    return wrap(
      'database_unavailable',
      'The statement was rolled back to break a deadlock with another transaction (SQLSTATE 40P01); retry it',
      error,
      statement,
    );
  }
  if (sqlstate && SQLSTATE_CODES[sqlstate]) code = SQLSTATE_CODES[sqlstate];
  else if (unavailable(sqlstate, message))
    return wrap('database_unavailable', unavailableMessage(sqlstate, message), error, statement);
  return wrap(code, message, error, statement);
}

/**
 * A server in recovery refuses what only a primary does, some of it with SQLSTATE 0A000
 * ("cannot set transaction read-write mode during recovery"): a standby, or a primary demoted
 * by a failover, not a feature ordo lacks.
 */
const IN_RECOVERY = /during recovery/i;

function unavailable(sqlstate: string | undefined, message: string): boolean {
  if (sqlstate === undefined) return LOST_CONNECTION.test(message);
  if (sqlstate === '0A000') return IN_RECOVERY.test(message);
  return (
    UNAVAILABLE_SQLSTATES.has(sqlstate) ||
    sqlstate.startsWith('08') ||
    NETWORK_ERRORS.has(sqlstate) ||
    LOST_CONNECTION.test(message)
  );
}

/**
 * What a client may be told: never the database's host or port (a network error's message
 * carries them); the original stays the cause.
 */
function unavailableMessage(sqlstate: string | undefined, message: string): string {
  // 08001: no host of a URL gave a session ordo accepts; which host said what is in the cause.
  if (sqlstate && (NETWORK_ERRORS.has(sqlstate) || sqlstate === '08001'))
    return `PostgreSQL cannot be reached (${sqlstate}); retry later`;
  if (sqlstate) return `PostgreSQL is unavailable: ${message} (SQLSTATE ${sqlstate}); retry later`;
  return `The connection to PostgreSQL was lost (${message}); retry later`;
}

/**
 * Whether an error shows that its statement never reached the server (no connection could be
 * made or taken), so that running it again cannot run it twice.
 */
export function neverSent(error: unknown): boolean {
  const cause = error instanceof OrdoError ? error.cause : error;
  const e = cause as { code?: unknown; message?: unknown } | undefined;
  if (typeof e?.code === 'string' && BEFORE_SENDING.has(e.code)) return true;
  return typeof e?.message === 'string' && /timeout exceeded when trying to connect/i.test(e.message);
}

function wrap(code: OrdoErrorCode, message: string, cause: unknown, statement?: string): OrdoError {
  const wrapped = new OrdoError(code, message, { cause });
  if (statement) Object.defineProperty(wrapped, 'statement', { value: statement, enumerable: false });
  return wrapped;
}

/**
 * Whether an error proves its statement wrote nothing: it never reached the server, the
 * server answered it with an error (a standalone statement that fails is rolled back), or ordo
 * refused it. A lost connection or a client-side timeout proves nothing: the statement may
 * have committed.
 */
export function wroteNothing(error: unknown): boolean {
  if (neverSent(error)) return true;
  if (error instanceof OrdoError && !OUTCOME_UNKNOWN.has(error.code)) return true;
  const cause = error instanceof OrdoError ? error.cause : error;
  const e = cause as { code?: unknown; severity?: unknown } | undefined;
  return typeof e?.severity === 'string' && typeof e.code === 'string';
}

const OUTCOME_UNKNOWN = new Set<OrdoErrorCode>(['timeout', 'database_unavailable', 'database_error']);
