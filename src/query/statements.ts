import { formatDuration } from '../durations.js';
import { identifier, MAX_VALUE } from '../validate.js';

export type Statement =
  | {
      kind: 'define_sequence';
      name: string;
      mode: 'create' | 'overwrite' | 'if_not_exists';
      gapless: boolean;
      batch?: number;
      start?: number;
      timeoutMs?: number;
      increment?: number;
      maxValue?: number;
      cycle?: boolean;
      reset?: 'day' | 'week' | 'month' | 'year';
      timeZone?: string;
      format?: string;
    }
  | { kind: 'alter_sequence'; name: string; timeoutMs: number | null } // ALTER SEQUENCE x TIMEOUT 5s | DROP TIMEOUT → null
  | { kind: 'remove_sequence'; name: string; ifExists: boolean }
  | { kind: 'nextval'; name: string } // [RETURN] sequence::nextval('name')
  | { kind: 'info_for_db' };

export type DefineSequenceStatement = Extract<Statement, { kind: 'define_sequence' }>;

/** What defineStatementText prints: a stored definition of either kind. */
export interface PrintableDefinition {
  name: string;
  kind: 'gapless' | 'batched';
  start: number;
  increment: number;
  maxValue: number;
  cycle: boolean;
  batch: number | null;
  timeoutMs: number | null;
  reset: 'never' | 'day' | 'week' | 'month' | 'year';
  timeZone: string;
  format: string | null;
}

/** RESET keyword ↔ period. */
export const RESET_KEYWORDS = { DAILY: 'day', WEEKLY: 'week', MONTHLY: 'month', YEARLY: 'year' } as const;
const RESET_TEXT = { day: 'DAILY', week: 'WEEKLY', month: 'MONTHLY', year: 'YEARLY' } as const;

/** The clauses of DEFINE SEQUENCE, each allowed once, in any order. */
export const CLAUSES = [
  'BATCH',
  'START',
  'TIMEOUT',
  'GAPLESS',
  'INCREMENT',
  'MAXVALUE',
  'CYCLE',
  'RESET',
  'TIMEZONE',
  'FORMAT',
] as const;
export type Clause = (typeof CLAUSES)[number];

/**
 * Every keyword of the grammar. A name spelt like one is printed in backticks: it is only
 * needed for OVERWRITE and IF (`DEFINE SEQUENCE if …` starts IF NOT EXISTS), but quoting
 * them all keeps the printed text unambiguous to a reader too.
 */
export const KEYWORDS: ReadonlySet<string> = new Set([
  'DEFINE',
  'ALTER',
  'REMOVE',
  'RETURN',
  'INFO',
  'FOR',
  'DB',
  'DATABASE',
  'SEQUENCE',
  'NEXTVAL',
  'OVERWRITE',
  'IF',
  'NOT',
  'EXISTS',
  'DROP',
  ...CLAUSES,
  ...Object.keys(RESET_KEYWORDS),
]);

/** A name as a statement writes it: bare, or in backticks when it reads as a keyword. */
function nameText(name: string): string {
  identifier('name', name);
  return KEYWORDS.has(name.toUpperCase()) ? `\`${name}\`` : name;
}

/** A single-quoted string literal that the parser reads back as `value`. */
function stringText(value: string): string {
  return `'${value.replace(/[\\'\n\t]/g, (c) => (c === '\n' ? '\\n' : c === '\t' ? '\\t' : `\\${c}`))}'`;
}

/**
 * The canonical DEFINE SEQUENCE statement of a definition, printing only what differs from
 * the defaults, e.g. `DEFINE SEQUENCE mySeq2 BATCH 1000 START 100 TIMEOUT 5s` or
 * `DEFINE SEQUENCE invoice GAPLESS RESET YEARLY TIMEZONE 'Europe/Paris' FORMAT 'INV-{YYYY}-{n:6}'`.
 * parseStatements reads it back as an equivalent statement.
 */
export function defineStatementText(def: PrintableDefinition): string {
  const parts = ['DEFINE SEQUENCE', nameText(def.name)];
  if (def.kind === 'batched') {
    if (def.batch !== null) parts.push(`BATCH ${def.batch}`);
    parts.push(`START ${def.start}`);
  } else {
    parts.push('GAPLESS');
    if (def.start !== 1) parts.push(`START ${def.start}`);
  }
  if (def.timeoutMs !== null) parts.push(`TIMEOUT ${formatDuration(def.timeoutMs)}`);
  if (def.increment !== 1) parts.push(`INCREMENT ${def.increment}`);
  if (def.maxValue !== MAX_VALUE) parts.push(`MAXVALUE ${def.maxValue}`);
  if (def.cycle) parts.push('CYCLE');
  if (def.reset !== 'never') parts.push(`RESET ${RESET_TEXT[def.reset]}`);
  if (def.timeZone !== 'UTC') parts.push(`TIMEZONE ${stringText(def.timeZone)}`);
  if (def.format !== null) parts.push(`FORMAT ${stringText(def.format)}`);
  return parts.join(' ');
}
