import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { formatDuration, parseDuration } from '../src/durations.js';
import { OrdoError } from '../src/errors.js';
import { describeToken, tokenize } from '../src/query/lexer.js';
import { parseStatements } from '../src/query/parser.js';
import {
  type DefineSequenceStatement,
  defineStatementText,
  type InvalidValue,
  KEYWORDS,
  type PrintableDefinition,
  type Statement,
} from '../src/query/statements.js';
import { FORMAT_TOKENS } from '../src/sequences/format.js';
import { MAX_VALUE } from '../src/validate.js';

/** The invalid_argument OrdoError that `action` throws; fails if it returns instead. */
function refusal(action: () => unknown): OrdoError {
  let result: unknown;
  try {
    result = action();
  } catch (e) {
    expect(e).toBeInstanceOf(OrdoError);
    expect((e as OrdoError).code).toBe('invalid_argument');
    return e as OrdoError;
  }
  throw new Error(`expected a refusal, got ${JSON.stringify(result)}`);
}

function parseError(text: string): string {
  return refusal(() => parseStatements(text)).message;
}

function define(rest: Partial<DefineSequenceStatement> & { name: string }): Statement {
  return { kind: 'define_sequence', mode: 'create', gapless: false, ...rest };
}

const NAME_RULE =
  'sequence name must be an identifier: a letter or underscore, then letters, digits or underscores, at most 63 characters';
const NEXTVAL_ARGUMENTS = 'Incorrect arguments for function sequence::nextval()(). Expect a sequence name';
const first = (message: string): InvalidValue => ({ message, when: 'first' });
const ifAbsent = (message: string): InvalidValue => ({ message, when: 'if_absent' });
const CLAUSE_LIST =
  "BATCH, START, TIMEOUT, GAPLESS, INCREMENT, MAXVALUE, CYCLE, RESET, TIMEZONE, FORMAT, ';' or end of input";

describe('SurrealDB documentation examples', () => {
  it('DEFINE SEQUENCE mySeq2 … ; sequence::nextval(…)', () => {
    expect(
      parseStatements("DEFINE SEQUENCE mySeq2 BATCH 1000 START 100 TIMEOUT 5s; sequence::nextval('mySeq2');"),
    ).toStrictEqual([
      {
        kind: 'define_sequence',
        name: 'mySeq2',
        mode: 'create',
        gapless: false,
        batch: 1000,
        start: 100,
        timeoutMs: 5000,
      },
      { kind: 'nextval', name: 'mySeq2' },
    ]);
  });

  it('DEFINE SEQUENCE mySeq3 … TIMEOUT 0s', () => {
    expect(parseStatements('DEFINE SEQUENCE mySeq3 BATCH 1000 START 100 TIMEOUT 0s;')).toStrictEqual([
      {
        kind: 'define_sequence',
        name: 'mySeq3',
        mode: 'create',
        gapless: false,
        batch: 1000,
        start: 100,
        timeoutMs: 0,
      },
    ]);
  });
});

