import { parseDuration } from '../durations.js';
import { OrdoError } from '../errors.js';
import { MAX_BATCH } from '../sequences/definitions.js';
import { validateFormat } from '../sequences/format.js';
import { identifier, invalid, MAX_VALUE } from '../validate.js';
import { describeToken, Lexer, position, syntaxError, type Token } from './lexer.js';
import {
  CLAUSES,
  type Clause,
  type DefineSequenceStatement,
  RESET_KEYWORDS,
  type Statement,
} from './statements.js';

/** Largest BATCH, as in SurrealDB's documentation of DEFINE SEQUENCE. */
const MAX_TIME_ZONE_LENGTH = 64;

const STATEMENT_STARTS = 'DEFINE, ALTER, REMOVE, RETURN, INFO or sequence::nextval';
const STATEMENT_END = "';' or end of input";
const DURATION_EXAMPLES = 'a duration such as 5s, 100ms or 1m30s';

/**
 * Parses `;`-separated statements of ordo's SurrealQL subset. All or nothing: any error
 * refuses the whole text with an invalid_argument OrdoError, and no statement is returned.
 */
export function parseStatements(text: string): Statement[] {
  if (typeof text !== 'string') throw invalid('statements must be a text');
  return new Parser(text).statements();
}

class Parser {
  private readonly lexer: Lexer;
  private current: Token;

  constructor(text: string) {
    this.lexer = new Lexer(text);
    this.current = this.lexer.next();
  }

  statements(): Statement[] {
    const statements: Statement[] = [];
    for (;;) {
      while (this.isSymbol(';')) this.advance();
      if (this.atEnd()) return statements;
      statements.push(this.statement());
      if (this.atEnd()) return statements;
      this.expectSymbol(';', STATEMENT_END);
    }
  }

  private statement(): Statement {
    if (this.acceptWord('DEFINE')) return this.define();
    if (this.acceptWord('ALTER')) return this.alter();
    if (this.acceptWord('REMOVE')) return this.remove();
    if (this.acceptWord('INFO')) {
      this.expectWord('FOR');
      if (!this.acceptWord('DB') && !this.acceptWord('DATABASE')) this.fail('DB or DATABASE');
      return this.end({ kind: 'info_for_db' });
    }
    if (this.acceptWord('RETURN')) return this.nextval();
    if (this.isWord('SEQUENCE')) return this.nextval();
    return this.fail(STATEMENT_STARTS);
  }

  private define(): Statement {
    this.expectWord('SEQUENCE');
    let mode: DefineSequenceStatement['mode'] = 'create';
    if (this.acceptWord('OVERWRITE')) mode = 'overwrite';
    else if (this.acceptWord('IF')) {
      this.expectWord('NOT');
      this.expectWord('EXISTS');
      mode = 'if_not_exists';
    }
    const statement: DefineSequenceStatement = {
      kind: 'define_sequence',
      name: this.name(),
      mode,
      gapless: false,
    };
    const seen = new Set<Clause>();
    for (;;) {
      const token = this.current;
      const clause = token.kind === 'word' ? (token.text.toUpperCase() as Clause) : undefined;
      if (clause === undefined || !CLAUSES.includes(clause)) break;
      if (seen.has(clause)) {
        throw syntaxError(`${clause} may be given only once, found a second ${clause} at ${position(token)}`);
      }
      seen.add(clause);
      this.advance();
      switch (clause) {
        case 'BATCH':
          statement.batch = this.integer(clause, 1, MAX_BATCH);
          break;
        case 'START':
          statement.start = this.integer(clause, -MAX_VALUE, MAX_VALUE);
          break;
        case 'TIMEOUT':
          statement.timeoutMs = this.duration(clause);
          break;
        case 'GAPLESS':
          statement.gapless = true;
          break;
        case 'INCREMENT':
          statement.increment = this.integer(clause, 1, MAX_VALUE);
          break;
        case 'MAXVALUE':
          statement.maxValue = this.integer(clause, -MAX_VALUE, MAX_VALUE);
          break;
        case 'CYCLE':
          statement.cycle = true;
          break;
        case 'RESET':
          statement.reset = this.reset();
          break;
        case 'TIMEZONE':
          statement.timeZone = this.timeZone();
          break;
        case 'FORMAT':
          statement.format = this.format();
          break;
      }
    }
    return this.end(statement, `${CLAUSES.join(', ')}, ${STATEMENT_END}`);
  }

  private alter(): Statement {
    this.expectWord('SEQUENCE');
    const name = this.name();
    if (this.acceptWord('TIMEOUT')) {
      return this.end({ kind: 'alter_sequence', name, timeoutMs: this.duration('TIMEOUT') });
    }
    if (this.acceptWord('DROP')) {
      this.expectWord('TIMEOUT');
      return this.end({ kind: 'alter_sequence', name, timeoutMs: null });
    }
    return this.fail('TIMEOUT or DROP TIMEOUT');
  }

