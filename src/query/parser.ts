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
  type InvalidValue,
  RESET_KEYWORDS,
  type Statement,
} from './statements.js';

type AlterSequenceStatement = Extract<Statement, { kind: 'alter_sequence' }>;
type InfoStatement = Extract<Statement, { kind: 'info_for_db' }>;

const STATEMENT_STARTS = 'DEFINE, ALTER, REMOVE, LET, RETURN, INFO or sequence::nextval';
const STATEMENT_END = "';' or end of input";
const DURATION_EXAMPLES = 'a duration such as 5s, 100ms or 1m30s, or NONE';
/** SurrealDB's words for a nextval() whose argument is not a string. */
const NEXTVAL_ARGUMENTS = 'Incorrect arguments for function sequence::nextval()(). Expect a sequence name';

/** Number tokens as SurrealDB's lexer reads them; any other number token does not parse. */
const INTEGER = /^-?\d+$/;
const FLOAT = /^-?\d+(?:\.\d+)?(?:[eE]\d+)?$/;
const DURATION_SYNTAX = /^-?(?:\d+(?:ns|us|µs|μs|ms|s|m|h|d|w|y))+$/;

/** A value as written: what SurrealDB would evaluate before casting it to what a clause takes. */
type Literal =
  | { type: 'integer'; text: string }
  | { type: 'float'; value: number }
  | { type: 'duration'; text: string; negated: boolean }
  | { type: 'string'; value: string }
  | { type: 'none' | 'null' };

