import { OrdoError, type OrdoErrorCode, sequenceNotFound, toOrdoError } from '../errors.js';
import type { DefineSequenceOptions } from '../sequences/definitions.js';
import type { Sequences } from '../sequences/sequences.js';
import { isIdentifier } from '../validate.js';
import { parseStatements } from './parser.js';
import {
  type DefineSequenceStatement,
  definitionStructure,
  defineStatementText,
  INFO_SECTIONS,
  type InvalidValue,
  type Statement,
} from './statements.js';

/** One entry per statement, in order: what it returned, or why it failed. */
export type StatementResult = { result: unknown } | { error: string; code: OrdoErrorCode };

/** What the executor needs of the client: the sequences module and the fast nextval. */
export interface QueryTarget {
  sequences: Sequences;
  nextval(name: string): Promise<number>;
}

/**
 * Runs `;`-separated statements one after another, as SurrealDB does: a statement that fails
 * (a missing sequence, a timeout, a value it cannot use) does not stop the next one. Text
 * that does not parse runs nothing and throws, as SurrealDB refuses a whole text with a parse
 * error.
 */
export async function executeQuery(target: QueryTarget, text: string): Promise<StatementResult[]> {
  if (typeof text !== 'string') throw new OrdoError('invalid_argument', 'the query must be a text');
  const statements = parseStatements(text);
  const results: StatementResult[] = [];
  for (const statement of statements) {
    try {
      results.push({ result: await run(target, statement) });
    } catch (e) {
      const error = toOrdoError(e);
      results.push({ error: error.message, code: error.code });
    }
  }
  return results;
}

async function run(target: QueryTarget, s: Statement): Promise<unknown> {
  if (s.invalid) return refuse(target, s, s.invalid);
  switch (s.kind) {
    case 'define_sequence':
      await target.sequences.define(definition(s));
      return null;
    case 'alter_sequence':
      try {
        if (!isIdentifier(s.name)) throw sequenceNotFound(s.name);
        if (s.timeoutMs !== undefined) await target.sequences.alterTimeout(s.name, s.timeoutMs);
        else if (!(await exists(target, s.name))) throw sequenceNotFound(s.name);
      } catch (e) {
        if (s.ifExists && e instanceof OrdoError && e.code === 'sequence_not_found') return null;
        throw e;
      }
      return null;
    case 'remove_sequence':
      // A name ordo does not allow is no sequence's.
      if (isIdentifier(s.name)) await target.sequences.remove(s.name, { ifExists: s.ifExists });
      else if (!s.ifExists) throw sequenceNotFound(s.name);
      return null;
    case 'nextval':
      if (!isIdentifier(s.name)) throw sequenceNotFound(s.name);
      return target.nextval(s.name);
    case 'let':
      return null;
    case 'info_for_db':
      return field(await info(target, s.structure === true), s.path ?? []);
  }
}

/**
 * A statement with a value it cannot use fails with invalid_argument, after the checks
 * SurrealDB makes before it looks at that value (see InvalidValue).
 */
async function refuse(target: QueryTarget, s: Statement, invalid: InvalidValue): Promise<null> {
  if (invalid.when === 'if_absent' && s.kind === 'define_sequence' && s.mode !== 'overwrite') {
    if (await exists(target, s.name)) {
      if (s.mode === 'if_not_exists') return null;
      throw new OrdoError('sequence_exists', `The sequence '${s.name}' already exists`);
    }
  } else if (invalid.when === 'if_present' && s.kind === 'alter_sequence') {
    if (!(await exists(target, s.name))) {
      if (s.ifExists) return null;
      throw sequenceNotFound(s.name);
    }
  }
  throw new OrdoError('invalid_argument', invalid.message);
}

async function exists(target: QueryTarget, name: string): Promise<boolean> {
  return isIdentifier(name) && (await target.sequences.get(name)) !== null;
}

/**
 * INFO FOR DB as SurrealDB answers it: every section, the ones ordo has no such thing for
 * empty. Sequences by name as their DEFINE statements, or with STRUCTURE as a list of fields.
 */
async function info(target: QueryTarget, structure: boolean): Promise<Record<string, unknown>> {
  const definitions = await target.sequences.list();
  const result: Record<string, unknown> = {};
  for (const section of INFO_SECTIONS) result[section] = structure ? [] : {};
  result.sequences = structure
    ? definitions.map(definitionStructure)
    : Object.fromEntries(definitions.map((d) => [d.name, defineStatementText(d)]));
  return result;
}

/** `value.a.b` as SurrealDB reads it: a missing field is null (NONE), a list gives each item's. */
function field(value: unknown, path: readonly string[]): unknown {
  if (path.length === 0) return value;
  const [key, ...rest] = path as [string, ...string[]];
  if (Array.isArray(value)) return value.map((item) => field(item, path));
  if (value === null || typeof value !== 'object' || !Object.hasOwn(value, key)) return null;
  return field((value as Record<string, unknown>)[key], rest);
}

/** A DEFINE SEQUENCE statement as sequences.define() options: batched unless GAPLESS, as in SurrealDB. */
function definition(s: DefineSequenceStatement): DefineSequenceOptions {
  const options: DefineSequenceOptions = {
    name: s.name,
    kind: s.gapless ? 'gapless' : 'batched',
    overwrite: s.mode === 'overwrite',
    ifNotExists: s.mode === 'if_not_exists',
  };
  const clauses = {
    start: s.start,
    batch: s.batch,
    timeout: s.timeoutMs,
    increment: s.increment,
    maxValue: s.maxValue,
    cycle: s.cycle,
    reset: s.reset,
    timeZone: s.timeZone,
    format: s.format,
  };
  for (const [key, value] of Object.entries(clauses)) {
    if (value !== undefined) (options as unknown as Record<string, unknown>)[key] = value;
  }
  return options;
}