describe('parseStatements', () => {
  it('reads keywords in any case', () => {
    expect(parseStatements('define sequence x batch 10')).toStrictEqual([define({ name: 'x', batch: 10 })]);
    expect(parseStatements('DeFiNe SeQuEnCe x BaTcH 10')).toStrictEqual([define({ name: 'x', batch: 10 })]);
    expect(parseStatements('SEQUENCE::NEXTVAL(\'x\'); Sequence::NextVal("y")')).toStrictEqual([
      { kind: 'nextval', name: 'x' },
      { kind: 'nextval', name: 'y' },
    ]);
    expect(parseStatements('info for db; INFO FOR DATABASE; Info For Database')).toStrictEqual([
      { kind: 'info_for_db' },
      { kind: 'info_for_db' },
      { kind: 'info_for_db' },
    ]);
  });

  it('keeps the case of names', () => {
    expect(parseStatements('DEFINE SEQUENCE MySeq')).toStrictEqual([define({ name: 'MySeq' })]);
  });

  it('reads every clause of DEFINE SEQUENCE', () => {
    const cases: [string, Partial<DefineSequenceStatement>][] = [
      ['', {}],
      ['BATCH 1', { batch: 1 }],
      ['BATCH 1000000', { batch: 1_000_000 }],
      ['START 0', { start: 0 }],
      ['START -5', { start: -5 }],
      ['START 9007199254740991', { start: MAX_VALUE }],
      ['START -9007199254740991', { start: -MAX_VALUE }],
      ['TIMEOUT 0s', { timeoutMs: 0 }],
      ['TIMEOUT 1m30s', { timeoutMs: 90_000 }],
      ['GAPLESS', { gapless: true }],
      ['INCREMENT 1', { increment: 1 }],
      ['INCREMENT 10', { increment: 10 }],
      ['MAXVALUE 999', { maxValue: 999 }],
      ['MAXVALUE -1', { maxValue: -1 }],
      ['CYCLE', { cycle: true }],
      ['RESET DAILY', { reset: 'day' }],
      ['RESET weekly', { reset: 'week' }],
      ['RESET Monthly', { reset: 'month' }],
      ['RESET YEARLY', { reset: 'year' }],
      ["TIMEZONE 'Europe/Paris'", { timeZone: 'Europe/Paris' }],
      ['TIMEZONE "America/New_York"', { timeZone: 'America/New_York' }],
      ["FORMAT 'INV-{YYYY}-{n:6}'", { format: 'INV-{YYYY}-{n:6}' }],
      ["FORMAT 'it\\'s {n}\\t\\\\ \\\"x\\\"\\n'", { format: 'it\'s {n}\t\\ "x"\n' }],
    ];
    for (const [clause, fields] of cases) {
      expect(parseStatements(`DEFINE SEQUENCE s ${clause}`), clause).toStrictEqual([
        define({ name: 's', ...fields }),
      ]);
    }
  });

  it('reads OVERWRITE and IF NOT EXISTS', () => {
    expect(parseStatements('DEFINE SEQUENCE OVERWRITE s GAPLESS')).toStrictEqual([
      define({ name: 's', mode: 'overwrite', gapless: true }),
    ]);
    expect(parseStatements('define sequence if not exists s')).toStrictEqual([
      define({ name: 's', mode: 'if_not_exists' }),
    ]);
  });

  it('reads a gapless definition with every extension', () => {
    const text = `DEFINE SEQUENCE IF NOT EXISTS invoice GAPLESS START 1 INCREMENT 2 MAXVALUE 999999 CYCLE
      RESET YEARLY TIMEZONE 'Europe/Paris' FORMAT 'INV-{YYYY}-{n:6}' TIMEOUT 2s`;
    expect(parseStatements(text)).toStrictEqual([
      define({
        name: 'invoice',
        mode: 'if_not_exists',
        gapless: true,
        start: 1,
        increment: 2,
        maxValue: 999_999,
        cycle: true,
        reset: 'year',
        timeZone: 'Europe/Paris',
        format: 'INV-{YYYY}-{n:6}',
        timeoutMs: 2000,
      }),
    ]);
  });

  it('accepts the clauses in any order', () => {
    const expected = [define({ name: 's', batch: 10, start: -5, timeoutMs: 5000 })];
    for (const text of [
      'DEFINE SEQUENCE s BATCH 10 START -5 TIMEOUT 5s',
      'DEFINE SEQUENCE s TIMEOUT 5s BATCH 10 START -5',
      'DEFINE SEQUENCE s START -5 TIMEOUT 5s BATCH 10',
      'DEFINE SEQUENCE s TIMEOUT 5s START -5 BATCH 10',
    ]) {
      expect(parseStatements(text), text).toStrictEqual(expected);
    }
  });

  it('accepts any subset of clauses in any order, in any case, with any spacing (property)', () => {
    const clause = (keyword: string, text: string, fields: Partial<DefineSequenceStatement>) => ({
      keyword,
      text,
      fields,
    });
    const clauses = fc.tuple(
      fc.integer({ min: 1, max: 1_000_000 }).map((n) => clause('BATCH', `${n}`, { batch: n })),
      fc.maxSafeInteger().map((n) => clause('START', `${n}`, { start: n })),
      fc
        .integer({ min: 0, max: 10 ** 9 })
        .map((ms) => clause('TIMEOUT', formatDuration(ms), { timeoutMs: ms })),
      fc.constant(clause('GAPLESS', '', { gapless: true })),
      fc.integer({ min: 1, max: MAX_VALUE }).map((n) => clause('INCREMENT', `${n}`, { increment: n })),
      fc.maxSafeInteger().map((n) => clause('MAXVALUE', `${n}`, { maxValue: n })),
      fc.constant(clause('CYCLE', '', { cycle: true })),
      fc
        .constantFrom(['DAILY', 'day'], ['WEEKLY', 'week'], ['MONTHLY', 'month'], ['YEARLY', 'year'] as const)
        .map(([word, reset]) => clause('RESET', word, { reset })),
      fc
        .constantFrom('UTC', 'Europe/Paris', 'Asia/Kolkata')
        .map((z) => clause('TIMEZONE', `'${z}'`, { timeZone: z })),
      fc.constantFrom('{n}', 'INV-{YYYY}-{n:6}').map((f) => clause('FORMAT', `"${f}"`, { format: f })),
    );
    const gap = fc.constantFrom(' ', '  ', '\n', '\r\n', '\t', ' /* c */ ', ' -- c\n', ' // c\n', ' # c\n');
    fc.assert(
      fc.property(
        clauses.chain((all) => fc.shuffledSubarray([...all])),
        fc.array(gap, { minLength: 40, maxLength: 40 }),
        fc.array(fc.boolean(), { minLength: 20, maxLength: 20 }),
        (chosen, gaps, lower) => {
          let g = 0;
          const sep = () => gaps[g++ % gaps.length]!;
          const kw = (word: string, i: number) => (lower[i % lower.length] ? word.toLowerCase() : word);
          let text = `${kw('DEFINE', 0)}${sep()}${kw('SEQUENCE', 1)}${sep()}s`;
          const expected: DefineSequenceStatement = define({ name: 's' }) as DefineSequenceStatement;
          chosen.forEach((c, i) => {
            text += `${sep()}${kw(c.keyword, i + 2)}`;
            if (c.text) text += `${sep()}${c.keyword === 'RESET' ? kw(c.text, i + 3) : c.text}`;
            Object.assign(expected, c.fields);
          });
          expect(parseStatements(`${text}${sep()};`)).toStrictEqual([expected]);
        },
      ),
    );
  });

  it('reads ALTER SEQUENCE', () => {
    expect(parseStatements('ALTER SEQUENCE s TIMEOUT 5s; alter sequence s drop timeout')).toStrictEqual([
      { kind: 'alter_sequence', name: 's', ifExists: false, timeoutMs: 5000 },
      { kind: 'alter_sequence', name: 's', ifExists: false, timeoutMs: null },
    ]);
  });

  it('reads ALTER SEQUENCE as SurrealDB 3 writes it: IF EXISTS, TIMEOUT NONE, or no clause', () => {
    expect(
      parseStatements(
        'ALTER SEQUENCE seq TIMEOUT NONE; ALTER SEQUENCE IF EXISTS nope TIMEOUT 5s; ALTER SEQUENCE seq; alter sequence if exists `if` timeout none',
      ),
    ).toStrictEqual([
      { kind: 'alter_sequence', name: 'seq', ifExists: false, timeoutMs: null },
      { kind: 'alter_sequence', name: 'nope', ifExists: true, timeoutMs: 5000 },
      { kind: 'alter_sequence', name: 'seq', ifExists: false },
      { kind: 'alter_sequence', name: 'if', ifExists: true, timeoutMs: null },
    ]);
  });

  it('reads TIMEOUT NONE in DEFINE SEQUENCE as no timeout', () => {
    expect(
      parseStatements('DEFINE SEQUENCE s TIMEOUT NONE BATCH 5; DEFINE SEQUENCE t timeout none'),
    ).toStrictEqual([define({ name: 's', batch: 5 }), define({ name: 't' })]);
  });

  it('reads names given as strings, as SurrealDB does', () => {
    expect(
      parseStatements(
        `DEFINE SEQUENCE "test" BATCH 5; DEFINE SEQUENCE OVERWRITE 'b'; REMOVE SEQUENCE IF EXISTS "test"; ALTER SEQUENCE 'b' TIMEOUT 1s`,
      ),
    ).toStrictEqual([
      define({ name: 'test', batch: 5 }),
      define({ name: 'b', mode: 'overwrite' }),
      { kind: 'remove_sequence', name: 'test', ifExists: true },
      { kind: 'alter_sequence', name: 'b', ifExists: false, timeoutMs: 1000 },
    ]);
  });

  it("reads LET and puts each parameter's value in its place", () => {
    const text = `LET $name = "test"; LET $batch = 100; LET $start = -5; LET $timeout = 5s; LET $none = NONE;
      DEFINE SEQUENCE $name BATCH $batch START $start TIMEOUT $timeout;
      DEFINE SEQUENCE OVERWRITE $name TIMEOUT $none;
      LET $tz = 'Europe/Paris'; LET $f = 'T-{n}'; LET $copy = $name;
      DEFINE SEQUENCE g GAPLESS TIMEZONE $tz FORMAT $f INCREMENT $batch MAXVALUE $batch;
      ALTER SEQUENCE $copy TIMEOUT $none; ALTER SEQUENCE $name TIMEOUT $timeout;
      sequence::nextval($copy); REMOVE SEQUENCE IF EXISTS $name;
      LET $name = 'other'; RETURN sequence::nextval($name)`;
    expect(parseStatements(text)).toStrictEqual([
      { kind: 'let', name: 'name' },
      { kind: 'let', name: 'batch' },
      { kind: 'let', name: 'start' },
      { kind: 'let', name: 'timeout' },
      { kind: 'let', name: 'none' },
      define({ name: 'test', batch: 100, start: -5, timeoutMs: 5000 }),
      define({ name: 'test', mode: 'overwrite' }),
      { kind: 'let', name: 'tz' },
      { kind: 'let', name: 'f' },
      { kind: 'let', name: 'copy' },
      define({
        name: 'g',
        gapless: true,
        timeZone: 'Europe/Paris',
        format: 'T-{n}',
        increment: 100,
        maxValue: 100,
      }),
      { kind: 'alter_sequence', name: 'test', ifExists: false, timeoutMs: null },
      { kind: 'alter_sequence', name: 'test', ifExists: false, timeoutMs: 5000 },
      { kind: 'nextval', name: 'test' },
      { kind: 'remove_sequence', name: 'test', ifExists: true },
      { kind: 'let', name: 'name' },
      { kind: 'nextval', name: 'other' },
    ]);
  });

  it('reads INFO FOR DB [STRUCTURE], with RETURN, and in parentheses with fields', () => {
    expect(
      parseStatements(
        'INFO FOR DB STRUCTURE; RETURN INFO FOR DB; (INFO FOR DB).sequences; RETURN (info for database structure).sequences.name; (INFO FOR DB); (INFO FOR DB).`sequences`.⟨a⟩',
      ),
    ).toStrictEqual([
      { kind: 'info_for_db', structure: true },
      { kind: 'info_for_db' },
      { kind: 'info_for_db', path: ['sequences'] },
      { kind: 'info_for_db', structure: true, path: ['sequences', 'name'] },
      { kind: 'info_for_db' },
      { kind: 'info_for_db', path: ['sequences', 'a'] },
    ]);
  });

  it('reads REMOVE SEQUENCE', () => {
    expect(parseStatements('REMOVE SEQUENCE s; remove sequence if exists t')).toStrictEqual([
      { kind: 'remove_sequence', name: 's', ifExists: false },
      { kind: 'remove_sequence', name: 't', ifExists: true },
    ]);
  });

  it('reads sequence::nextval with or without RETURN, with spaces anywhere', () => {
    expect(
      parseStatements(
        `RETURN sequence::nextval('a'); sequence :: nextval ( "b" ); return SEQUENCE::NEXTVAL('c')`,
      ),
    ).toStrictEqual([
      { kind: 'nextval', name: 'a' },
      { kind: 'nextval', name: 'b' },
      { kind: 'nextval', name: 'c' },
    ]);
  });

  it('reads quoted names', () => {
    expect(
      parseStatements('DEFINE SEQUENCE `mySeq`; REMOVE SEQUENCE ⟨mySeq⟩; ALTER SEQUENCE `b` DROP TIMEOUT'),
    ).toStrictEqual([
      define({ name: 'mySeq' }),
      { kind: 'remove_sequence', name: 'mySeq', ifExists: false },
      { kind: 'alter_sequence', name: 'b', ifExists: false, timeoutMs: null },
    ]);
    // Quoted, a keyword is a name; bare, keywords that follow SEQUENCE are names too.
    expect(
      parseStatements('DEFINE SEQUENCE `if`; DEFINE SEQUENCE ⟨overwrite⟩; DEFINE SEQUENCE batch BATCH 5'),
    ).toStrictEqual([
      define({ name: 'if' }),
      define({ name: 'overwrite' }),
      define({ name: 'batch', batch: 5 }),
    ]);
    expect(parseStatements(`DEFINE SEQUENCE ${'a'.repeat(63)}`)).toStrictEqual([
      define({ name: 'a'.repeat(63) }),
    ]);
  });

  it('skips comments of every kind', () => {
    const text = `-- a comment
      DEFINE /* inline */ SEQUENCE s // to the end of the line
      # hash comment ; not a separator
      BATCH /* multi
      line */ 10 -- START 5
      ; /* ; */ INFO FOR DB -- last`;
    expect(parseStatements(text)).toStrictEqual([define({ name: 's', batch: 10 }), { kind: 'info_for_db' }]);
    expect(parseStatements("DEFINE SEQUENCE s FORMAT '-- {n} /* */ #'")).toStrictEqual([
      define({ name: 's', format: '-- {n} /* */ #' }),
    ]);
  });

  it('ignores empty statements', () => {
    expect(parseStatements('')).toStrictEqual([]);
    expect(parseStatements('  \n\t ')).toStrictEqual([]);
    expect(parseStatements('-- only a comment')).toStrictEqual([]);
    expect(parseStatements(';;;')).toStrictEqual([]);
    expect(parseStatements(';INFO FOR DB;; ;\n;INFO FOR DB;')).toStrictEqual([
      { kind: 'info_for_db' },
      { kind: 'info_for_db' },
    ]);
  });

  it('reads multi-line input with Unix, Windows and old Mac line ends', () => {
    for (const eol of ['\n', '\r\n', '\r']) {
      const text = ['DEFINE SEQUENCE a', '  BATCH 10', '  START 5;', 'sequence::nextval(', "  'a'", ')'].join(
        eol,
      );
      expect(parseStatements(text)).toStrictEqual([
        define({ name: 'a', batch: 10, start: 5 }),
        { kind: 'nextval', name: 'a' },
      ]);
      expect(parseError(['INFO FOR DB;', '', '  DEFINE SEQUENCE b BATCH ten;'].join(eol))).toBe(
        "Parse error: expected BATCH's value, a whole number from 1 to 1000000, found 'ten' at 3:27",
      );
      expect(
        parseStatements(['INFO FOR DB;', '', '  DEFINE SEQUENCE b BATCH 0;'].join(eol))[1]!.invalid,
      ).toEqual({
        message: "BATCH must be a whole number from 1 to 1000000, found '0' at 3:27",
        when: 'if_absent',
      });
    }
  });
});

