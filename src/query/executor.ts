import { OrdoError, type OrdoErrorCode, toOrdoError } from '../errors.js';
import type { DefineSequenceOptions } from '../sequences/definitions.js';
import type { Sequences } from '../sequences/sequences.js';
import { parseStatements } from './parser.js';
import { type DefineSequenceStatement, defineStatementText, type Statement } from './statements.js';

/** One entry per statement, in order: what it returned, or why it failed. */
export type StatementResult = { result: unknown } | { error: string; code: OrdoErrorCode };

/** What the executor needs of the client: the sequences module and the fast nextval. */
export interface QueryTarget {
  sequences: Sequences;
  nextval(name: string): Promise<number>;
}

/**
 * Runs `;`-separated statements one after another, as SurrealDB does: a statement that fails
 * does not stop the next one. Text that does not parse runs nothing and throws.
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
      await target.sequences.alterTimeout(s.name, s.timeoutMs);
      return null;
    case 'remove_sequence':
      await target.sequences.remove(s.name, { ifExists: s.ifExists });
      return null;
    case 'nextval':
      return target.nextval(s.name);
    case 'info_for_db': {
      const sequences: Record<string, string> = {};
      for (const d of await target.sequences.list()) sequences[d.name] = defineStatementText(d);
      return { sequences };
    }
  }
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
