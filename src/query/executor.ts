import { OrdoError, type OrdoErrorCode, sequenceNotFound, toOrdoError } from '../errors.js';
import type { DefineSequenceOptions } from '../sequences/definitions.js';
import type { Sequences } from '../sequences/sequences.js';
import { parseStatements } from './parser.js';
import {
  type DefineSequenceStatement,
  definitionStructure,
  defineStatementText,
  INFO_SECTIONS,
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
 * does not stop the next one. Text that does not parse runs nothing and throws, as SurrealDB
 * refuses a whole text with a parse error.
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
  switch (s.kind) {
    case 'define_sequence':
      await target.sequences.define(definition(s));
      return null;
    case 'alter_sequence':
      try {
        if (s.timeoutMs !== undefined) await target.sequences.alterTimeout(s.name, s.timeoutMs);
        else if ((await target.sequences.get(s.name)) === null) throw sequenceNotFound(s.name);
      } catch (e) {
        if (s.ifExists && e instanceof OrdoError && e.code === 'sequence_not_found') return null;
        throw e;
      }
      return null;
    case 'remove_sequence':
      await target.sequences.remove(s.name, { ifExists: s.ifExists });
      return null;
    case 'nextval':
      return target.nextval(s.name);
    case 'let':
      return null;
    case 'info_for_db':
      return field(await info(target, s.structure === true), s.path ?? []);
  }
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
