import { formatDuration, parseDuration } from '../durations.js';
import {
  boolean,
  describe,
  identifier,
  invalid,
  knownKeys,
  MAX_TIME_ZONE_LENGTH,
  MAX_VALUE,
  oneOf,
  plainObject,
  safeInteger,
} from '../validate.js';
import { validateFormat } from './format.js';

export type SequenceKind = 'gapless' | 'batched';
export type ResetPeriod = 'never' | 'day' | 'week' | 'month' | 'year';
export const RESET_PERIODS: readonly ResetPeriod[] = ['never', 'day', 'week', 'month', 'year'];

export interface DefineSequenceOptions {
  name: string;
  /** 'gapless' (default): no holes, in your transaction. 'batched': ranges reserved per node, values from memory. */
  kind?: SequenceKind;
  /** First value (of every period, for a gapless sequence). Default 1 for gapless, 0 for batched (as SurrealDB). */
  start?: number;
  /** Batched: how many values a node reserves at once (default 1000). */
  batch?: number;
  /** Batched: how long a reservation may keep retrying, in ms or as '5s'; 0 fails at once; default: until close(). */
  timeout?: number | string | null;
  /** Replace an existing definition (never moving a sequence backwards) and tell every node. */
  overwrite?: boolean;
  /** Step between values, at least 1 (default 1). */
  increment?: number;
  /** Where a cycling sequence wraps to (default: start). */
  minValue?: number;
  /** Largest value (default and upper bound 2^53 − 1). */
  maxValue?: number;
  /** Wrap to minValue after maxValue instead of failing with sequence_exhausted. */
  cycle?: boolean;
  /** Restart numbering every day / week (ISO, from Monday) / month / year, in timeZone. */
  reset?: ResetPeriod;
  /** IANA time zone in which periods and dates are computed (default 'UTC'). */
  timeZone?: string;
  /** With reset 'year': the month (1–12) the year starts in, for fiscal years (4: April); default 1. */
  yearStart?: number;
  /** Text form, e.g. 'INV-{YYYY}-{n:6}'. */
  format?: string;
  /** Return the existing definition instead of failing with sequence_exists. */
  ifNotExists?: boolean;
}

export interface SequenceDefinition {
  name: string;
  kind: SequenceKind;
  start: number;
  /** Batched only, else null. */
  batch: number | null;
  /** Batched only: the reservation timeout in ms, or null for none. */
  timeoutMs: number | null;
  increment: number;
  minValue: number;
  maxValue: number;
  cycle: boolean;
  reset: ResetPeriod;
  timeZone: string;
  /** The month (1–12) a yearly period starts in; 1 unless a fiscal year. */
  yearStart: number;
  format: string | null;
  /** Bumped by every redefinition. */
  epoch: number;
  createdAt: Date;
  updatedAt: Date;
}

const DEFINE_KEYS = [
  'batch',
  'timeout',
  'overwrite',
  'name',
  'kind',
  'start',
  'increment',
  'minValue',
  'maxValue',
  'cycle',
  'reset',
  'timeZone',
  'yearStart',
  'format',
  'ifNotExists',
] as const;

export type ValidDefinition = Omit<SequenceDefinition, 'createdAt' | 'updatedAt' | 'epoch'> & {
  mode: 'create' | 'if_not_exists' | 'overwrite';
};

export const MAX_BATCH = 1_000_000;
/** The longest reservation timeout: a year. */
export const MAX_TIMEOUT_MS = 365 * 24 * 3_600_000;