  private remove(): Statement {
    this.expectWord('SEQUENCE');
    let ifExists = false;
    if (this.acceptWord('IF')) {
      this.expectWord('EXISTS');
      ifExists = true;
    }
    return this.end({ kind: 'remove_sequence', name: this.name(), ifExists });
  }

  /** `sequence::nextval('name')`, RETURN already read. */
  private nextval(): Statement {
    this.expectWord('SEQUENCE', 'sequence::nextval');
    this.expectSymbol('::', "'::'");
    this.expectWord('NEXTVAL', 'nextval');
    this.expectSymbol('(', "'('");
    const token = this.current;
    if (token.kind !== 'string') this.fail('the sequence name as a quoted string');
    const name = this.checkedName(token);
    this.advance();
    this.expectSymbol(')', "')'");
    return this.end({ kind: 'nextval', name });
  }

  /** A bare, `backticked` or ⟨bracketed⟩ sequence name. */
  private name(): string {
    const token = this.current;
    if (token.kind !== 'word' && token.kind !== 'name') this.fail('a sequence name');
    const name = this.checkedName(token);
    this.advance();
    return name;
  }

  private checkedName(token: Token): string {
    return this.at(token, () => identifier('sequence name', token.value));
  }

  private integer(clause: Clause, min: number, max: number): number {
    const token = this.current;
    const value = token.kind === 'number' && /^-?\d+$/.test(token.text) ? Number(token.text) : Number.NaN;
    if (!Number.isSafeInteger(value) || value < min || value > max) {
      this.refuse(`${clause} must be a whole number from ${min} to ${max}`, token);
    }
    this.advance();
    return value;
  }

  private duration(clause: Clause): number {
    const token = this.current;
    let ms: number | undefined;
    if (token.kind === 'number') {
      try {
        ms = parseDuration(token.text);
      } catch {
        // reported below with the clause and position
      }
    }
    if (ms === undefined) this.refuse(`${clause} must be ${DURATION_EXAMPLES}`, token);
    this.advance();
    return ms;
  }

  private reset(): 'day' | 'week' | 'month' | 'year' {
    const token = this.current;
    const period =
      token.kind === 'word'
        ? RESET_KEYWORDS[token.text.toUpperCase() as keyof typeof RESET_KEYWORDS]
        : undefined;
    if (period === undefined) this.refuse('RESET must be DAILY, WEEKLY, MONTHLY or YEARLY', token);
    this.advance();
    return period;
  }

  private timeZone(): string {
    const token = this.current;
    if (token.kind !== 'string' || token.value.length === 0 || token.value.length > MAX_TIME_ZONE_LENGTH) {
      this.refuse(
        `TIMEZONE must be a quoted IANA time zone name of 1 to ${MAX_TIME_ZONE_LENGTH} characters, such as 'Europe/Paris'`,
        token,
      );
    }
    this.advance();
    return token.value;
  }

  private format(): string {
    const token = this.current;
    if (token.kind !== 'string')
      this.refuse("FORMAT must be a quoted text such as 'INV-{YYYY}-{n:6}'", token);
    const format = this.at(token, () => validateFormat(token.value));
    this.advance();
    return format;
  }

  /** Runs a library check, adding the token's position to the message it refuses with. */
  private at<T>(token: Token, check: () => T): T {
    try {
      return check();
    } catch (e) {
      if (e instanceof OrdoError) throw invalid(`${e.message} at ${position(token)}`);
      throw e;
    }
  }

  /** Returns the statement if it ends here (the `;` is left for statements()). */
  private end<T extends Statement>(statement: T, expected = STATEMENT_END): T {
    if (!this.isSymbol(';') && !this.atEnd()) this.fail(expected);
    return statement;
  }

  private advance(): Token {
    const token = this.current;
    this.current = this.lexer.next();
    return token;
  }

  private atEnd(): boolean {
    return this.current.kind === 'eof';
  }

  private isWord(keyword: string): boolean {
    return this.current.kind === 'word' && this.current.text.toUpperCase() === keyword;
  }

  private isSymbol(symbol: string): boolean {
    return this.current.kind === 'symbol' && this.current.text === symbol;
  }

  private acceptWord(keyword: string): boolean {
    if (!this.isWord(keyword)) return false;
    this.advance();
    return true;
  }

  private expectWord(keyword: string, expected = keyword): void {
    if (!this.acceptWord(keyword)) this.fail(expected);
  }

  private expectSymbol(symbol: string, expected: string): void {
    if (!this.isSymbol(symbol)) this.fail(expected);
    this.advance();
  }

  private fail(expected: string): never {
    throw syntaxError(
      `expected ${expected}, found ${describeToken(this.current)} at ${position(this.current)}`,
    );
  }

  private refuse(message: string, token: Token): never {
    throw invalid(`${message}, found ${describeToken(token)} at ${position(token)}`);
  }
}