/**
 * Parses `;`-separated statements of ordo's SurrealQL subset. All or nothing, as SurrealDB
 * parses its own: a syntax error refuses the whole text with an invalid_argument OrdoError,
 * and no statement is returned. A value that is well written but cannot be used (BATCH 0,
 * TIMEOUT 5, a name ordo does not allow) is no syntax error: its statement parses, carrying
 * `invalid`, and fails alone when it runs, as in SurrealDB.
 *
 * `LET $name = value` (a string, a number, a duration, NONE or NULL) gives later statements of the
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
  /** The value the statement being read cannot use, if any (see InvalidValue). */
  private invalid: InvalidValue | undefined;

  constructor(text: string) {
    this.lexer = new Lexer(text);
    this.current = this.lexer.next();
  }

  statements(): Statement[] {
    const statements: Statement[] = [];
    for (;;) {
      while (this.isSymbol(';')) this.advance();
      if (this.atEnd()) return statements;
      this.invalid = undefined;
      const statement = this.statement();
      if (this.invalid) statement.invalid = this.invalid;
      statements.push(statement);
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
    const nameToken = this.value();
    const name = this.name();
    if (!this.invalid) this.check(nameToken, 'if_absent', () => identifier('sequence name', name));
    const statement: DefineSequenceStatement = { kind: 'define_sequence', name, mode, gapless: false };
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
          const timeoutMs = this.timeout(clause, 'if_absent');
          // TIMEOUT NONE: none, as without the clause
          if (timeoutMs !== null && timeoutMs !== undefined) statement.timeoutMs = timeoutMs;
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
      const timeoutMs = this.timeout('TIMEOUT', 'if_present');
      if (timeoutMs !== undefined) statement.timeoutMs = timeoutMs;
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

  /** `LET $name = value`: a string, a number, a duration, NONE, NULL, or another parameter's value. */
  private let(): Statement {
    const param = this.current;
    if (param.kind !== 'param') this.fail('a parameter such as $name');
    this.advance();
    this.expectSymbol('=', "'='");
    const value = this.value();
    if (value.kind !== 'string' && value.kind !== 'number' && !isNone(value) && !isNull(value)) {
      this.refuse('LET takes a string, a number, a duration, NONE or NULL', value);
    }
    this.literal(value, 'a string, a number, a duration, NONE or NULL');
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

  /**
   * `sequence::nextval('name')`, RETURN already read. An argument that is not a string (a
   * number, NONE, a bare word, none at all) fails when the statement runs, as in SurrealDB; a
   * name ordo does not allow is no sequence's, so it fails as one that does not exist.
   */
  private nextval(expected = 'sequence::nextval'): Statement {
    this.expectWord('SEQUENCE', expected);
    this.expectSymbol('::', "'::'");
    this.expectWord('NEXTVAL', 'nextval');
    this.expectSymbol('(', "'('");
    let name = '';
    if (this.isSymbol(')')) {
      this.defer(NEXTVAL_ARGUMENTS);
    } else {
      const token = this.value();
      if (token.kind === 'string') name = token.value;
      else if (token.kind === 'word' || token.kind === 'name') this.defer(NEXTVAL_ARGUMENTS);
      else if (token.kind === 'number') {
        this.literal(token, 'the sequence name as a quoted string');
        this.defer(NEXTVAL_ARGUMENTS);
      } else this.fail('the sequence name as a quoted string', token);
      this.advance();
    }
    this.expectSymbol(')', "')'");
    return this.end({ kind: 'nextval', name });
  }

  /**
   * A sequence name: bare, `backticked`, ⟨bracketed⟩ or a quoted string (as SurrealDB reads
   * `DEFINE SEQUENCE "test"`), or a parameter whose value is a string (one whose value is not
   * fails when the statement runs, as in SurrealDB). Not checked here: DEFINE refuses a name
   * ordo does not allow when it runs, and no sequence has such a name for the others.
   */
  private name(): string {
    const token = this.value();
    if (token.via !== undefined && token.kind !== 'string') {
      this.defer(`Expected \`sequence name\` but found \`${shown(this.literal(token, 'a sequence name'))}\``);
      this.advance();
      return '';
    }
    if (token.kind !== 'word' && token.kind !== 'name' && token.kind !== 'string')
      this.fail('a sequence name', token);
    this.advance();
    return token.value;
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

  /**
   * What a value token holds. A number token SurrealDB's lexer would not read (`5x`, `1.5s`,
   * `5S`) and anything that is no value at all (`;`, a bare word) do not parse.
   */
  private literal(token: Token, expected: string): Literal {
    if (token.kind === 'string') return { type: 'string', value: token.value };
    if (isNone(token)) return { type: 'none' };
    if (isNull(token)) return { type: 'null' };
    if (token.kind === 'number') {
      if (INTEGER.test(token.text)) return { type: 'integer', text: token.text };
      if (FLOAT.test(token.text)) return { type: 'float', value: Number(token.text) };
      if (DURATION_SYNTAX.test(token.text)) {
        const negated = token.text.startsWith('-');
        return { type: 'duration', text: negated ? token.text.slice(1) : token.text, negated };
      }
    }
    return this.fail(expected, token);
  }

  /** A whole number within [min, max]; undefined, and the statement invalid, when the value is not one. */
  private integer(clause: Clause, min: number, max: number): number | undefined {
    const token = this.value();
    const literal = this.literal(token, `${clause}'s value, a whole number from ${min} to ${max}`);
    this.advance();
    const cast = castInteger(literal);
    if ('error' in cast) return this.defer(cast.error);
    const { value } = cast;
    if (!Number.isSafeInteger(value) || value < min || value > max) {
      return this.defer(
        `${clause} must be a whole number from ${min} to ${max}, found ${describeToken(token)} at ${position(token)}`,
        'if_absent',
      );
    }
    return value;
  }

  /**
   * A duration in milliseconds, or null for NONE (no timeout); undefined, and the statement
   * invalid, when the value is not one (`when`: for a duration out of bounds).
   */
  private timeout(clause: Clause, when: InvalidValue['when']): number | null | undefined {
    const token = this.value();
    const literal = this.literal(token, `${clause}'s value, ${DURATION_EXAMPLES}`);
    this.advance();
    // SurrealDB casts first; ALTER looks the sequence up before it evaluates anything.
    const cast = castDuration(literal);
    if (cast === null) return null;
    if ('error' in cast) return this.defer(cast.error, when === 'if_present' ? when : 'first');
    try {
      return parseDuration(cast.value);
    } catch (e) {
      return this.defer(`${clause}: ${(e as Error).message} at ${position(token)}`, when);
    }
  }

  /**
   * Marks the statement being read invalid: it will fail with `message` when it runs. The
   * first value of the wrong kind wins (SurrealDB evaluates every value before it checks
   * bounds), otherwise the first value found.
   */
  private defer(message: string, when: InvalidValue['when'] = 'first'): undefined {
    if (this.invalid === undefined || (when === 'first' && this.invalid.when !== 'first')) {
      this.invalid = { message, when };
    }
    return undefined;
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

  private timeZone(): string | undefined {
    const token = this.value();
    const rule = `TIMEZONE must be a quoted IANA time zone name of 1 to ${MAX_TIME_ZONE_LENGTH} characters, such as 'Europe/Paris'`;
    const literal = this.literal(token, rule.replace('TIMEZONE must be', "TIMEZONE's value,"));
    this.advance();
    if (
      literal.type !== 'string' ||
      literal.value.length === 0 ||
      literal.value.length > MAX_TIME_ZONE_LENGTH
    ) {
      return this.defer(
        `${rule}, found ${describeToken(token)} at ${position(token)}`,
        literal.type === 'string' ? 'if_absent' : 'first',
      );
    }
    return literal.value;
  }

  private format(): string | undefined {
    const token = this.value();
    const rule = "FORMAT must be a quoted text such as 'INV-{YYYY}-{n:6}'";
    const literal = this.literal(token, rule.replace('FORMAT must be', "FORMAT's value,"));
    this.advance();
    if (literal.type !== 'string')
      return this.defer(`${rule}, found ${describeToken(token)} at ${position(token)}`);
    return this.check(token, 'if_absent', () => validateFormat(literal.value));
  }

  /** Runs a library check of a token's value: what it refuses makes the statement invalid, at the token. */
  private check<T>(token: Token, when: InvalidValue['when'], run: () => T): T | undefined {
    try {
      return run();
    } catch (e) {
      if (!(e instanceof OrdoError)) throw e;
      return this.defer(`${e.message} at ${position(token)}`, when);
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

function isNull(token: Token): boolean {
  return token.kind === 'word' && token.text.toUpperCase() === 'NULL';
}

/** A value as SurrealDB shows it in an error: `'x'`, `1.5f`, `5s`, `NONE`. */
function shown(literal: Literal): string {
  switch (literal.type) {
    case 'integer':
      return String(BigInt(literal.text));
    case 'float':
      return `${literal.value}f`;
    case 'duration':
      return literal.negated ? `-${literal.text}` : literal.text;
    case 'string':
      return literal.value.includes("'") && !literal.value.includes('"')
        ? `"${literal.value}"`
        : `'${literal.value.replaceAll("'", "\\'")}'`;
    case 'none':
      return 'NONE';
    case 'null':
      return 'NULL';
  }
}

/** SurrealDB evaluates `-5s` before it casts it, and cannot. */
function negated(literal: Literal): string | undefined {
  return literal.type === 'duration' && literal.negated
    ? `Cannot negate the value '${literal.text}'`
    : undefined;
}

/** A value cast as SurrealDB casts it, or SurrealDB's words for why it cannot be. */
type Cast<T> = { value: T } | { error: string };

/** A value cast to a whole number: `'5'`, `5.0` and `1e3` are whole numbers, `1.5` and `5s` are not. */
function castInteger(literal: Literal): Cast<number> {
  if (literal.type === 'integer') return { value: Number(literal.text) };
  if (literal.type === 'float' && Number.isInteger(literal.value)) return { value: literal.value };
  if (literal.type === 'string' && /^[+-]?\d+$/.test(literal.value)) return { value: Number(literal.value) };
  return { error: negated(literal) ?? `Could not cast into \`int\` using input \`${shown(literal)}\`` };
}

/** A value cast to a duration, as its text (`'5s'` is one, `5` is not); null for NONE. */
function castDuration(literal: Literal): Cast<string> | null {
  if (literal.type === 'none') return null;
  if (literal.type === 'duration' && !literal.negated) return { value: literal.text };
  const text = literal.type === 'string' ? literal.value.trim() : '';
  if (text !== '' && DURATION_SYNTAX.test(text) && !text.startsWith('-')) return { value: text };
  return { error: negated(literal) ?? `Could not cast into \`duration\` using input \`${shown(literal)}\`` };
}
