import type pg from 'pg';
import { arrayElements, nullable } from '../db/arrays.js';
import type { InFlight } from '../db/in-flight.js';
import { asQueryable, type Queryable, type Tx } from '../db/queryable.js';
import { OrdoError, sequenceNotFound } from '../errors.js';
import {
  boolean,
  describe,
  identifier,
  invalid,
  knownKeys,
  plainObject,
  safeInteger,
  MAX_TEXT,
  text,
} from '../validate.js';
import type { Notifications } from '../db/notifications.js';
import {
  type AttachOptions,
  type Attachment,
  checkAttach,
  checkDetach,
  type CounterHolder,
  type DetachOptions,
  toAttachment,
  toHolder,
} from './attachments.js';
import {
  type CounterValue,
  type HeldRange,
  type SequenceActivity,
  toActivity,
  toCounterValue,
  toHeldRange,
} from './activity.js';
import { BatchedRegistry } from './batched-registry.js';
import { Coalescer, type Issued, type Request } from './coalescer.js';
import { statementSlots } from '../db/batcher.js';
import {
  type DefineSequenceOptions,
  parseTimeout,
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
  tx?: Tx;
  /** The time whose period the value belongs to (default: the transaction's now()). */
  at?: Date | string;
  /**
   * Gapless only: a call repeated with the same key (and the same scope and count) within a
   * day gets the same values instead of new ones, so a retry after a lost answer loses nothing.
   */
  idempotencyKey?: string;
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
const NEXT_KEYS = ['scope', 'tx', 'at', 'idempotencyKey'] as const;
export const MAX_IDEMPOTENCY_KEY_LENGTH = 200;
/** Most rows one listing returns. */
const MAX_LISTED = 10_000;

/** A definition being looked up, and once it has answered, its value. */
interface KnownDefinition {
  lookup: Promise<SequenceDefinition>;
  value?: SequenceDefinition;
}

/** Which counter a take names: the sequence, the scope, and the time whose period it is. */
type CounterKey = Pick<Request, 'name' | 'scope' | 'at'>;

interface Checked extends CounterKey {
  tx: Queryable | undefined;
  idempotencyKey: string | undefined;
}

export class Sequences {
  private readonly coalescer: Coalescer;
  /**
   * Definitions this node has used, for dispatch by kind; dropped on any change. One lookup per
   * name at a time; `value` once it has answered, for next({ tx }) to go straight to the statement.
   */
  private readonly definitions = new Map<string, KnownDefinition>();
  private readonly batched: BatchedRegistry;

  /** @internal */
  constructor(
    private readonly pool: pg.Pool,
    private readonly plans: SequencePlans,
    private readonly ensureOpen: (withTx?: boolean) => void,
    private readonly inFlight: InFlight,
    private readonly nodeId: string,
    isClosed: () => boolean,
    notifications: Notifications,
  ) {
    this.batched = new BatchedRegistry(
      pool,
      plans,
      nodeId,
      (db, text, values, retryMs) => this.run(db, text, values, retryMs),
      isClosed,
      (name) => this.definitions.delete(name),
      notifications,
    );
    this.coalescer = new Coalescer(
      (r) => this.take(this.pool, r, r.count),
      (requests) => this.takeMany(requests),
      statementSlots((pool as { options?: { max?: number } }).options?.max),
    );
  }

  async define(options: DefineSequenceOptions): Promise<SequenceDefinition> {
    this.ensureOpen();
    const d = validateDefinition(options);
    const { rows } = await this.run(this.pool, this.plans.define, [
      d.name,
      d.kind,
      d.start,
      d.increment,
      d.minValue,
      d.maxValue,
      d.cycle,
      d.batch,
      d.timeoutMs,
      d.reset,
      d.timeZone,
      d.format,
      d.mode,
      d.yearStart,
    ]);
    const row = rows[0]!;
    if (row.outcome === 'exists' && d.mode === 'create') {
      throw new OrdoError('sequence_exists', `The sequence '${d.name}' already exists`);
    }
    const definition = toDefinition(row);
    if (row.outcome !== 'exists') {
      this.definitions.delete(d.name);
      this.batched.redefined(definition);
    }
    return definition;
  }

  async get(name: string): Promise<SequenceDefinition | null> {
    this.ensureOpen();
    return this.read(identifier('name', name));
  }

  /** The stored definition, by a call already accepted (not refused once close() has begun). */
  private async read(name: string): Promise<SequenceDefinition | null> {
    const { rows } = await this.run(this.pool, this.plans.get, [name]);
    return rows[0] ? toDefinition(rows[0]) : null;
  }

  async list(): Promise<SequenceDefinition[]> {
    this.ensureOpen();
    const { rows } = await this.run(this.pool, this.plans.list, []);
    return rows.map(toDefinition);
  }

  /** Sets (or with null removes) a sequence's reservation timeout; running nodes pick it up. */
  async alterTimeout(name: string, timeout: number | string | null): Promise<SequenceDefinition> {
    this.ensureOpen();
    const timeoutMs = parseTimeout(timeout);
    const { rows } = await this.run(this.pool, this.plans.alterTimeout, [
      identifier('name', name),
      timeoutMs,
    ]);
    if (!rows[0].altered) throw sequenceNotFound(name);
    this.definitions.delete(name);
    const definition = (await this.read(name))!;
    this.batched.redefined(definition);
    return definition;
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
    this.forget(name);
    if (rows[0].removed) return true;
    if (ifExists) return false;
    throw sequenceNotFound(name);
  }

  /**
   * Numbers `options.column` of every row inserted into `options.table` from now on, by any
   * client: the next gapless value, written as the row's transaction commits (the counter's
   * lock is held for the commit only). Rolled-back rows consume nothing. Returns false when
   * the column was numbered so already.
   */
  async attach(name: string, options: AttachOptions): Promise<boolean> {
    this.ensureOpen();
    const [sequence, a] = checkAttach(name, options);
    const { rows } = await this.run(this.pool, this.plans.attach, [
      sequence,
      a.table,
      a.column,
      a.scopeColumn,
      a.textColumn,
    ]);
    return rows[0].attached;
  }

  /**
   * Stops numbering a column. Dropping its triggers needs the table alone: it waits for every
   * transaction reading or writing it (rows written before are numbered as they commit), at
   * most `lockTimeout` (5 s), then fails with `timeout` and changes nothing. Returns false when
   * the column was not numbered by this sequence.
   */
  async detach(name: string, options: DetachOptions): Promise<boolean> {
    this.ensureOpen();
    const { rows } = await this.run(this.pool, this.plans.detach, checkDetach(name, options));
    return rows[0].detached;
  }

  /** The columns numbered at commit, by one sequence or by all. */
  async attachments(name?: string): Promise<Attachment[]> {
    this.ensureOpen();
    const { rows } = await this.run(this.pool, this.plans.attachments, [
      name === undefined ? null : identifier('name', name),
    ]);
    return rows.map(toAttachment);
  }

  /**
   * The transactions holding this sequence's counters (or every sequence's, without a name)
   * right now: numbers taken in a caller's transaction that has not ended, and how many wait
   * behind each. Why numbering is slow.
   */
  async holders(name?: string): Promise<CounterHolder[]> {
    this.ensureOpen();
    const { rows } = await this.run(this.pool, this.plans.holders, [
      name === undefined ? null : identifier('name', name),
    ]);
    if (name !== undefined && rows.length === 0) throw sequenceNotFound(name);
    return rows.filter((r) => r.scope !== null).map(toHolder);
  }

  /**
   * The next value. Gapless: inside `tx` when given (a rollback gives it back), else coalesced
   * with concurrent standalone calls. Batched: from this node's range in memory (never in `tx`).
   */
  next(name: string, options: NextOptions = {}): Promise<Issued> {
    let c: Checked;
    try {
      this.ensureOpen(options?.tx !== undefined);
      c = checkNext(name, options);
    } catch (e) {
      return Promise.reject(e);
    }
    // One number in the caller's transaction of a sequence known gapless: the statement and
    // nothing around it, since each async step a call waits through costs Node more than the
    // step's own work.
    if (c.tx && c.idempotencyKey === undefined && this.definitions.get(c.name)?.value?.kind === 'gapless') {
      return this.takeValue(c.tx, c);
    }
    return this.issue(c, 1).then((issued) => issued[0]!);
  }

  /** `count` consecutive values (gapless: one statement; batched: from this node's ranges). */
  async nextMany(name: string, count: number, options: NextOptions = {}): Promise<Issued[]> {
    this.ensureOpen(options?.tx !== undefined);
    const checked = safeInteger('count', count, 1, MAX_COUNT);
    return this.issue(checkNext(name, options), checked);
  }

  /** @internal A batched value straight from memory, or undefined. The hot path of ordo.nextval(). */
  handOutNow(name: string): number | undefined {
    return this.batched.get(name)?.handOutNow();
  }

  /** Range reservations this node has made, per batched sequence. */
  get reservations(): ReadonlyMap<string, number> {
    return this.batched.reservations;
  }

  /**
   * Gapless counters (of one sequence, or of all) with their current value, the most recently
   * used first: at most `limit` (default 100). Read without waiting for any transaction.
   */
  async counters(options: { name?: string; limit?: number } = {}): Promise<CounterValue[]> {
    this.ensureOpen();
    const o = plainObject('counters options', options);
    knownKeys('sequences.counters', o, ['name', 'limit']);
    const name = o.name === undefined ? null : identifier('name', o.name);
    const limit = safeInteger('limit', o.limit ?? 100, 1, MAX_LISTED);
    const { rows } = await this.run(this.pool, this.plans.counters, [name, limit]);
    return rows.map(toCounterValue);
  }

  /**
   * The ranges of batched sequences each node holds (those of its last two reservations of the
   * current definition), with how much of each this node has used of its own.
   */
  async ranges(name?: string): Promise<HeldRange[]> {
    this.ensureOpen();
    const checked = name === undefined ? null : identifier('name', name);
    const { rows } = await this.run(this.pool, this.plans.ranges, [checked]);
    return rows.map((r) =>
      toHeldRange(r, r.node_id === this.nodeId ? this.batched.get(r.sequence)?.held() : undefined),
    );
  }

  /** How many values each sequence has given out so far (gapless: issued; batched: reserved). */
  async activity(): Promise<SequenceActivity[]> {
    this.ensureOpen();
    const { rows } = await this.run(this.pool, this.plans.activity, []);
    return rows.map(toActivity);
  }

  /** Calls `listener` after each reservation this node makes (one statement, one range or several), with its duration; returns the unsubscribe. */
  onReservation(listener: (sequence: string, ms: number) => void): () => void {
    this.batched.reservationListeners.add(listener);
    return () => this.batched.reservationListeners.delete(listener);
  }

  /** @internal Resolves when every call accepted so far has been answered, and no range is being reserved. */
  async idle(): Promise<void> {
    do {
      await this.coalescer.idle();
      await this.inFlight.idle();
      await this.batched.settle();
    } while (this.inFlight.busy);
  }

  /** @internal Stops listening and drops every range held. */
  close(): Promise<void> {
    return this.batched.close();
  }

  /**
   * Issues the values of a call next() or nextMany() has accepted (checked, and open), by the
   * sequence's kind: batched from this node's ranges; gapless with take_once() when the call
   * has an idempotency key, in the caller's transaction when it gives one, else coalesced with
   * the other standalone calls.
   */
  private async issue(c: Checked, count: number, retried = false): Promise<Issued[]> {
    const definition = await this.definition(c.name, c.tx);
    try {
      if (definition.kind === 'batched') return await this.handOutBatched(definition, c, count);
      if (c.idempotencyKey !== undefined) return await this.takeOnce(c.tx ?? this.pool, c, count);
      if (c.tx) return count === 1 ? [await this.takeValue(c.tx, c)] : await this.take(c.tx, c, count);
      return await this.coalescer.submit(c.name, c.scope, c.at, count);
    } catch (e) {
      // Redefined as the other kind by another node since we looked: once more, freshly. Not in
      // a caller's transaction: the error has aborted it, and the caller must know.
      if (this.forgetIfStale(e, c.name) === 'other kind' && !retried && !c.tx) {
        this.ensureOpen();
        return this.issue(c, count, true);
      }
      throw e;
    }
  }

  /** Forgets a definition the error shows changed since it was read; says how. */
  private forgetIfStale(e: unknown, name: string): 'other kind' | 'removed' | undefined {
    const stale =
      (e as { cause?: { code?: string } }).cause?.code === 'OX004'
        ? 'other kind'
        : e instanceof OrdoError && e.code === 'sequence_not_found'
          ? 'removed'
          : undefined;
    if (stale) this.forget(name);
    return stale;
  }

  /** `count` values of a batched sequence from this node's ranges, refusing what only gapless ones take. */
  private async handOutBatched(definition: SequenceDefinition, c: Checked, count: number): Promise<Issued[]> {
    if (c.scope !== '' || c.at !== null) {
      throw invalid(`The sequence '${c.name}' is batched: it takes no scope and no at`);
    }
    if (c.idempotencyKey !== undefined) {
      throw invalid(
        `The sequence '${c.name}' is batched: it takes no idempotency key (a value whose answer was lost is a gap, as any unused value)`,
      );
    }
    const allocator = this.batched.open(definition);
    const issued: Issued[] = [];
    for (let i = 0; i < count; i++) {
      const value = allocator.handOutNow() ?? (await allocator.handOut());
      issued.push({ value, text: String(value), period: null, scope: '' });
    }
    return issued;
  }

  /**
   * The definition, cached. Looked up through the caller's transaction when there is one: with
   * every pooled connection lent to transactions that each take a number, a lookup on the pool
   * would wait behind them all.
   */
  private definition(name: string, tx?: Queryable): Promise<SequenceDefinition> {
    const known = this.definitions.get(name);
    if (known) return known.lookup;
    const entry: KnownDefinition = {
      lookup: this.run(tx ?? this.pool, this.plans.get, [name]).then(({ rows }) => {
        if (!rows[0]) throw sequenceNotFound(name);
        entry.value = toDefinition(rows[0]);
        return entry.value;
      }),
    };
    this.definitions.set(name, entry);
    entry.lookup.catch(() => {
      if (this.definitions.get(name) === entry) this.definitions.delete(name);
    });
    return entry.lookup;
  }

  private forget(name: string): void {
    this.definitions.delete(name);
    this.batched.forget(name);
  }

  /** take(): `count` consecutive gapless values of one (sequence, scope, at), in one statement. */
  private async take(db: Queryable, r: CounterKey, count: number): Promise<Issued[]> {
    const { rows } = await this.run(db, this.plans.take, [r.name, r.scope, r.at, count]);
    return rows.map((row) => ({
      value: Number(row.value),
      text: row.text,
      period: row.period,
      scope: r.scope,
    }));
  }

  /**
   * take_value(): one value in the caller's transaction, the hot path of next({ tx }); a
   * definition the error shows stale is forgotten.
   */
  private takeValue(db: Queryable, c: Checked): Promise<Issued> {
    return this.run(db, this.plans.takeValue, [c.name, c.scope, c.at]).then(
      ({ rows }) => {
        const [value, text, period] = arrayElements(rows[0].issued) as [string, string, string | null];
        return { value: Number(value), text, period: nullable(period), scope: c.scope };
      },
      (e: unknown) => {
        this.forgetIfStale(e, c.name);
        throw e;
      },
    );
  }

  /** take_once(): the values of the call's idempotency key, the same ones when it is repeated. */
  private async takeOnce(db: Queryable, c: Checked, count: number): Promise<Issued[]> {
    const { rows } = await this.run(db, this.plans.takeOnce, [
      c.name,
      c.scope,
      c.at,
      count,
      c.idempotencyKey,
    ]);
    return rows.map((r) => ({ value: Number(r.value), text: r.text, period: r.period, scope: c.scope }));
  }

  /** take_many(): several coalesced requests in one statement; answer i holds the values of request i. */
  private async takeMany(requests: Request[]): Promise<Issued[][]> {
    const { rows } = await this.run(this.pool, this.plans.takeMany, [
      requests.map((r) => r.name),
      requests.map((r) => r.scope),
      requests.map((r) => r.at),
      requests.map((r) => r.count),
    ]);
    const answers: Issued[][] = requests.map(() => []);
    for (const r of rows) {
      const i = r.request - 1;
      answers[i]!.push({ value: Number(r.value), text: r.text, period: r.period, scope: requests[i]!.scope });
    }
    return answers;
  }

  /** Every statement goes through here: errors become OrdoErrors, and close() waits for it. */
  private run(db: Queryable, text: string, values: unknown[], retryMs?: number): Promise<{ rows: any[] }> {
    return this.inFlight.query(db, text, values, retryMs);
  }
}

function checkNext(name: string, options: NextOptions): Checked {
  const o = plainObject('next options', options);
  knownKeys('sequences.next', o, NEXT_KEYS);
  const scope = text('scope', o.scope ?? '', 0, MAX_TEXT);
  return {
    name: identifier('name', name),
    scope,
    at: checkAt(o.at),
    tx: o.tx === undefined ? undefined : asQueryable(o.tx),
    idempotencyKey: o.idempotencyKey === undefined ? undefined : checkKey(o.idempotencyKey),
  };
}

function checkKey(key: unknown): string {
  return text('idempotencyKey', key, 1, MAX_IDEMPOTENCY_KEY_LENGTH);
}

/** A date, or a date-time with an explicit offset: a local time without one would be read in the Node process's zone. */
const ISO_8601 =
  /^\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?(?:Z|[+-]\d{2}(?::?\d{2})?))?$/i;
