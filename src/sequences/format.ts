import { invalid, MAX_TEXT } from '../validate.js';

/**
 * Formats are rendered in SQL (`render()`) so that every language gets
 * the same text, in one pass over the format's own pieces: a token's output is never read
 * again. The same grammar is checked in SQL (`check_format`) for definitions from any client;
 * this module refuses bad formats first, with the same messages.
 */
export const FORMAT_TOKENS = [
  '{YYYY}',
  '{YY}',
  '{MM}',
  '{DD}',
  '{WW}',
  '{IYYY}',
  '{FY}',
  '{FYE}',
  '{scope}',
  '{n}',
  '{n:W}',
];
export const MAX_FORMAT_LENGTH = 200;
/** The longest text a format may render (each `{scope}` counts as its 200 characters). */
export const MAX_RENDERED_LENGTH = 1000;

/** Tokens (braces around no brace), runs of literal text, and stray braces, in order. */
const PIECES = /\{[^{}]*\}|[^{}]+|[{}]/g;
const NUMBER = /^\{n(:([1-9]|1[0-9]|20))?\}$/;

/** How long a token can render, as `token_width()` in SQL; undefined for an unknown token. */
function tokenWidth(token: string): number | undefined {
  if (['{YYYY}', '{IYYY}', '{FY}', '{FYE}'].includes(token)) return 6;
  if (['{YY}', '{MM}', '{DD}', '{WW}'].includes(token)) return 2;
  if (NUMBER.test(token)) return 20;
  if (token === '{scope}') return MAX_TEXT;
  return undefined;
}

export function validateFormat(format: unknown): string {
  if (typeof format !== 'string' || format.length === 0 || format.length > MAX_FORMAT_LENGTH) {
    throw invalid(
      `format must be a text of 1 to ${MAX_FORMAT_LENGTH} characters, such as 'INV-{YYYY}-{n:6}'`,
    );
  }
  let number = false;
  let longest = 0;
  for (const [piece] of format.matchAll(PIECES)) {
    if (!/[{}]/.test(piece)) {
      longest += piece.length;
      continue;
    }
    const width = tokenWidth(piece);
    if (width === undefined) {
      const what = piece.length === 1 ? `a stray '${piece}'` : `an unknown token ${piece}`;
      throw invalid(
        `format has ${what}; braces only enclose the tokens ${FORMAT_TOKENS.join(' ')} (W: a width from 1 to 20)`,
      );
    }
    longest += width;
    if (NUMBER.test(piece)) number = true;
  }
  if (!number) {
    throw invalid(`format must contain {n} or {n:W}, or two numbers would read the same (got '${format}')`);
  }
  if (longest > MAX_RENDERED_LENGTH) {
    throw invalid(
      `format may render up to ${longest} characters; at most ${MAX_RENDERED_LENGTH} are allowed (each {scope} may take 200)`,
    );
  }
  return format;
}
