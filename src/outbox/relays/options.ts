import { describe, invalid } from '../../validate.js';

/** A broker URL of one of `schemes`, or invalid_argument saying what to change. */
export function brokerUrl(what: string, value: unknown, schemes: readonly string[]): URL {
  const example = `${schemes[0]}//host:port`;
  if (typeof value !== 'string')
    throw invalid(`${what} must be a URL such as ${example} (got ${describe(value)})`);
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw invalid(`${what} must be a URL such as ${example} (got ${describe(value)})`);
  }
  if (!schemes.includes(url.protocol)) {
    throw invalid(`${what} must start with ${schemes.join(' or ')} (got ${describe(value)})`);
  }
  return url;
}

/** A URL as status shows it: without its password. */
export function withoutPassword(url: URL): string {
  const shown = new URL(url.href);
  if (shown.password) shown.password = '***';
  return shown.href;
}

/** A non-empty string option. */
export function textOption(what: string, value: unknown): string {
  if (typeof value !== 'string' || value.length === 0) {
    throw invalid(`${what} must be a non-empty string (got ${describe(value)})`);
  }
  return value;
}
