import { createHash, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { OrdoError } from '../index.js';

/** read: GET routes; next: issue numbers; admin: define, remove, statements. */
export const SCOPES = ['read', 'next', 'admin'] as const;
export type Scope = (typeof SCOPES)[number];

export interface Token {
  digest: Buffer;
  scopes: ReadonlySet<Scope>;
}

const TOKEN = /^[A-Za-z0-9._~-]{16,256}$/;

/**
 * Parses `token:scope+scope,token:scope` (ORDO_TOKENS, or the lines of a tokens file). Tokens
 * are kept only as SHA-256 digests, compared in constant time.
 */
export function parseTokens(text: string): Token[] {
  const tokens: Token[] = [];
  for (const entry of text.split(/[,\n]/).map((e) => e.trim())) {
    if (entry === '' || entry.startsWith('#')) continue;
    const [secret, scopeText, ...rest] = entry.split(':');
    if (!secret || !TOKEN.test(secret) || !scopeText || rest.length > 0) {
      throw new OrdoError(
        'invalid_argument',
        'each token must read token:scope+scope, the token 16 to 256 characters of A-Z a-z 0-9 . _ ~ -',
      );
    }
    const scopes = scopeText.split('+');
    for (const scope of scopes) {
      if (!SCOPES.includes(scope as Scope)) {
        throw new OrdoError(
          'invalid_argument',
          `unknown token scope '${scope}'; scopes: ${SCOPES.join(', ')}`,
        );
      }
    }
    tokens.push({ digest: digest(secret), scopes: new Set(scopes as Scope[]) });
  }
  return tokens;
}

export function readTokensFile(path: string): Token[] {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new OrdoError('invalid_argument', `cannot read the tokens file ${path}: ${(e as Error).message}`);
  }
  return parseTokens(text);
}

/** The token a bearer header names, checked against every token so timing reveals nothing. */
export function authenticate(tokens: readonly Token[], header: string | undefined): Token | undefined {
  const m = /^Bearer\s+(\S+)\s*$/i.exec(header ?? '');
  if (!m) return undefined;
  const presented = digest(m[1]!);
  let found: Token | undefined;
  for (const t of tokens) if (timingSafeEqual(t.digest, presented) && !found) found = t;
  return found;
}

function digest(secret: string): Buffer {
  return createHash('sha256').update(secret).digest();
}