describe('parse errors', () => {
  const cases: [string, string][] = [
    // statement starts
    [
      'SELECT * FROM x',
      "Parse error: expected DEFINE, ALTER, REMOVE, LET, RETURN, INFO or sequence::nextval, found 'SELECT' at 1:1",
    ],
    [
      'INFO FOR DB;\nSELECT 1',
      "Parse error: expected DEFINE, ALTER, REMOVE, LET, RETURN, INFO or sequence::nextval, found 'SELECT' at 2:1",
    ],
    [
      "'x'",
      "Parse error: expected DEFINE, ALTER, REMOVE, LET, RETURN, INFO or sequence::nextval, found string 'x' at 1:1",
    ],
    ['(', 'Parse error: expected INFO, found end of input at 1:2'],
    [
      '$x',
      "Parse error: expected DEFINE, ALTER, REMOVE, LET, RETURN, INFO or sequence::nextval, found '$x' at 1:1",
    ],
    [
      '/* 😀 */ SELECT',
      "Parse error: expected DEFINE, ALTER, REMOVE, LET, RETURN, INFO or sequence::nextval, found 'SELECT' at 1:9",
    ],
    // DEFINE
    ['DEFINE TABLE x', "Parse error: expected SEQUENCE, found 'TABLE' at 1:8"],
    ['DEFINE', 'Parse error: expected SEQUENCE, found end of input at 1:7'],
    ['DEFINE SEQUENCE ;', "Parse error: expected a sequence name, found ';' at 1:17"],
    ['DEFINE SEQUENCE', 'Parse error: expected a sequence name, found end of input at 1:16'],
    ['DEFINE SEQUENCE 5', "Parse error: expected a sequence name, found '5' at 1:17"],
    ['DEFINE SEQUENCE 1x', "Parse error: expected a sequence name, found '1x' at 1:17"],
    ['DEFINE SEQUENCE IF EXISTS s', "Parse error: expected NOT, found 'EXISTS' at 1:20"],
    ['DEFINE SEQUENCE IF NOT s', "Parse error: expected EXISTS, found 's' at 1:24"],
    ['DEFINE SEQUENCE OVERWRITE ;', "Parse error: expected a sequence name, found ';' at 1:27"],
    ['DEFINE SEQUENCE s BATCH 10 FOO', `Parse error: expected ${CLAUSE_LIST}, found 'FOO' at 1:28`],
    ['DEFINE SEQUENCE s @', `Parse error: expected ${CLAUSE_LIST}, found '@' at 1:19`],
    ['DEFINE SEQUENCE s BATCH 10 INFO FOR DB', `Parse error: expected ${CLAUSE_LIST}, found 'INFO' at 1:28`],
    // repeated clauses
    [
      'DEFINE SEQUENCE s BATCH 1 BATCH 2',
      'Parse error: BATCH may be given only once, found a second BATCH at 1:27',
    ],
    [
      'DEFINE SEQUENCE s GAPLESS START 1 gapless',
      'Parse error: GAPLESS may be given only once, found a second GAPLESS at 1:35',
    ],
    [
      'DEFINE SEQUENCE s CYCLE CYCLE',
      'Parse error: CYCLE may be given only once, found a second CYCLE at 1:25',
    ],
    [
      "DEFINE SEQUENCE s TIMEZONE 'UTC' timezone 'UTC'",
      'Parse error: TIMEZONE may be given only once, found a second TIMEZONE at 1:34',
    ],
    // values: what is no value at all, or a number SurrealDB's lexer would not read
    [
      'DEFINE SEQUENCE s BATCH ten',
      "Parse error: expected BATCH's value, a whole number from 1 to 1000000, found 'ten' at 1:25",
    ],
    [
      'DEFINE SEQUENCE s BATCH',
      "Parse error: expected BATCH's value, a whole number from 1 to 1000000, found end of input at 1:24",
    ],
    [
      'DEFINE SEQUENCE s BATCH;',
      "Parse error: expected BATCH's value, a whole number from 1 to 1000000, found ';' at 1:24",
    ],
    [
      'DEFINE SEQUENCE s START - 5',
      "Parse error: expected START's value, a whole number from -9007199254740991 to 9007199254740991, found '-' at 1:25",
    ],
    [
      'DEFINE SEQUENCE s MAXVALUE max',
      "Parse error: expected MAXVALUE's value, a whole number from -9007199254740991 to 9007199254740991, found 'max' at 1:28",
    ],
    [
      'DEFINE SEQUENCE s TIMEOUT 5x',
      "Parse error: expected TIMEOUT's value, a duration such as 5s, 100ms or 1m30s, or NONE, found '5x' at 1:27",
    ],
    [
      'DEFINE SEQUENCE s TIMEOUT 5S',
      "Parse error: expected TIMEOUT's value, a duration such as 5s, 100ms or 1m30s, or NONE, found '5S' at 1:27",
    ],
    [
      'DEFINE SEQUENCE s TIMEOUT 1.5s',
      "Parse error: expected TIMEOUT's value, a duration such as 5s, 100ms or 1m30s, or NONE, found '1.5s' at 1:27",
    ],
    [
      'DEFINE SEQUENCE s TIMEOUT s',
      "Parse error: expected TIMEOUT's value, a duration such as 5s, 100ms or 1m30s, or NONE, found 's' at 1:27",
    ],
    [
      'ALTER SEQUENCE s TIMEOUT 5s5',
      "Parse error: expected TIMEOUT's value, a duration such as 5s, 100ms or 1m30s, or NONE, found '5s5' at 1:26",
    ],
    // RESET, TIMEZONE, FORMAT
    [
      'DEFINE SEQUENCE s RESET HOURLY',
      "RESET must be DAILY, WEEKLY, MONTHLY or YEARLY, found 'HOURLY' at 1:25",
    ],
    [
      "DEFINE SEQUENCE s RESET 'daily'",
      "RESET must be DAILY, WEEKLY, MONTHLY or YEARLY, found string 'daily' at 1:25",
    ],
    [
      'DEFINE SEQUENCE s TIMEZONE Europe',
      "Parse error: expected TIMEZONE's value, a quoted IANA time zone name of 1 to 64 characters, such as 'Europe/Paris', found 'Europe' at 1:28",
    ],
    [
      'DEFINE SEQUENCE s FORMAT INV',
      "Parse error: expected FORMAT's value, a quoted text such as 'INV-{YYYY}-{n:6}', found 'INV' at 1:26",
    ],
    // ALTER, REMOVE
    ['ALTER TABLE s', "Parse error: expected SEQUENCE, found 'TABLE' at 1:7"],
    ['ALTER SEQUENCE', 'Parse error: expected a sequence name, found end of input at 1:15'],
    ['ALTER SEQUENCE IF s', "Parse error: expected EXISTS, found 's' at 1:19"],
    [
      'ALTER SEQUENCE s BATCH 5',
      "Parse error: expected TIMEOUT, DROP TIMEOUT, ';' or end of input, found 'BATCH' at 1:18",
    ],
    ['ALTER SEQUENCE s DROP BATCH', "Parse error: expected TIMEOUT, found 'BATCH' at 1:23"],
    [
      'ALTER SEQUENCE s TIMEOUT 5s BATCH 1',
      "Parse error: expected ';' or end of input, found 'BATCH' at 1:29",
    ],
    ['ALTER SEQUENCE s TIMEOUT NONE 5s', "Parse error: expected ';' or end of input, found '5s' at 1:31"],
    ['REMOVE SEQUENCE IF s', "Parse error: expected EXISTS, found 's' at 1:20"],
    ['REMOVE SEQUENCE s t', "Parse error: expected ';' or end of input, found 't' at 1:19"],
    // nextval
    ['RETURN 5', "Parse error: expected INFO FOR DB or sequence::nextval, found '5' at 1:8"],
    [
      'sequence::nextval(5x)',
      "Parse error: expected the sequence name as a quoted string, found '5x' at 1:19",
    ],
    ['sequence::nextval(;)', "Parse error: expected the sequence name as a quoted string, found ';' at 1:19"],
    ["sequence:nextval('a')", "Parse error: expected '::', found ':' at 1:9"],
    ["sequence::next('a')", "Parse error: expected nextval, found 'next' at 1:11"],
    ["sequence::nextval 'a'", "Parse error: expected '(', found string 'a' at 1:19"],
    ["sequence::nextval('a'", "Parse error: expected ')', found end of input at 1:22"],
    ["sequence::nextval('a', 'b')", "Parse error: expected ')', found ',' at 1:22"],
    ["sequence::nextval('a') + 1", "Parse error: expected ';' or end of input, found '+' at 1:24"],
    // INFO
    ['INFO DB', "Parse error: expected FOR, found 'DB' at 1:6"],
    ['INFO FOR TABLE x', "Parse error: expected DB or DATABASE, found 'TABLE' at 1:10"],
    ['INFO FOR DB INFO FOR DB', "Parse error: expected STRUCTURE, ';' or end of input, found 'INFO' at 1:13"],
    ['INFO FOR DB STRUCTURE x', "Parse error: expected ';' or end of input, found 'x' at 1:23"],
    ['(INFO FOR DB', "Parse error: expected STRUCTURE or ')', found end of input at 1:13"],
    ['(INFO FOR DB STRUCTURE', "Parse error: expected ')', found end of input at 1:23"],
    ['(INFO FOR DB).', 'Parse error: expected a field name, found end of input at 1:15'],
    ["(INFO FOR DB).'sequences'", "Parse error: expected a field name, found string 'sequences' at 1:15"],
    ['(INFO FOR DB) x', "Parse error: expected '.', ';' or end of input, found 'x' at 1:15"],
    // LET and parameters
    ['LET x = 1', "Parse error: expected a parameter such as $name, found 'x' at 1:5"],
    ['LET $x 1', "Parse error: expected '=', found '1' at 1:8"],
    ['LET $x = abc', "LET takes a string, a number, a duration, NONE or NULL, found 'abc' at 1:10"],
    ['LET $x = (1)', "LET takes a string, a number, a duration, NONE or NULL, found '(' at 1:10"],
    ['LET $x = 5x', "Parse error: expected a string, a number, a duration, NONE or NULL, found '5x' at 1:10"],
    ['LET $x = 1 2', "Parse error: expected ';' or end of input, found '2' at 1:12"],
    [
      'DEFINE SEQUENCE $nope',
      "Parse error: $nope has no value: give it one with LET $nope = … before it, found '$nope' at 1:17",
    ],
    [
      'DEFINE SEQUENCE $x; LET $x = "a"',
      "Parse error: $x has no value: give it one with LET $x = … before it, found '$x' at 1:17",
    ],
    // lexical errors
    ["DEFINE SEQUENCE s FORMAT 'INV-{n}", 'Parse error: unterminated string starting at 1:26'],
    ['sequence::nextval("a', 'Parse error: unterminated string starting at 1:19'],
    ["sequence::nextval('a\\", 'Parse error: unterminated string starting at 1:19'],
    ['INFO FOR DB; /* never closed', 'Parse error: unterminated comment starting at 1:14'],
    ['DEFINE SEQUENCE `abc', 'Parse error: unterminated quoted name starting at 1:17'],
    ['DEFINE SEQUENCE ⟨abc', 'Parse error: unterminated quoted name starting at 1:17'],
    [
      "DEFINE SEQUENCE s FORMAT 'a\\r{n}'",
      "Parse error: unknown escape '\\r' in a string at 1:28; known escapes: \\\\ \\' \\\" \\n \\t",
    ],
  ];

  it.each(cases)('refuses %j', (text, message) => {
    expect(parseError(text)).toBe(message);
  });

  it('points at line 3 of multi-line input', () => {
    const head = 'DEFINE SEQUENCE a BATCH 10;\n-- second line\n';
    expect(parseError(`${head}  DEFINE SEQUENCE b BATCH;`)).toBe(
      "Parse error: expected BATCH's value, a whole number from 1 to 1000000, found ';' at 3:26",
    );
    expect(parseError(`${head}  SELECT 1`)).toBe(
      "Parse error: expected DEFINE, ALTER, REMOVE, LET, RETURN, INFO or sequence::nextval, found 'SELECT' at 3:3",
    );
    expect(parseError(`${head}DEFINE SEQUENCE ;`)).toBe(
      "Parse error: expected a sequence name, found ';' at 3:17",
    );
    expect(parseError(`${head}DEFINE SEQUENCE b\tTIMEOUT 5x`)).toBe(
      "Parse error: expected TIMEOUT's value, a duration such as 5s, 100ms or 1m30s, or NONE, found '5x' at 3:27",
    );
    expect(parseError(`${head}DEFINE SEQUENCE b START 1 START 2`)).toBe(
      'Parse error: START may be given only once, found a second START at 3:27',
    );
    expect(parseStatements(`${head}DEFINE SEQUENCE \`x-y\``)[1]!.invalid?.message).toBe(
      `${NAME_RULE} (got "x-y") at 3:17`,
    );
    expect(parseError(`${head}sequence::nextval('a\n\nb`)).toBe(
      'Parse error: unterminated string starting at 3:19',
    );
    expect(parseError(`${head}  /* a\n b`)).toBe('Parse error: unterminated comment starting at 3:3');
    expect(parseError(`DEFINE SEQUENCE a FORMAT 'x\ny{n}'; INFO\n\n  FOR TABLE`)).toBe(
      "Parse error: expected DB or DATABASE, found 'TABLE' at 4:7",
    );
  });

  it('never returns part of the statements: the whole text is refused', () => {
    const good = 'DEFINE SEQUENCE a BATCH 10; REMOVE SEQUENCE b;\n';
    for (const bad of [
      'DEFINE SEQUENCE c BATCH ten',
      'DEFINE SEQUENCE c TIMEOUT 5x',
      'SELECT 1',
      "sequence::nextval('x",
      '/* open',
      'INFO FOR DB INFO',
    ]) {
      expect(() => parseStatements(good + bad)).toThrow(OrdoError);
      expect(() => parseStatements(`${bad}; ${good}`)).toThrow(OrdoError);
    }
  });

  it('reports the first error in reading order; a value a statement cannot use is none', () => {
    expect(parseError("DEFINE SEQUENCE a BATCH ten; sequence::nextval('x")).toBe(
      "Parse error: expected BATCH's value, a whole number from 1 to 1000000, found 'ten' at 1:25",
    );
    expect(parseError("DEFINE SEQUENCE a BATCH 0; sequence::nextval('x")).toBe(
      'Parse error: unterminated string starting at 1:46',
    );
  });

  it('refuses what is not a text', () => {
    expect(refusal(() => parseStatements(42 as unknown as string)).message).toBe('statements must be a text');
  });
});