// Date.UTC would read the year 1 as 1901: parse instead.
const FIRST_INSTANT = Date.parse('0001-01-01T00:00:00Z');
const LAST_INSTANT = Date.parse('9999-12-31T23:59:59.999Z');

/** ISO 8601 as ISO_8601 describes it, and a real calendar day (no 30 February rolling into March). */
function isIsoDate(text: string): boolean {
  if (!ISO_8601.test(text)) return false;
  const [year, month, day] = text.slice(0, 10).split('-').map(Number) as [number, number, number];
  const probe = new Date(0);
  probe.setUTCFullYear(year, month - 1, day);
  return probe.getUTCMonth() === month - 1 && probe.getUTCDate() === day;
}

function checkAt(at: unknown): string | null {
  if (at === undefined) return null;
  const date = at instanceof Date ? at : typeof at === 'string' && isIsoDate(at) ? new Date(at) : undefined;
  const time = date?.getTime() ?? Number.NaN;
  if (Number.isNaN(time) || time < FIRST_INSTANT || time > LAST_INSTANT) {
    throw invalid(
      `at must be a Date or an ISO 8601 timestamp with an offset, such as '2026-12-31T23:00:00Z', in the years 1 to 9999 (got ${describe(at)})`,
    );
  }
  return date!.toISOString();
}
