import { formatTimeout } from '../sequences/definitions.js';
import { identifier, MAX_VALUE } from '../validate.js';

/**
 * A value a statement cannot use, found while parsing it. The statement still parses: it fails
 * with `message` (invalid_argument) when it runs, and the other statements of the text run, as
 * SurrealDB fails a statement whose value does not cast. `when` follows SurrealDB's order:
 * `first`, before anything else (a value of the wrong kind: SurrealDB evaluates values first);
 * `if_absent`, once DEFINE has found no such sequence (a value out of bounds: an existing one
 * answers `already exists`, or nothing with IF NOT EXISTS); `if_present`, once ALTER has found
 * the sequence (a missing one answers `does not exist`, or nothing with IF EXISTS).
 */
export interface InvalidValue {
  message: string;
  when: 'first' | 'if_absent' | 'if_present';
}

export type Statement = (
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
  // ALTER SEQUENCE [IF EXISTS] x [TIMEOUT 5s | TIMEOUT NONE → null | DROP TIMEOUT → null]; no TIMEOUT: unchanged
  | { kind: 'alter_sequence'; name: string; ifExists: boolean; timeoutMs?: number | null }
  | { kind: 'remove_sequence'; name: string; ifExists: boolean }
  | { kind: 'nextval'; name: string } // [RETURN] sequence::nextval('name')
  // [RETURN] INFO FOR DB [STRUCTURE], or (INFO FOR DB [STRUCTURE]).field.field…
  | { kind: 'info_for_db'; structure?: true; path?: string[] }
  // LET $name = value: the value is put in place of $name by the parser; the statement returns null
  | { kind: 'let'; name: string }
) & { invalid?: InvalidValue };

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
  'LET',
  'NONE',
  'NULL',
  'STRUCTURE',
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
  if (def.timeoutMs !== null) parts.push(`TIMEOUT ${formatTimeout(def.timeoutMs)}`);
  if (def.increment !== 1) parts.push(`INCREMENT ${def.increment}`);
  if (def.maxValue !== MAX_VALUE) parts.push(`MAXVALUE ${def.maxValue}`);
  if (def.cycle) parts.push('CYCLE');
  if (def.reset !== 'never') parts.push(`RESET ${RESET_TEXT[def.reset]}`);
  if (def.timeZone !== 'UTC') parts.push(`TIMEZONE ${stringText(def.timeZone)}`);
  if (def.format !== null) parts.push(`FORMAT ${stringText(def.format)}`);
  return parts.join(' ');
}

/** The sections of SurrealDB's INFO FOR DB, in its order; ordo fills `sequences` only. */
export const INFO_SECTIONS = [
  'accesses',
  'analyzers',
  'apis',
  'buckets',
  'configs',
  'functions',
  'models',
  'modules',
  'params',
  'sequences',
  'tables',
  'users',
] as const;

/**
 * A definition as INFO FOR DB STRUCTURE shows it. A batched one exactly as SurrealDB does
 * (`batch` and `start` as texts, `timeout` a duration or null); a gapless one adds ordo's
 * clauses that differ from the defaults. Fields in alphabetical order, as SurrealDB's objects.
 */
export function definitionStructure(def: PrintableDefinition): Record<string, unknown> {
  const structure: Record<string, unknown> = { name: def.name };
  if (def.kind === 'batched') structure.batch = String(def.batch);
  else structure.gapless = true;
  structure.start = String(def.start);
  structure.timeout = def.timeoutMs === null ? null : formatTimeout(def.timeoutMs);
  if (def.increment !== 1) structure.increment = String(def.increment);
  if (def.maxValue !== MAX_VALUE) structure.maxvalue = String(def.maxValue);
  if (def.cycle) structure.cycle = true;
  if (def.reset !== 'never') structure.reset = RESET_TEXT[def.reset];
  if (def.timeZone !== 'UTC') structure.timezone = def.timeZone;
  if (def.format !== null) structure.format = def.format;
  return Object.fromEntries(Object.entries(structure).sort(([a], [b]) => (a < b ? -1 : 1)));
}