describe('values a statement cannot use: it parses, and fails alone when it runs', () => {
  const NUMBER_RULE = 'must be a whole number from -9007199254740991 to 9007199254740991';
  const cases: [string, InvalidValue][] = [
    // of the wrong kind: SurrealDB's words, before anything else
    ['DEFINE SEQUENCE s TIMEOUT 5', first('Could not cast into `duration` using input `5`')],
    ['DEFINE SEQUENCE s TIMEOUT 1.5', first('Could not cast into `duration` using input `1.5f`')],
    ["DEFINE SEQUENCE s TIMEOUT 'abc'", first("Could not cast into `duration` using input `'abc'`")],
    ['DEFINE SEQUENCE s TIMEOUT NULL', first('Could not cast into `duration` using input `NULL`')],
    ['DEFINE SEQUENCE s TIMEOUT -1s', first("Cannot negate the value '1s'")],
    ['DEFINE SEQUENCE s BATCH 1.5', first('Could not cast into `int` using input `1.5f`')],
    ['DEFINE SEQUENCE s BATCH 5s', first('Could not cast into `int` using input `5s`')],
    ["DEFINE SEQUENCE s BATCH 'x'", first("Could not cast into `int` using input `'x'`")],
    ['DEFINE SEQUENCE s BATCH "it\'s"', first('Could not cast into `int` using input `"it\'s"`')],
    ['DEFINE SEQUENCE s START NONE', first('Could not cast into `int` using input `NONE`')],
    ["DEFINE SEQUENCE s START '1.5'", first("Could not cast into `int` using input `'1.5'`")],
    ['DEFINE SEQUENCE s START -5s', first("Cannot negate the value '5s'")],
    ["LET $b = 'x'; DEFINE SEQUENCE s BATCH $b", first("Could not cast into `int` using input `'x'`")],
    ['LET $t = 5; DEFINE SEQUENCE s TIMEOUT $t', first('Could not cast into `duration` using input `5`')],
    ['LET $n = 5; DEFINE SEQUENCE $n', first('Expected `sequence name` but found `5`')],
    ['LET $n = NONE; DEFINE SEQUENCE $n', first('Expected `sequence name` but found `NONE`')],
    ['LET $n = 1.5; REMOVE SEQUENCE $n', first('Expected `sequence name` but found `1.5f`')],
    ['sequence::nextval(a)', first(NEXTVAL_ARGUMENTS)],
    ['sequence::nextval(`a`)', first(NEXTVAL_ARGUMENTS)],
    ['sequence::nextval(5)', first(NEXTVAL_ARGUMENTS)],
    ['sequence::nextval(NONE)', first(NEXTVAL_ARGUMENTS)],
    ['sequence::nextval()', first(NEXTVAL_ARGUMENTS)],
    ['LET $n = 5; sequence::nextval($n)', first(NEXTVAL_ARGUMENTS)],
    [
      'DEFINE SEQUENCE s FORMAT 12',
      first("FORMAT must be a quoted text such as 'INV-{YYYY}-{n:6}', found '12' at 1:26"),
    ],
    [
      'DEFINE SEQUENCE s TIMEZONE 5',
      first(
        "TIMEZONE must be a quoted IANA time zone name of 1 to 64 characters, such as 'Europe/Paris', found '5' at 1:28",
      ),
    ],
    // out of ordo's bounds: once DEFINE has found no such sequence
    [
      'DEFINE SEQUENCE mySeq3 BATCH 0',
      ifAbsent("BATCH must be a whole number from 1 to 1000000, found '0' at 1:30"),
    ],
    [
      'DEFINE SEQUENCE s BATCH 1000001',
      ifAbsent("BATCH must be a whole number from 1 to 1000000, found '1000001' at 1:25"),
    ],
    [
      'DEFINE SEQUENCE s BATCH -1',
      ifAbsent("BATCH must be a whole number from 1 to 1000000, found '-1' at 1:25"),
    ],
    [
      'LET $b = 0; DEFINE SEQUENCE s BATCH $b',
      ifAbsent("BATCH must be a whole number from 1 to 1000000, found '$b' ('0') at 1:37"),
    ],
    [
      'DEFINE SEQUENCE s START 9007199254740992',
      ifAbsent(`START ${NUMBER_RULE}, found '9007199254740992' at 1:25`),
    ],
    [
      'DEFINE SEQUENCE s START -9007199254740992',
      ifAbsent(`START ${NUMBER_RULE}, found '-9007199254740992' at 1:25`),
    ],
    [
      'DEFINE SEQUENCE s MAXVALUE 99999999999999999999999',
      ifAbsent(`MAXVALUE ${NUMBER_RULE}, found '99999999999999999999999' at 1:28`),
    ],
    [
      'DEFINE SEQUENCE s INCREMENT 0',
      ifAbsent("INCREMENT must be a whole number from 1 to 9007199254740991, found '0' at 1:29"),
    ],
    [
      'DEFINE SEQUENCE s TIMEOUT 300000y',
      ifAbsent(`TIMEOUT: duration must be at most 285616y21w4d8h59m991ms (got "300000y") at 1:27`),
    ],
    [
      "DEFINE SEQUENCE s TIMEZONE ''",
      ifAbsent(
        "TIMEZONE must be a quoted IANA time zone name of 1 to 64 characters, such as 'Europe/Paris', found string '' at 1:28",
      ),
    ],
    [
      "DEFINE SEQUENCE s FORMAT 'INV-{YYYY}'",
      ifAbsent(
        "format must contain {n} or {n:W}, or two numbers would read the same (got 'INV-{YYYY}') at 1:26",
      ),
    ],
    [
      "DEFINE SEQUENCE s\n  FORMAT 'INV-{Q}-{n}'",
      ifAbsent(
        `format has an unknown token {Q}; braces only enclose the tokens ${FORMAT_TOKENS.join(' ')} (W: a width from 1 to 20) at 2:10`,
      ),
    ],
    ['DEFINE SEQUENCE `my-seq`', ifAbsent(`${NAME_RULE} (got "my-seq") at 1:17`)],
    ['DEFINE SEQUENCE "my seq"', ifAbsent(`${NAME_RULE} (got "my seq") at 1:17`)],
    ['DEFINE SEQUENCE ⟨9lives⟩', ifAbsent(`${NAME_RULE} (got "9lives") at 1:17`)],
    [`DEFINE SEQUENCE ${'a'.repeat(64)}`, ifAbsent(`${NAME_RULE} (got "${'a'.repeat(64)}") at 1:17`)],
    // ALTER looks the sequence up first
    [
      'ALTER SEQUENCE s TIMEOUT 5 ',
      { message: 'Could not cast into `duration` using input `5`', when: 'if_present' },
    ],
    [
      'ALTER SEQUENCE IF EXISTS s TIMEOUT 300000y',
      {
        message: 'TIMEOUT: duration must be at most 285616y21w4d8h59m991ms (got "300000y") at 1:36',
        when: 'if_present',
      },
    ],
  ];

  it.each(cases)('%j', (text, invalid) => {
    const statements = parseStatements(`${text}; INFO FOR DB`);
    expect(statements.at(-2)!.invalid).toEqual(invalid);
    expect(statements.at(-1)).toStrictEqual({ kind: 'info_for_db' });
  });

  it('a value of the wrong kind is the one reported, wherever it is (SurrealDB evaluates every value first)', () => {
    expect(parseStatements('DEFINE SEQUENCE s BATCH 0 TIMEOUT 5')[0]!.invalid).toEqual(
      first('Could not cast into `duration` using input `5`'),
    );
    expect(parseStatements('DEFINE SEQUENCE `a b` START 1.5')[0]!.invalid).toEqual(
      first('Could not cast into `int` using input `1.5f`'),
    );
    expect(parseStatements('DEFINE SEQUENCE s BATCH 0 START -9007199254740992')[0]!.invalid).toEqual(
      ifAbsent("BATCH must be a whole number from 1 to 1000000, found '0' at 1:25"),
    );
  });

  it('casts as SurrealDB casts: whole numbers written as strings or floats, durations as strings', () => {
    expect(
      parseStatements(
        "DEFINE SEQUENCE a BATCH '5' START '-5' TIMEOUT '1m30s'; DEFINE SEQUENCE b BATCH 1e3 START 5.0 TIMEOUT ' 5s'; DEFINE SEQUENCE c START '+7' TIMEOUT NONE",
      ),
    ).toStrictEqual([
      define({ name: 'a', batch: 5, start: -5, timeoutMs: 90_000 }),
      define({ name: 'b', batch: 1000, start: 5, timeoutMs: 5000 }),
      define({ name: 'c', start: 7 }),
    ]);
  });

  it('REMOVE, ALTER and nextval keep a name ordo does not allow: no sequence has it, so each answers as for a missing one', () => {
    expect(
      parseStatements("REMOVE SEQUENCE ``; ALTER SEQUENCE 'a b' TIMEOUT 5s; sequence::nextval('a b')"),
    ).toStrictEqual([
      { kind: 'remove_sequence', name: '', ifExists: false },
      { kind: 'alter_sequence', name: 'a b', ifExists: false, timeoutMs: 5000 },
      { kind: 'nextval', name: 'a b' },
    ]);
  });
});

