import { invalid } from '../validate.js';

/**
 * Formats are rendered in SQL (`render()` in the migrations) so that every language gets
 * the same text; this module only refuses formats that would render wrongly.
 */
export const FORMAT_TOKENS = ['{YYYY}', '{YY}', '{MM}', '{DD}', '{WW}', '{IYYY}', '{scope}', '{n}', '{n:W}'];
const TOKEN = /\{[^{}]*\}/g;
const KNOWN = /^\{(YYYY|YY|MM|DD|WW|IYYY|scope|n|n:([1-9]|1[0-9]|20))\}$/;
export const MAX_FORMAT_LENGTH = 200;

export function validateFormat(format: unknown): string {
  if (typeof format !== 'string' || format.length === 0 || format.length > MAX_FORMAT_LENGTH) {
    throw invalid(
      `format must be a text of 1 to ${MAX_FORMAT_LENGTH} characters, such as 'INV-{YYYY}-{n:6}'`,
    );
  }
  let number = false;
  for (const [token] of format.matchAll(TOKEN)) {
    const known = KNOWN.exec(token);
    if (!known) {
      throw invalid(
        `format has an unknown token ${token}; known tokens: ${FORMAT_TOKENS.join(' ')} (W: a width from 1 to 20)`,
      );
    }
    if (token.startsWith('{n')) number = true;
  }
  if (!number) {
    throw invalid(`format must contain {n} or {n:W}, or two numbers would read the same (got '${format}')`);
  }
  return format;
}
