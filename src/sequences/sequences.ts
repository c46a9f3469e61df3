import type pg from 'pg';
import { asQueryable, type Queryable } from '../db/queryable.js';
import { OrdoError, toOrdoError } from '../errors.js';
import { boolean, describe, identifier, invalid, knownKeys, plainObject, safeInteger } from '../validate.js';
import { Coalescer, type Issued } from './coalescer.js';
import {
  type DefineSequenceOptions,
  type ResetPeriod,
  type SequenceDefinition,
  toDefinition,
  validateDefinition,
} from './definitions.js';
import type { SequencePlans } from './plans.js';

export interface NextOptions {
  /** Numbering is independent per scope (tenant); default ''. */
  scope?: string;
  /** Take the value inside this transaction: a rollback gives it back. */
  tx?: Queryable;
  /** The time whose period the value belongs to (default: the transaction's now()). */
  at?: Date | string;
}

export interface SequenceStatus {
  name: string;
  reset: ResetPeriod;
  /** null for a sequence that has issued nothing yet. */
  scope: string | null;
  period: string | null;
  /** The last value issued in this scope and period. */
  value: number | null;
}

export interface RemoveOptions {
  ifExists?: boolean;
}

/** Most values one call may take at once. */
export const MAX_COUNT = 10_000;
const MAX_SCOPE_LENGTH = 200;
const NEXT_KEYS = ['scope', 'tx', 'at'] as const;

interface Checked {
  name: string;
  scope: string;
  at: string | null;
  tx: Queryable | undefined;
}

export class Sequences {
  private readonly coalescer: Coalescer;

  /** @internal */
  constructor(
    private readonly pool: pg.Pool,
    private readonly plans: SequencePlans,
    private readonly ensureOpen: () => void,
  ) {
    this.coalescer = new Coalescer((name, scope, at, count) =>
      this.takeMany(this.pool, name, scope, at, count),
    );
  }

  async define(options: DefineSequenceOptions): Promise<SequenceDefinition> {
    this.ensureOpen();
    const d = validateDefinition(options);
    const values = [
      d.name,
      d.kind,
      d.start,
      d.increment,
      d.minValue,
      d.maxValue,
      d.cycle,
      d.reset,
      d.timeZone,
      d.format,
    ];
    const { rows } = await this.run(this.pool, this.plans.define, values);
    if (rows[0]) return toDefinition(rows[0]);
    const existing = d.ifNotExists ? await this.get(d.name) : null;
    if (existing) return existing;
    throw new OrdoError('sequence_exists', `The sequence '${d.name}' already exists`);
  }

  async get(name: string): Promise<SequenceDefinition | null> {
    this.ensureOpen();
    const { rows } = await this.run(this.pool, this.plans.get, [identifier('name', name)]);
    return rows[0] ? toDefinition(rows[0]) : null;
  }

  async list(): Promise<SequenceDefinition[]> {
    this.ensureOpen();
    const { rows } = await this.run(this.pool, this.plans.list, []);
    return rows.map(toDefinition);
  }

  /** Every sequence with its current value per scope and period. */
  async status(): Promise<SequenceStatus[]> {
    this.ensureOpen();
    const { rows } = await this.run(this.pool, this.plans.status, []);
    return rows.map((r) => ({
      name: r.name,
      reset: r.reset,
      scope: r.scope,
      period: r.period,
      value: r.value === null ? null : Number(r.value),
    }));
  }

  /** Removes a sequence and all its counters. Returns false when it did not exist and ifExists is set. */
  async remove(name: string, options: RemoveOptions = {}): Promise<boolean> {
    this.ensureOpen();
    const o = plainObject('remove options', options);
    knownKeys('sequences.remove', o, ['ifExists']);
    const ifExists = boolean('ifExists', o.ifExists ?? false);
    const { rows } = await this.run(this.pool, this.plans.remove, [identifier('name', name)]);
    if (rows.length > 0) return true;
    if (ifExists) return false;
    throw new OrdoError('sequence_not_found', `The sequence '${name}' does not exist`);
  }

  /** The next value: inside `tx` when given, else coalesced with concurrent standalone calls. */
  async next(name: string, options: NextOptions = {}): Promise<Issued> {
    this.ensureOpen();
    const c = checkNext(name, options);
    if (c.tx) {
      const [issued] = await this.takeMany(c.tx, c.name, c.scope, c.at, 1);
      return issued!;
    }
    return this.coalescer.take(c.name, c.scope, c.at);
  }

  /** `count` consecutive values, taken by one statement. */
  async nextMany(name: string, count: number, options: NextOptions = {}): Promise<Issued[]> {
    this.ensureOpen();
    const c = checkNext(name, options);
    const n = safeInteger('count', count, 1, MAX_COUNT);
    return this.takeMany(c.tx ?? this.pool, c.name, c.scope, c.at, n);
  }

  /** @internal Resolves when every coalesced call in flight has been answered. */
  idle(): Promise<void> {
    return this.coalescer.idle();
  }

  private async takeMany(
    db: Queryable,
    name: string,
    scope: string,
    at: string | null,
    count: number,
  ): Promise<Issued[]> {
    const { rows } = await this.run(db, this.plans.take, [name, scope, at, count]);
    return rows.map((r) => ({ value: Number(r.value), text: r.text, period: r.period, scope }));
  }

  private async run(db: Queryable, text: string, values: unknown[]): Promise<{ rows: any[] }> {
    try {
      return await db.query(text, values);
    } catch (e) {
      throw toOrdoError(e, text);
    }
  }
}

function checkNext(name: string, options: NextOptions): Checked {
  const o = plainObject('next options', options);
  knownKeys('sequences.next', o, NEXT_KEYS);
  const scope = o.scope ?? '';
  if (typeof scope !== 'string' || scope.length > MAX_SCOPE_LENGTH || scope.includes('\u0000')) {
    throw invalid(`scope must be a text of at most ${MAX_SCOPE_LENGTH} characters (got ${describe(scope)})`);
  }
  return {
    name: identifier('name', name),
    scope,
    at: checkAt(o.at),
    tx: o.tx === undefined ? undefined : asQueryable(o.tx),
  };
}

function checkAt(at: unknown): string | null {
  if (at === undefined) return null;
  const date = at instanceof Date ? at : typeof at === 'string' ? new Date(at) : undefined;
  if (!date || Number.isNaN(date.getTime())) {
    throw invalid(`at must be a Date or an ISO 8601 timestamp (got ${describe(at)})`);
  }
  return date.toISOString();
}