describe('lexer', () => {
  it('gives every token its line and column', () => {
    const tokens = tokenize("DEFINE  SEQUENCE `a`\n  START -5 TIMEOUT 1m30s -- c\r\n'it\\'s' ⟨b⟩::( );");
    expect(tokens.map((t) => [t.kind, t.value, t.line, t.column])).toStrictEqual([
      ['word', 'DEFINE', 1, 1],
      ['word', 'SEQUENCE', 1, 9],
      ['name', 'a', 1, 18],
      ['word', 'START', 2, 3],
      ['number', '-5', 2, 9],
      ['word', 'TIMEOUT', 2, 12],
      ['number', '1m30s', 2, 20],
      ['string', "it's", 3, 1],
      ['name', 'b', 3, 9],
      ['symbol', '::', 3, 12],
      ['symbol', '(', 3, 14],
      ['symbol', ')', 3, 16],
      ['symbol', ';', 3, 17],
      ['eof', '', 3, 18],
    ]);
    expect(tokens[7]!.text).toBe("'it\\'s'");
  });

  it('describes tokens for error messages', () => {
    const [word, string, eof] = tokenize(`SELECT "${'x'.repeat(50)}"`);
    expect(describeToken(word!)).toBe("'SELECT'");
    expect(describeToken(string!)).toBe(`string "${'x'.repeat(39)}…`);
    expect(describeToken(eof!)).toBe('end of input');
  });
});

