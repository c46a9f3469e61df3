import { OrdoError } from './errors.js';

/** Values are kept within ±(2^53 − 1) so a JavaScript number never rounds one. */
export const MAX_VALUE = Number.MAX_SAFE_INTEGER;

/**
 * Keys, scopes, holders, message types and ids: texts of at most this many characters. The one
 * declaration, read by the library's checks and by the HTTP schemas alike.
 */
export const MAX_TEXT = 200;

/** The longest error text kept (a failed permit's, a nacked message's). */
export const MAX_ERROR_LENGTH = 2000;

/** The longest IANA time zone name accepted ('America/Argentina/ComodRivadavia' is 32). */
export const MAX_TIME_ZONE_LENGTH = 64;

/** Names of sequences and throttles, as a JSON schema pattern too (the HTTP routes read it). */
export const IDENTIFIER_PATTERN = '^[A-Za-z_][A-Za-z0-9_]{0,62}$';
const IDENTIFIER = new RegExp(IDENTIFIER_PATTERN);

export function invalid(message: string): OrdoError {
  return new OrdoError('invalid_argument', message);
}

/** Whether `value` is a name identifier() accepts. */
export function isIdentifier(value: unknown): value is string {
  return typeof value === 'string' && IDENTIFIER.test(value);
}

/** Names of sequences, schemas, … : never spliced into SQL unless they pass this. */
export function identifier(what: string, value: unknown): string {
  if (!isIdentifier(value)) {
    throw invalid(
      `${what} must be an identifier: a letter or underscore, then letters, digits or underscores, at most 63 characters (got ${describe(value)})`,
    );
  }
  return value;
}

/** Half of a surrogate pair without its other half: UTF-8 cannot encode it. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
export const NOT_UNICODE = 'is not well-formed Unicode (a lone surrogate); it would be stored altered';

/**
 * A text PostgreSQL stores as it is: `min` to `max` characters, no NUL (PostgreSQL refuses
 * it), no lone surrogate (UTF-8 cannot hold one: two different texts would become the same).
 */
export function text(what: string, value: unknown, min: number, max: number): string {
  if (typeof value !== 'string' || value.length < min || value.length > max || value.includes('\u0000')) {
    throw invalid(
      `${what} must be a text of ${min > 0 ? `${min} to` : 'at most'} ${max} characters, without NUL (got ${describe(value)})`,
    );
  }
  if (LONE_SURROGATE.test(value)) throw invalid(`${what} ${NOT_UNICODE}`);
  return value;
}

export function safeInteger(what: string, value: unknown, min = -MAX_VALUE, max = MAX_VALUE): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min || value > max) {
    throw invalid(`${what} must be a whole number from ${min} to ${max} (got ${describe(value)})`);
  }
  return value;
}

export function oneOf<T extends string>(what: string, value: unknown, allowed: readonly T[]): T {
  if (typeof value !== 'string' || !allowed.includes(value as T)) {
    throw invalid(
      `${what} must be one of ${allowed.map((a) => `'${a}'`).join(', ')} (got ${describe(value)})`,
    );
  }
  return value as T;
}

export function boolean(what: string, value: unknown): boolean {
  if (typeof value !== 'boolean') throw invalid(`${what} must be true or false (got ${describe(value)})`);
  return value;
}

/** Refuses keys the caller may have misspelt, so that an ignored option never surprises. */
export function knownKeys(what: string, value: object, allowed: readonly string[]): void {
  for (const key of Object.keys(value)) {
    if (!allowed.includes(key)) {
      throw invalid(`${what} has no option '${key}'; known options: ${allowed.join(', ')}`);
    }
  }
}

export function plainObject(what: string, value: unknown): Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw invalid(`${what} must be an object (got ${describe(value)})`);
  }
  return value as Record<string, unknown>;
}

export function describe(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value.length > 80 ? `${value.slice(0, 80)}…` : value);
  if (typeof value === 'number' || typeof value === 'boolean' || value == null) return String(value);
  if (value instanceof Date)
    return `Date(${Number.isNaN(value.getTime()) ? 'invalid' : value.toISOString()})`;
  return Array.isArray(value) ? 'an array' : typeof value;
}
