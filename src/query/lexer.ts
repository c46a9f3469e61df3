import { OrdoError } from '../errors.js';

/**
 * Tokens of ordo's SurrealQL subset. Every token knows where it starts (1-based line and
 * column, columns counted in characters) so that errors can point at it.
 *
 * - `word`: `[A-Za-z_][A-Za-z0-9_]*`, a keyword or a bare name (`value` is the text as written).
 * - `number`: starts with a digit, or `-` directly followed by a digit, and runs on through
 *   letters, digits, `_`, `.` and `µ`: a whole number (`100`, `-5`) or a duration (`1m30s`).
 *   The parser decides which it must be, so that `1.5` or `5x` is refused as one piece.
 * - `string`: `'…'` or `"…"`; `value` is the text with escapes (`\\ \' \" \n \t`) resolved.
 * - `name`: `` `…` `` or `⟨…⟩`; `value` is the text between the quotes.
 * - `param`: `$` directly followed by a word (`$batch`); `value` is the word.
 * - `symbol`: `;`, `(`, `)`, `::` or any other single character.
 * - `eof`: the end of the input, positioned just after its last character.
 */
export type TokenKind = 'word' | 'number' | 'string' | 'name' | 'param' | 'symbol' | 'eof';

export interface Token {
  kind: TokenKind;
  /** The token exactly as written in the source. */
  text: string;
  /** The decoded value: string contents, quoted name contents, otherwise `text`. */
  value: string;
  line: number;
  column: number;
  /** Set when the token is the value of a parameter, put where the parameter was written: its `$name`. */
  via?: string;
}

const ESCAPES: Record<string, string> = { '\\': '\\', "'": "'", '"': '"', n: '\n', t: '\t' };
const CLOSING: Record<string, string> = { '`': '`', '⟨': '⟩' };

export function syntaxError(message: string): OrdoError {
  return new OrdoError('invalid_argument', `Parse error: ${message}`);
}

function isDigit(c: string | undefined): boolean {
  return c !== undefined && c >= '0' && c <= '9';
}

function isWordStart(c: string | undefined): boolean {
  return c !== undefined && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c === '_');
}

function isWordPart(c: string | undefined): boolean {
  return isWordStart(c) || isDigit(c);
}

function isNumberPart(c: string | undefined): boolean {
  return isWordPart(c) || c === '.' || c === 'µ' || c === 'μ';
}

/** Reads tokens one at a time, so the first error in reading order is the one reported. */
export class Lexer {
  private index = 0;
  private line = 1;
  private column = 1;

  constructor(private readonly source: string) {}

  next(): Token {
    this.skipTrivia();
    const line = this.line;
    const column = this.column;
    const start = this.index;
    const token = (kind: TokenKind, value?: string): Token => {
      const text = this.source.slice(start, this.index);
      return { kind, text, value: value ?? text, line, column };
    };
    const c = this.peek();
    if (c === undefined) return token('eof');
    if (isWordStart(c)) {
      while (isWordPart(this.peek())) this.bump();
      return token('word');
    }
    if (isDigit(c) || (c === '-' && isDigit(this.peek(1)))) {
      this.bump();
      while (isNumberPart(this.peek())) this.bump();
      return token('number');
    }
    if (c === '$' && isWordStart(this.peek(1))) {
      this.bump();
      while (isWordPart(this.peek())) this.bump();
      return token('param', this.source.slice(start + 1, this.index));
    }
    if (c === "'" || c === '"') return token('string', this.readString(c, line, column));
    if (c === '`' || c === '⟨') {
      const close = CLOSING[c]!;
      this.bump();
      const from = this.index;
      while (this.peek() !== close) {
        if (this.peek() === undefined) {
          throw syntaxError(`unterminated quoted name starting at ${line}:${column}`);
        }
        this.bump();
      }
      const value = this.source.slice(from, this.index);
      this.bump();
      return token('name', value);
    }
    if (c === ':' && this.peek(1) === ':') {
      this.bump();
      this.bump();
      return token('symbol');
    }
    this.bump();
    return token('symbol');
  }

  /** The character (code point) `ahead` characters from the current one. */
  private peek(ahead = 0): string | undefined {
    let i = this.index;
    for (let k = 0; k < ahead; k++) {
      const cp = this.source.codePointAt(i);
      if (cp === undefined) return undefined;
      i += cp > 0xffff ? 2 : 1;
    }
    const cp = this.source.codePointAt(i);
    return cp === undefined ? undefined : String.fromCodePoint(cp);
  }

  private bump(): string {
    const c = this.peek()!;
    this.index += c.length;
    if (c === '\n' || (c === '\r' && this.source[this.index] !== '\n')) {
      this.line++;
      this.column = 1;
    } else if (c !== '\r') {
      this.column++;
    }
    return c;
  }

  private skipTrivia(): void {
    for (;;) {
      const c = this.peek();
      if (c === ' ' || c === '\t' || c === '\n' || c === '\r' || c === '\f' || c === '\v' || c === '\uFEFF') {
        this.bump();
      } else if (c === '#' || (c === '-' && this.peek(1) === '-') || (c === '/' && this.peek(1) === '/')) {
        while (this.peek() !== undefined && this.peek() !== '\n' && this.peek() !== '\r') this.bump();
      } else if (c === '/' && this.peek(1) === '*') {
        const line = this.line;
        const column = this.column;
        this.bump();
        this.bump();
        while (!(this.peek() === '*' && this.peek(1) === '/')) {
          if (this.peek() === undefined)
            throw syntaxError(`unterminated comment starting at ${line}:${column}`);
          this.bump();
        }
        this.bump();
        this.bump();
      } else {
        return;
      }
    }
  }

  private readString(quote: string, line: number, column: number): string {
    this.bump();
    let value = '';
    for (;;) {
      const c = this.peek();
      if (c === undefined) throw syntaxError(`unterminated string starting at ${line}:${column}`);
      if (c === quote) {
        this.bump();
        return value;
      }
      if (c === '\\') {
        const at = `${this.line}:${this.column}`;
        this.bump();
        const e = this.peek();
        if (e === undefined) throw syntaxError(`unterminated string starting at ${line}:${column}`);
        const decoded = ESCAPES[e];
        if (decoded === undefined) {
          throw syntaxError(
            `unknown escape '\\${e}' in a string at ${at}; known escapes: \\\\ \\' \\" \\n \\t`,
          );
        }
        this.bump();
        value += decoded;
      } else {
        value += this.bump();
      }
    }
  }
}

/** All the tokens of `source`, ending with the `eof` token. */
export function tokenize(source: string): Token[] {
  const lexer = new Lexer(source);
  const tokens: Token[] = [];
  for (;;) {
    const token = lexer.next();
    tokens.push(token);
    if (token.kind === 'eof') return tokens;
  }
}

/**
 * How an error message shows a token: `'SELECT'`, `string 'abc'`, `end of input`, and a
 * parameter's value with the parameter: `'$batch' (string 'x')`.
 */
export function describeToken(token: Token): string {
  if (token.kind === 'eof') return 'end of input';
  const text = token.text.length > 40 ? `${token.text.slice(0, 40)}…` : token.text;
  const shown = token.kind === 'string' ? `string ${text}` : `'${text}'`;
  return token.via === undefined ? shown : `'${token.via}' (${shown})`;
}

export function position(token: Token): string {
  return `${token.line}:${token.column}`;
}