describe('durations', () => {
  it.each([
    ['0s', 0],
    ['0ns', 0],
    ['1ns', 1],
    ['10ns', 1],
    ['500us', 1],
    ['500µs', 1],
    ['500μs', 1],
    ['1000us', 1],
    ['1001us', 2],
    ['100ms', 100],
    ['5s', 5000],
    ['1m', 60_000],
    ['1m30s', 90_000],
    ['2h', 7_200_000],
    ['1d', 86_400_000],
    ['1w', 604_800_000],
    ['1y', 31_536_000_000],
    ['1s500ms', 1500],
    ['1s500us', 1001],
    ['1h1m1s1ms', 3_661_001],
    ['90s', 90_000],
    ['1s1m', 61_000],
    ['007s', 7000],
    ['9007199254740991ms', MAX_VALUE],
  ] as const)('parseDuration(%j) is %d', (text, ms) => {
    expect(parseDuration(text)).toBe(ms);
  });

  it.each([
    '',
    '5',
    's',
    '5x',
    '5S',
    '1.5s',
    '-1s',
    '1m 30s',
    ' 5s',
    '5s ',
    '5sec',
    '9007199254740992ms',
    '300000y',
    // Longer than MAX_DURATION_TEXT (64), though each part is valid.
    '1s'.repeat(33),
  ])('parseDuration refuses %j', (text) => {
    expect(refusal(() => parseDuration(text)).message).toMatch(/^duration must be/);
  });

  it.each([
    [0, '0s'],
    [1, '1ms'],
    [999, '999ms'],
    [1000, '1s'],
    [1500, '1s500ms'],
    [5000, '5s'],
    [60_000, '1m'],
    [90_000, '1m30s'],
    [3_600_000, '1h'],
    [86_400_000, '1d'],
    [604_800_000, '1w'],
    [691_200_000, '1w1d'],
    [31_536_000_000, '1y'],
    [31_536_000_000 + 604_800_000 + 86_400_000 + 3_661_001, '1y1w1d1h1m1s1ms'],
  ])('formatDuration(%d) is %j', (ms, text) => {
    expect(formatDuration(ms)).toBe(text);
  });

  it.each([-1, 1.5, Number.NaN, MAX_VALUE + 1])('formatDuration refuses %d', (ms) => {
    refusal(() => formatDuration(ms));
  });

  it('formatDuration then parseDuration gives the same milliseconds (property)', () => {
    fc.assert(
      fc.property(
        fc.oneof(fc.integer({ min: 0, max: 10 ** 9 }), fc.integer({ min: 0, max: MAX_VALUE })),
        (ms) => {
          const text = formatDuration(ms);
          expect(text).toMatch(/^(?:0s|(?:\d+y)?(?:\d+w)?(?:\d+d)?(?:\d+h)?(?:\d+m)?(?:\d+s)?(?:\d+ms)?)$/);
          expect(parseDuration(text)).toBe(ms);
        },
      ),
    );
  });

  it('parseDuration sums compound durations and rounds up only what is not zero (property)', () => {
    const nanos: Record<string, bigint> = {
      y: 31_536_000_000_000_000n,
      w: 604_800_000_000_000n,
      d: 86_400_000_000_000n,
      h: 3_600_000_000_000n,
      m: 60_000_000_000n,
      s: 1_000_000_000n,
      ms: 1_000_000n,
      us: 1000n,
      µs: 1000n,
      ns: 1n,
    };
    const part = fc.tuple(fc.integer({ min: 0, max: 100_000 }), fc.constantFrom(...Object.keys(nanos)));
    fc.assert(
      fc.property(fc.array(part, { minLength: 1, maxLength: 6 }), (parts) => {
        const text = parts.map(([n, unit]) => `${n}${unit}`).join('');
        const total = parts.reduce((sum, [n, unit]) => sum + BigInt(n) * nanos[unit]!, 0n);
        // Several parts of 100,000 years pass the longest duration (2^53 - 1 ms): refused.
        if ((total + 999_999n) / 1_000_000n > BigInt(MAX_VALUE)) {
          expect(() => parseDuration(text)).toThrow(/duration must be at most/);
          return;
        }
        const ms = parseDuration(text);
        expect(BigInt(ms) * 1_000_000n >= total).toBe(true);
        expect(BigInt(ms) * 1_000_000n - total < 1_000_000n).toBe(true);
        expect(ms === 0).toBe(total === 0n);
        expect(formatDuration(parseDuration(formatDuration(ms)))).toBe(formatDuration(ms));
      }),
    );
  });
});

