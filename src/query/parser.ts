import { parseDuration } from '../durations.js';
import { OrdoError } from '../errors.js';
import { MAX_BATCH } from '../sequences/definitions.js';
import { validateFormat } from '../sequences/format.js';
import { identifier, invalid, MAX_TIME_ZONE_LENGTH, MAX_VALUE } from '../validate.js';
import { describeToken, Lexer, position, syntaxError, type Token } from './lexer.js';
import {
  CLAUSES,
  type Clause,
  type DefineSequenceStatement,
  RESET_KEYWORDS,
  type Statement,
} from './statements.js';

type AlterSequenceStatement = Extract<Statement, { kind: 'alter_sequence' }>;
type InfoStatement = Extract<Statement, { kind: 'info_for_db' }>;

const STATEMENT_STARTS = 'DEFINE, ALTER, REMOVE, LET, RETURN, INFO or sequence::nextval';
const STATEMENT_END = "';' or end of input";
const DURATION_EXAMPLES = 'a duration such as 5s, 100ms or 1m30s, or NONE';

/**
 * Parses `;`-separated statements of ordo's SurrealQL subset. All or nothing, as SurrealDB
 * parses its own: any error refuses the whole text with an invalid_argument OrdoError, and
 * no statement is returned. Values are checked here too (a BATCH of 0, a name that is not an
 * identifier), so a text runs only when every statement in it can.
 *
 * `LET $name = value` (a string, a number, a duration or NONE) gives later statements of the
 * same text a value to write as `$name` wherever a name or a value goes; the parser puts the
 * value in its place.
 */
export function parseStatements(text: string): Statement[] {
  if (typeof text !== 'string') throw invalid('statements must be a text');
  return new Parser(text).statements();
}

class Parser {
  private readonly lexer: Lexer;
  private current: Token;
  /** The values LET gave so far, by parameter name (without `$`). */
  private readonly params = new Map<string, Token>();

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
    if (this.acceptWord('LET')) return this.let();
    if (this.isWord('INFO') || this.isSymbol('(')) return this.info();
    if (this.acceptWord('RETURN')) {
      if (this.isWord('INFO') || this.isSymbol('(')) return this.info();
      return this.nextval('INFO FOR DB or sequence::nextval');
    }
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
        case 'TIMEOUT': {
          const timeoutMs = this.timeout(clause);
          if (timeoutMs !== null) statement.timeoutMs = timeoutMs; // TIMEOUT NONE: none, as without the clause
          break;
        }
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

  /** `ALTER SEQUENCE [IF EXISTS] name [TIMEOUT d | TIMEOUT NONE | DROP TIMEOUT]`, as SurrealDB 3 reads it (DROP TIMEOUT: ordo's). */
  private alter(): Statement {
    this.expectWord('SEQUENCE');
    const ifExists = this.ifExists();
    const statement: AlterSequenceStatement = { kind: 'alter_sequence', name: this.name(), ifExists };
    if (this.acceptWord('TIMEOUT')) {
      statement.timeoutMs = this.timeout('TIMEOUT');
    } else if (this.acceptWord('DROP')) {
      this.expectWord('TIMEOUT');
      statement.timeoutMs = null;
    } else {
      return this.end(statement, `TIMEOUT, DROP TIMEOUT, ${STATEMENT_END}`);
    }
    return this.end(statement);
  }

  private remove(): Statement {
    this.expectWord('SEQUENCE');
    const ifExists = this.ifExists();
    return this.end({ kind: 'remove_sequence', name: this.name(), ifExists });
  }

  private ifExists(): boolean {
    if (!this.acceptWord('IF')) return false;
    this.expectWord('EXISTS');
    return true;
  }

  /** `LET $name = value`: a string, a number, a duration, NONE, or another parameter's value. */
  private let(): Statement {
    const param = this.current;
    if (param.kind !== 'param') this.fail('a parameter such as $name');
    this.advance();
    this.expectSymbol('=', "'='");
    const value = this.value();
    if (value.kind !== 'string' && value.kind !== 'number' && !isNone(value)) {
      this.refuse('LET takes a string, a number, a duration or NONE', value);
    }
    this.advance();
    const statement = this.end({ kind: 'let', name: param.value });
    this.params.set(param.value, value);
    return statement;
  }

