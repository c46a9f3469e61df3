import {
  boolean,
  describe,
  identifier,
  invalid,
  knownKeys,
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
  /** Only 'gapless' for now. */
  kind?: SequenceKind;
  /** First value of every period (default 1). */
  start?: number;
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
  /** Text form, e.g. 'INV-{YYYY}-{n:6}'. */
  format?: string;
  /** Return the existing definition instead of failing with sequence_exists. */
  ifNotExists?: boolean;
}

export interface SequenceDefinition {
  name: string;
  kind: SequenceKind;
  start: number;
  increment: number;
  minValue: number;
  maxValue: number;
  cycle: boolean;
  reset: ResetPeriod;
  timeZone: string;
  format: string | null;
  createdAt: Date;
  updatedAt: Date;
}

const DEFINE_KEYS = [
  'name',
  'kind',
  'start',
  'increment',
  'minValue',
  'maxValue',
  'cycle',
  'reset',
  'timeZone',
  'format',
  'ifNotExists',
] as const;

export type ValidDefinition = Omit<SequenceDefinition, 'createdAt' | 'updatedAt'> & { ifNotExists: boolean };

/** Checks everything that can be checked without the database, before anything is written. */
export function validateDefinition(input: DefineSequenceOptions): ValidDefinition {
  const o = plainObject('sequence definition', input);
  knownKeys('sequences.define', o, DEFINE_KEYS);
  const name = identifier('name', o.name);
  const kind = oneOf('kind', o.kind ?? 'gapless', ['gapless', 'batched'] as const);
  if (kind === 'batched') {
    throw invalid(`kind 'batched' is not available in this version of ordo; define '${name}' as 'gapless'`);
  }
  const start = safeInteger('start', o.start ?? 1);
  const increment = safeInteger('increment', o.increment ?? 1, 1);
  const minValue = safeInteger('minValue', o.minValue ?? start, -MAX_VALUE, start);
  const maxValue = safeInteger('maxValue', o.maxValue ?? MAX_VALUE, start);
  const timeZone = o.timeZone ?? 'UTC';
  if (typeof timeZone !== 'string' || timeZone.length === 0 || timeZone.length > 64) {
    throw invalid(
      `timeZone must be an IANA time zone name such as 'Europe/Paris' (got ${describe(timeZone)})`,
    );
  }
  return {
    name,
    kind,
    start,
    increment,
    minValue,
    maxValue,
    cycle: boolean('cycle', o.cycle ?? false),
    reset: oneOf('reset', o.reset ?? 'never', RESET_PERIODS),
    timeZone,
    format: o.format === undefined || o.format === null ? null : validateFormat(o.format),
    ifNotExists: boolean('ifNotExists', o.ifNotExists ?? false),
  };
}

export function toDefinition(row: Record<string, any>): SequenceDefinition {
  return {
    name: row.name,
    kind: row.kind,
    start: Number(row.start),
    increment: Number(row.increment),
    minValue: Number(row.min_value),
    maxValue: Number(row.max_value),
    cycle: row.cycle,
    reset: row.reset,
    timeZone: row.time_zone,
    format: row.format,
    createdAt: new Date(row.created_at),
    updatedAt: new Date(row.updated_at),
  };
}