describe('defineStatementText', () => {
  const batched: PrintableDefinition = {
    name: 'mySeq2',
    kind: 'batched',
    start: 100,
    increment: 1,
    maxValue: MAX_VALUE,
    cycle: false,
    batch: 1000,
    timeoutMs: 5000,
    reset: 'never',
    timeZone: 'UTC',
    format: null,
  };
  const gapless: PrintableDefinition = {
    name: 'invoice',
    kind: 'gapless',
    start: 1,
    increment: 1,
    maxValue: MAX_VALUE,
    cycle: false,
    batch: null,
    timeoutMs: null,
    reset: 'year',
    timeZone: 'Europe/Paris',
    format: 'INV-{YYYY}-{n:6}',
  };

  it('prints a batched definition: BATCH and START always, the rest when not the default', () => {
    expect(defineStatementText(batched)).toBe('DEFINE SEQUENCE mySeq2 BATCH 1000 START 100 TIMEOUT 5s');
    expect(defineStatementText({ ...batched, timeoutMs: null, start: 1 })).toBe(
      'DEFINE SEQUENCE mySeq2 BATCH 1000 START 1',
    );
    // Zero as SurrealDB 3 prints it.
    expect(defineStatementText({ ...batched, timeoutMs: 0 })).toBe(
      'DEFINE SEQUENCE mySeq2 BATCH 1000 START 100 TIMEOUT 0ns',
    );
    expect(
      defineStatementText({
        ...batched,
        start: -5,
        increment: 2,
        maxValue: 1000,
        cycle: true,
        timeoutMs: 90_000,
      }),
    ).toBe('DEFINE SEQUENCE mySeq2 BATCH 1000 START -5 TIMEOUT 1m30s INCREMENT 2 MAXVALUE 1000 CYCLE');
  });

  it('prints a gapless definition: GAPLESS always, the rest when not the default', () => {
    expect(defineStatementText(gapless)).toBe(
      "DEFINE SEQUENCE invoice GAPLESS RESET YEARLY TIMEZONE 'Europe/Paris' FORMAT 'INV-{YYYY}-{n:6}'",
    );
    expect(defineStatementText({ ...gapless, start: 1000 })).toBe(
      "DEFINE SEQUENCE invoice GAPLESS START 1000 RESET YEARLY TIMEZONE 'Europe/Paris' FORMAT 'INV-{YYYY}-{n:6}'",
    );
    expect(defineStatementText({ ...gapless, reset: 'never', timeZone: 'UTC', format: null })).toBe(
      'DEFINE SEQUENCE invoice GAPLESS',
    );
    expect(
      defineStatementText({ ...gapless, reset: 'day', timeZone: 'UTC', format: null, cycle: true }),
    ).toBe('DEFINE SEQUENCE invoice GAPLESS CYCLE RESET DAILY');
  });

  it('quotes names that read as keywords and escapes strings', () => {
    expect(
      defineStatementText({ ...gapless, name: 'if', reset: 'never', timeZone: 'UTC', format: null }),
    ).toBe('DEFINE SEQUENCE `if` GAPLESS');
    expect(
      defineStatementText({ ...gapless, name: 'Overwrite', reset: 'never', timeZone: 'UTC', format: null }),
    ).toBe('DEFINE SEQUENCE `Overwrite` GAPLESS');
    const text = defineStatementText({
      ...gapless,
      reset: 'never',
      timeZone: "a'b",
      format: 'it\'s \\ {n}\t"x"\n',
    });
    expect(text).toBe("DEFINE SEQUENCE invoice GAPLESS TIMEZONE 'a\\'b' FORMAT 'it\\'s \\\\ {n}\\t\"x\"\\n'");
    expect(parseStatements(text)).toStrictEqual([
      define({ name: 'invoice', gapless: true, timeZone: "a'b", format: 'it\'s \\ {n}\t"x"\n' }),
    ]);
  });

  it('refuses a name that is not an identifier', () => {
    refusal(() => defineStatementText({ ...gapless, name: 'a; REMOVE SEQUENCE b' }));
  });

  /** The definition a parsed statement describes, with the defaults filled in. */
  function definitionOf(statement: Statement): PrintableDefinition {
    if (statement.kind !== 'define_sequence') throw new Error(`not a definition: ${statement.kind}`);
    return {
      name: statement.name,
      kind: statement.gapless ? 'gapless' : 'batched',
      start: statement.start ?? 1,
      increment: statement.increment ?? 1,
      maxValue: statement.maxValue ?? MAX_VALUE,
      cycle: statement.cycle ?? false,
      batch: statement.gapless ? null : (statement.batch ?? null),
      timeoutMs: statement.timeoutMs ?? null,
      reset: statement.reset ?? 'never',
      timeZone: statement.timeZone ?? 'UTC',
      format: statement.format ?? null,
    };
  }

  it('prints text that parses back to the same definition (property)', () => {
    const keyword = fc.constantFrom(...KEYWORDS).chain((k) => fc.constantFrom(k, k.toLowerCase()));
    const name = fc.oneof(fc.stringMatching(/^[A-Za-z_][A-Za-z0-9_]{0,62}$/), keyword);
    const text = fc.string({
      unit: fc.constantFrom('a', 'Z', '-', '/', ' ', "'", '"', '\\', '\n', '\t', '\r', ';', '#', 'é', '😀'),
      maxLength: 10,
    });
    const format = fc
      .array(fc.oneof(text, fc.constantFrom(...FORMAT_TOKENS.map((t) => t.replace('{n:W}', '{n:12}')))), {
        maxLength: 6,
      })
      .map((parts) => [...parts, '{n}'].join(''));
    const common = {
      name,
      start: fc.maxSafeInteger(),
      increment: fc.oneof(fc.constant(1), fc.integer({ min: 1, max: MAX_VALUE })),
      maxValue: fc.oneof(fc.constant(MAX_VALUE), fc.maxSafeInteger()),
      cycle: fc.boolean(),
      timeoutMs: fc.option(
        fc.oneof(fc.integer({ min: 0, max: 10 ** 8 }), fc.integer({ min: 0, max: MAX_VALUE })),
      ),
      reset: fc.constantFrom('never', 'day', 'week', 'month', 'year' as const),
      timeZone: fc.oneof(fc.constantFrom('UTC', 'Europe/Paris'), fc.string({ minLength: 1, maxLength: 32 })),
      format: fc.option(format),
    };
    const definition = fc
      .oneof(
        fc.record({
          ...common,
          kind: fc.constant('batched' as const),
          batch: fc.integer({ min: 1, max: 1_000_000 }),
        }),
        fc.record({ ...common, kind: fc.constant('gapless' as const), batch: fc.constant(null) }),
      )
      // A plain object (fc.record builds null-prototype ones), and no -0, which prints as 0.
      .map((def): PrintableDefinition => ({ ...def, start: def.start + 0, maxValue: def.maxValue + 0 }));
    fc.assert(
      fc.property(definition, (def) => {
        const printed = defineStatementText(def);
        const statements = parseStatements(printed);
        expect(statements).toHaveLength(1);
        expect(definitionOf(statements[0]!)).toStrictEqual(def);
        expect(defineStatementText(definitionOf(statements[0]!))).toBe(printed);
      }),
      { numRuns: 500 },
    );
  });
});