/** Checks everything that can be checked without the database, before anything is written. */
export function validateDefinition(input: DefineSequenceOptions): ValidDefinition {
  const o = plainObject('sequence definition', input);
  knownKeys('sequences.define', o, DEFINE_KEYS);
  const name = identifier('name', o.name);
  const kind = oneOf('kind', o.kind ?? 'gapless', ['gapless', 'batched'] as const);
  const ifNotExists = boolean('ifNotExists', o.ifNotExists ?? false);
  const overwrite = boolean('overwrite', o.overwrite ?? false);
  if (ifNotExists && overwrite) throw invalid('give ifNotExists or overwrite, not both');
  const start = safeInteger('start', o.start ?? (kind === 'batched' ? 0 : 1));
  const increment = safeInteger('increment', o.increment ?? 1, 1);
  const minValue = safeInteger('minValue', o.minValue ?? start, -MAX_VALUE, start);
  const maxValue = safeInteger('maxValue', o.maxValue ?? MAX_VALUE, start);
  const timeZone = o.timeZone ?? 'UTC';
  if (typeof timeZone !== 'string' || timeZone.length === 0 || timeZone.length > MAX_TIME_ZONE_LENGTH) {
    throw invalid(
      `timeZone must be an IANA time zone name such as 'Europe/Paris' (got ${describe(timeZone)})`,
    );
  }
  const common = {
    name,
    kind,
    start,
    increment,
    minValue,
    maxValue,
    timeZone,
    mode: overwrite ? 'overwrite' : ifNotExists ? 'if_not_exists' : 'create',
  } as const;
  if (kind === 'gapless') {
    for (const key of ['batch', 'timeout'] as const) {
      if (o[key] !== undefined) throw invalid(`${key} applies to batched sequences only`);
    }
    const reset = oneOf('reset', o.reset ?? 'never', RESET_PERIODS);
    const yearStart = safeInteger('yearStart', o.yearStart ?? 1, 1, 12);
    if (yearStart !== 1 && reset !== 'year') {
      throw invalid(`yearStart needs reset: 'year' (got reset '${reset}')`);
    }
    return {
      ...common,
      batch: null,
      timeoutMs: null,
      cycle: boolean('cycle', o.cycle ?? false),
      reset,
      yearStart,
      format: o.format === undefined || o.format === null ? null : validateFormat(o.format),
    };
  }
  for (const key of ['cycle', 'reset', 'format', 'minValue', 'yearStart'] as const) {
    if (
      o[key] !== undefined &&
      !(key === 'reset' && o[key] === 'never') &&
      !(key === 'cycle' && o[key] === false) &&
      !(key === 'yearStart' && o[key] === 1)
    ) {
      throw invalid(`${key} applies to gapless sequences only`);
    }
  }
  const batch = safeInteger('batch', o.batch ?? 1000, 1, MAX_BATCH);
  if (batch * increment > MAX_VALUE) throw invalid('batch × increment must stay below 2^53');
  return {
    ...common,
    batch,
    timeoutMs: parseTimeout(o.timeout),
    cycle: false,
    reset: 'never',
    yearStart: 1,
    format: null,
  };
}

/** A timeout as milliseconds, or a SurrealDB duration ('5s'); null or undefined: none. */
export function parseTimeout(value: unknown): number | null {
  if (value === undefined || value === null) return null;
  if (typeof value === 'string') return parseDuration(value);
  return safeInteger('timeout', value, 0, MAX_TIMEOUT_MS);
}

/**
 * A timeout as SurrealDB prints it, in DEFINE statements and in its timeout error: `5s`,
 * `1m30s`, `100ms`, and zero as `0ns`. ordo keeps timeouts in whole milliseconds.
 */
export function formatTimeout(ms: number): string {
  return ms === 0 ? '0ns' : formatDuration(ms);
}

export function toDefinition(row: Record<string, any>): SequenceDefinition {
  return {
    name: row.name,
    kind: row.kind,
    start: Number(row.start),
    batch: row.batch === null ? null : Number(row.batch),
    timeoutMs: row.timeout_ms === null ? null : Number(row.timeout_ms),
    increment: Number(row.increment),
    minValue: Number(row.min_value),
    maxValue: Number(row.max_value),
    cycle: row.cycle,
    reset: row.reset,
    timeZone: row.time_zone,
    yearStart: Number(row.year_start ?? 1),
    format: row.format,
    epoch: Number(row.epoch),
    createdAt: new Date(row.created_at),
    updatedAt: new Date(row.updated_at),
  };
}