  /**
   * `INFO FOR DB [STRUCTURE]`, or the same in parentheses followed by fields:
   * `(INFO FOR DB).sequences`. RETURN already read.
   */
  private info(): Statement {
    const parenthesized = this.isSymbol('(');
    if (parenthesized) this.advance();
    this.expectWord('INFO');
    this.expectWord('FOR');
    if (!this.acceptWord('DB') && !this.acceptWord('DATABASE')) this.fail('DB or DATABASE');
    const statement: InfoStatement = { kind: 'info_for_db' };
    const structure = this.acceptWord('STRUCTURE');
    if (structure) statement.structure = true;
    if (!parenthesized) return this.end(statement, structure ? STATEMENT_END : `STRUCTURE, ${STATEMENT_END}`);
    this.expectSymbol(')', structure ? "')'" : "STRUCTURE or ')'");
    const path: string[] = [];
    while (this.isSymbol('.')) {
      this.advance();
      const field = this.current;
      if (field.kind !== 'word' && field.kind !== 'name') this.fail('a field name');
      path.push(field.value);
      this.advance();
    }
    if (path.length > 0) statement.path = path;
    return this.end(statement, `'.', ${STATEMENT_END}`);
  }

  /** `sequence::nextval('name')`, RETURN already read. */
  private nextval(expected = 'sequence::nextval'): Statement {
    this.expectWord('SEQUENCE', expected);
    this.expectSymbol('::', "'::'");
    this.expectWord('NEXTVAL', 'nextval');
    this.expectSymbol('(', "'('");
    const token = this.value();
    if (token.kind !== 'string') this.fail('the sequence name as a quoted string', token);
    const name = this.checkedName(token);
    this.advance();
    this.expectSymbol(')', "')'");
    return this.end({ kind: 'nextval', name });
  }

  /**
   * A sequence name: bare, `backticked`, ⟨bracketed⟩ or a quoted string (as SurrealDB reads
   * `DEFINE SEQUENCE "test"`), or a parameter whose value is a string.
   */
  private name(): string {
    const token = this.value();
    const named =
      token.via === undefined
        ? token.kind === 'word' || token.kind === 'name' || token.kind === 'string'
        : token.kind === 'string';
    if (!named) this.fail('a sequence name', token);
    const name = this.checkedName(token);
    this.advance();
    return name;
  }

  /** The current token; for a parameter, the value LET gave it, placed where the parameter is. */
  private value(): Token {
    const token = this.current;
    if (token.kind !== 'param') return token;
    const value = this.params.get(token.value);
    if (value === undefined) {
      throw syntaxError(
        `${token.text} has no value: give it one with LET ${token.text} = … before it, found '${token.text}' at ${position(token)}`,
      );
    }
    return { ...value, line: token.line, column: token.column, via: token.text };
  }

  private checkedName(token: Token): string {
    return this.at(token, () => identifier('sequence name', token.value));
  }

  private integer(clause: Clause, min: number, max: number): number {
    const token = this.value();
    const value = token.kind === 'number' && /^-?\d+$/.test(token.text) ? Number(token.text) : Number.NaN;
    if (!Number.isSafeInteger(value) || value < min || value > max) {
      this.refuse(`${clause} must be a whole number from ${min} to ${max}`, token);
    }
    this.advance();
    return value;
  }

  /** A duration in milliseconds, or null for NONE (no timeout). */
  private timeout(clause: Clause): number | null {
    const token = this.value();
    if (isNone(token)) {
      this.advance();
      return null;
    }
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
    const token = this.value();
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
    const token = this.value();
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

  private fail(expected: string, token: Token = this.current): never {
    throw syntaxError(`expected ${expected}, found ${describeToken(token)} at ${position(token)}`);
  }

  private refuse(message: string, token: Token): never {
    throw invalid(`${message}, found ${describeToken(token)} at ${position(token)}`);
  }
}

function isNone(token: Token): boolean {
  return token.kind === 'word' && token.text.toUpperCase() === 'NONE';
}
