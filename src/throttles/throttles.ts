import { hostname } from 'node:os';
import type pg from 'pg';
import { Batcher, statementSlots } from '../db/batcher.js';
import type { InFlight } from '../db/in-flight.js';
import type { Notifications } from '../db/notifications.js';
import { asQueryable, type Queryable, type Tx } from '../db/queryable.js';
import { durationOption } from '../durations.js';
import { OrdoError } from '../errors.js';
import {
  boolean,
  describe,
  identifier,
  invalid,
  knownKeys,
  plainObject,
  MAX_TEXT,
  safeInteger,
  text,
} from '../validate.js';
import {
  MAX_DURATION_MS,
  MAX_LIMIT,
  REFUSAL_REASONS,
  type DefineThrottleOptions,
  type ThrottleDefinition,
  type ThrottlePolicy,
  toThrottleDefinition,
  validateThrottle,
} from './definitions.js';
import { LeaseKeeper } from './lease-keeper.js';
import { type Decision, type Item, WaitingLine, waitingWithTx } from './line.js';
import {
  type AcquireResult,
  errorText,
  type FailOptions,
  noLease,
  Permit,
  type PermitCallOptions,
  type PermitCalls,
  type PermitEnd,
  type PermitOutcome,
} from './permit.js';
import { type ThrottlePlans, throttlePlans } from './plans.js';

export interface AcquireOptions extends AcquireAllOptions {
  /** Limits apply per key (a tenant, a user, a task id); default ''. At most 200 characters. */
  key?: string;
  /** Units this start takes: tokens of a bucket and slots of a concurrency limit (default 1). */
  cost?: number;
}

/** One limit of acquireAll(): `cost` units (default 1) of throttle `name` for `key` (default ''). */
export interface AcquireItem {
  name: string;
  key?: string;
  cost?: number;
}

export interface AcquireAllOptions {
  /** Who holds the permit, shown by state() and `ordo status`; default `host:pid:nodeId`. */
  holder?: string;
  /**
   * Decide inside this transaction: the grant (and the keys' row locks) commits or rolls back
   * with it. The keys' decisions wait for that transaction to end: keep it short.
   */
  tx?: Tx;
  /**
   * Wait in line up to this long ('30s', or milliseconds; at most 10 minutes) instead of being
   * refused at once: first come first served among requests for the same limits, round-robin
   * among requests that share a limit. Refused after it with the last reason. Not with tx.
   */
  wait?: string | number;
  /**
   * Aborting it ends the wait at once (the caller went away): the request leaves the line and
   * is answered with its last refusal, or with the permit if it was granted meanwhile.
   */
  signal?: AbortSignal;
}

export interface RunOptions {
  key?: string;
  holder?: string;
  cost?: number;
  wait?: string | number;
}

/** A key's own limits (null: the throttle's), for tiers such as a premium tenant. */
export interface KeyLimits {
  every?: string | number | null;
  limit?: number | null;
  per?: string | number | null;
  concurrency?: number | null;
}

/** The limits a key has: its own where set, else the throttle's. */
export interface EffectiveLimits {
  everyMs: number | null;
  limit: number | null;
  perMs: number | null;
  concurrency: number | null;
}

export interface PauseOptions {
  /** Pause one key; without it, the whole throttle. */
  key?: string;
  /** Until this time, or for this long ('30s', or milliseconds). */
  until: Date | string | number;
}

/** What this client decided and ended, per throttle, since it started (for metrics). */
export interface ThrottleCounters {
  granted: number;
  refused: Record<ThrottlePolicy, number>;
  completed: number;
  failed: number;
  refunded: number;
}

export interface RunContext {
  /** Aborted when an extension of the lease fails (the permit may be dead): stop the work. */
  signal: AbortSignal;
  permit: Permit;
}

export type RunResult<T> =
  { ran: true; value: T } | { ran: false; retryAfterMs: number; reason: ThrottlePolicy };

export interface RemoveThrottleOptions {
  ifExists?: boolean;
}

/** A live permit, as state() and running() list them. */
export interface RunningPermit {
  id: string;
  name: string;
  key: string;
  holder: string;
  acquiredAt: Date;
  expiresAt: Date;
}

/** What a key of a throttle did last. */
export interface ThrottleState {
  name: string;
  key: string;
  /** The last granted start, or null when none was ever granted. */
  lastStartAt: Date | null;
  /** Starts granted on this key so far. */
  starts: number;
  /** The permit that ended last (by its end time): when, how, and its error text. */
  lastEndAt: Date | null;
  lastOutcome: PermitOutcome | null;
  lastError: string | null;
  lastPermitId: string | null;
  /** Live permits, oldest first. */
  running: RunningPermit[];
  /** The key's own limits (null where it has the throttle's); see setKeyLimits(). */
  ownLimits: {
    everyMs: number | null;
    limit: number | null;
    perMs: number | null;
    concurrency: number | null;
  };
  /** Until when the key, or the whole throttle, is paused (the later of the two), or null. */
  pausedUntil: Date | null;
  /** Requests waiting in line for this key. */
  waiting: number;
  /** The database's clock when this was read. */
  observedAt: Date;
}

/** Most requests one coalesced statement serves. */
const MAX_BATCH = 256;
/** Most limits one request takes at once. */
export const MAX_ITEMS = 16;
/** The longest wait in line. */
export const MAX_WAIT_MS = 10 * 60_000;

/** A standalone call waiting for a shared statement. */
type Job = { kind: 'acquire'; items: Item[]; holder: string } | { kind: 'complete'; id: string };
const ACQUIRE_KEYS = ['key', 'cost', 'holder', 'tx', 'wait', 'signal'] as const;
const ACQUIRE_ALL_KEYS = ['holder', 'tx', 'wait', 'signal'] as const;
const RUN_KEYS = ['key', 'cost', 'holder', 'wait'] as const;
const ISO_DATE = /^\d{4}-\d{2}-\d{2}/;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/**
 * Throttles: at most one start per interval, token buckets and concurrency limits per key,
 * with leases that know how each task ended. Every decision is one SQL call on the database
 * clock (acquire_all(), throttle_wait() and throttle_batch(), in sql/functions/throttles/).
 */
export class Throttles {
  private readonly plans: ThrottlePlans;
  private readonly defaultHolder: string;
  private readonly keepers = new Set<LeaseKeeper>();
  private readonly calls: PermitCalls;
  private readonly runCalls: PermitCalls;
  /** Standalone acquires and completions, coalesced into shared statements. */
  private readonly shared: Batcher<Job, Record<string, any>>;
  private readonly line: WaitingLine;
  readonly #counters = new Map<string, ThrottleCounters>();

  /** @internal */
  constructor(
    private readonly pool: pg.Pool,
    schema: string,
    private readonly ensureOpen: (withTx?: boolean) => void,
    private readonly inFlight: InFlight,
    nodeId: string,
    notifications: Notifications,
  ) {
    this.plans = throttlePlans(schema);
    this.line = new WaitingLine(pool, this.plans, notifications, (text, values) =>
      this.query(this.pool, text, values),
    );
    this.shared = new Batcher({
      one: (job) => this.serveOne(job),
      many: (jobs) => this.serveMany(jobs),
      slots: statementSlots((pool as { options?: { max?: number } }).options?.max),
      maxBatch: MAX_BATCH,
      // A decision is the database's work: two statements at once use two of its cores.
      spread: true,
      // A completion is its own key; a decision's is its first limit. So a decision may go in
      // the other statement than an end made at the same moment (it may not see that end), and
      // two requests sharing only a later limit may wait there for each other's lock.
      keyOf: (job) => (job.kind === 'complete' ? job.id : `${job.items[0]!.name}\u0000${job.items[0]!.key}`),
    });
    this.defaultHolder = `${hostname()}:${process.pid}:${nodeId}`.slice(0, MAX_TEXT);
    // A permit from acquire() ends and extends through the public calls by id (refused once
    // close() has begun); one held by run() bypasses that check, since close() waits for run().
    this.calls = {
      complete: (id, options) => this.complete(id, options),
      fail: (id, options) => this.fail(id, options),
      extend: (id, options) => this.extend(id, options),
      settle: (permit, how, options) => {
        this.ensureOpen(options.tx !== undefined);
        return this.settle(permit, how, options);
      },
    };
    this.runCalls = {
      complete: (id, options) => this.end('complete', id, { ...options }),
      fail: (id, options) => this.end('fail', id, { ...options }),
      extend: (id, options) => this.renew(id, { ...options }),
      settle: (permit, how, options) => this.settle(permit, how, options),
    };
  }

  /** Creates a throttle (or with ifNotExists / overwrite, keeps or replaces an existing one). */
  async define(options: DefineThrottleOptions): Promise<ThrottleDefinition> {
    this.ensureOpen();
    const d = validateThrottle(options);
    const { rows } = await this.query(this.pool, this.plans.define, [
      d.name,
      d.everyMs,
      d.limit,
      d.perMs,
      d.concurrency,
      d.leaseMs,
      d.refundOnFailure,
      d.mode,
      d.permits,
    ]);
    const row = rows[0]!;
    if (row.outcome === 'exists' && d.mode === 'create') {
      throw new OrdoError('throttle_exists', `The throttle '${d.name}' already exists`);
    }
    return toThrottleDefinition(row);
  }

  async get(name: string): Promise<ThrottleDefinition | null> {
    this.ensureOpen();
    const { rows } = await this.query(this.pool, this.plans.get, [identifier('name', name)]);
    return rows[0] ? toThrottleDefinition(rows[0]) : null;
  }

  async list(): Promise<ThrottleDefinition[]> {
    this.ensureOpen();
    const { rows } = await this.query(this.pool, this.plans.list, []);
    return rows.map(toThrottleDefinition);
  }

  /**
   * Removes a throttle with every key's state and permits (waiting for decisions in flight).
   * Returns false when it did not exist and ifExists is set.
   */
  async remove(name: string, options: RemoveThrottleOptions = {}): Promise<boolean> {
    this.ensureOpen();
    const o = plainObject('remove options', options);
    knownKeys('throttles.remove', o, ['ifExists']);
    const ifExists = boolean('ifExists', o.ifExists ?? false);
    const { rows } = await this.query(this.pool, this.plans.remove, [identifier('name', name)]);
    if (rows[0].removed) return true;
    if (ifExists) return false;
    throw throttleNotFound(name);
  }

  /**
   * One decision on the database clock: a Permit, or a refusal with how long to wait (with
   * `wait`, after waiting in line that long at most). complete() or fail() the permit when
   * the task ends; extend() it if the task may outlast the lease.
   */
  async acquire(name: string, options: AcquireOptions = {}): Promise<AcquireResult> {
    this.ensureOpen(options?.tx !== undefined);
    const o = plainObject('acquire options', options);
    knownKeys('throttles.acquire', o, ACQUIRE_KEYS);
    return this.decide(
      [toItem({ name, key: o.key as string | undefined, cost: o.cost as number | undefined })],
      o,
      this.calls,
    );
  }

  /**
   * Several limits at once ("at most 50 calls in total, at most 5 per tenant"): granted only
   * if every item grants, in one statement, with one permit whose complete / fail / extend
   * apply to all of them. Refused, it names the limit that waits longest.
   */
  async acquireAll(items: AcquireItem[], options: AcquireAllOptions = {}): Promise<AcquireResult> {
    this.ensureOpen(options?.tx !== undefined);
    if (!Array.isArray(items) || items.length < 1 || items.length > MAX_ITEMS)
      throw invalid(
        `acquireAll takes 1 to ${MAX_ITEMS} items { name, key?, cost? } (got ${describe(items)})`,
      );
    const o = plainObject('acquireAll options', options);
    knownKeys('throttles.acquireAll', o, ACQUIRE_ALL_KEYS);
    const checked = items.map((item, i) => toItem(plainObject(`item ${i}`, item) as unknown as AcquireItem));
    const seen = new Set<string>();
    for (const i of checked) {
      const id = JSON.stringify([i.name, i.key]);
      if (seen.has(id)) throw invalid(`acquireAll names the throttle '${i.name}' with key '${i.key}' twice`);
      seen.add(id);
    }
    return this.decide(checked, o, this.calls);
  }

  private async decide(
    items: Item[],
    o: Record<string, unknown>,
    calls: PermitCalls,
  ): Promise<AcquireResult> {
    const holder = text('holder', o.holder ?? this.defaultHolder, 1, MAX_TEXT);
    const waitMs = o.wait === undefined ? null : durationOption('wait', o.wait, 0, MAX_WAIT_MS);
    if (waitMs !== null && o.tx !== undefined) throw waitingWithTx();
    if (o.signal !== undefined && !(o.signal instanceof AbortSignal))
      throw invalid('signal must be an AbortSignal');
    const values = [items.map((i) => i.name), items.map((i) => i.key), items.map((i) => i.cost), holder];
    const r: Decision =
      o.tx !== undefined
        ? (await this.query(asQueryable(o.tx as Tx), this.plans.acquire, values)).rows[0]!
        : waitMs !== null && waitMs > 0
          ? await this.inFlight.track(
              this.line.wait(items, holder, waitMs, o.signal as AbortSignal | undefined),
            )
          : await this.inFlight.track(this.shared.submit({ kind: 'acquire', items, holder }));
    const counters = this.countersOf(items[0]!.name);
    if (!r.granted) {
      const reason: ThrottlePolicy = r.reason;
      counters.refused[reason]++;
      return {
        granted: false,
        retryAfterMs: Number(r.retry_after_ms),
        reason,
        limit:
          r.limit_name === null || r.limit_name === undefined
            ? null
            : { name: r.limit_name, key: r.limit_key },
      };
    }
    counters.granted++;
    return new Permit(
      calls,
      r.permit_id,
      items[0]!.name,
      items[0]!.key,
      r.holder,
      new Date(r.acquired_at),
      r.expires_at === null ? null : new Date(r.expires_at),
      items,
    );
  }

  /** Ends a live permit as completed. */
  async complete(id: string, options: PermitCallOptions = {}): Promise<PermitEnd> {
    this.ensureOpen(options?.tx !== undefined);
    return this.end('complete', id, options);
  }

  /**
   * Ends a live permit as failed, recording `error`. With `refund` (default: the throttle's
   * refundOnFailure) the next decision on its key gives back its start and token.
   */
  async fail(id: string, options: FailOptions & { error?: unknown } = {}): Promise<PermitEnd> {
    this.ensureOpen(options?.tx !== undefined);
    return this.end('fail', id, options);
  }

  /** Renews a live permit's lease to the database's clock + the throttle's lease; returns the new expiry. */
  async extend(id: string, options: PermitCallOptions = {}): Promise<Date> {
    this.ensureOpen(options?.tx !== undefined);
    return this.renew(id, options);
  }

  private async end(
    how: 'complete' | 'fail',
    id: string,
    options: FailOptions & { error?: unknown },
  ): Promise<PermitEnd> {
    const o = endOptions(how, options);
    if (how === 'complete') {
      const checked = permitId(id);
      if (o.tx === undefined) {
        return this.ended(
          toPermitEnd(await this.inFlight.track(this.shared.submit({ kind: 'complete', id: checked }))),
        );
      }
      const { rows } = await this.query(asQueryable(o.tx), this.plans.complete, [checked]);
      return this.ended(toPermitEnd(rows[0]));
    }
    const { rows } = await this.query(db(this.pool, o.tx), this.plans.fail, [
      permitId(id),
      errorText(o.error),
      o.refund,
      o.holdMs,
    ]);
    return this.ended(toPermitEnd(rows[0]));
  }

  /**
   * The end of a start without a permit: nothing is stored to end, so no statement, except
   * that fail() with retryAfter holds its keys as a permit's hold would. A refund is
   * refused: the start was not recorded, so there is nothing exact to give back.
   */
  private async settle(
    permit: Permit,
    how: 'complete' | 'fail',
    options: FailOptions & { error?: unknown },
  ): Promise<PermitEnd> {
    const o = endOptions(how, options);
    if (o.refund === true) throw noLease(permit, 'has no record of what it took to give back');
    if (o.holdMs !== null) {
      const { items } = permit;
      await this.query(db(this.pool, o.tx), this.plans.hold, [
        items.map((i) => i.name),
        items.map((i) => i.key),
        o.holdMs,
      ]);
    }
    return this.ended({
      id: permit.id,
      name: permit.name,
      key: permit.key,
      outcome: how === 'complete' ? 'completed' : 'failed',
      endedAt: permit.clock,
      refunded: false,
    });
  }

  /** Counts an end for metrics, and passes it on. */
  private ended(end: PermitEnd): PermitEnd {
    const c = this.countersOf(end.name);
    if (end.outcome === 'completed') c.completed++;
    else c.failed++;
    if (end.refunded) c.refunded++;
    return end;
  }

  private async renew(id: string, options: PermitCallOptions): Promise<Date> {
    const o = plainObject('extend options', options);
    knownKeys('throttles.extend', o, ['tx']);
    const { rows } = await this.query(db(this.pool, o.tx), this.plans.extend, [permitId(id)]);
    return new Date(rows[0].expires_at);
  }

  /**
   * Runs `fn` under a permit: acquires (or answers { ran: false, retryAfterMs } at once),
   * extends the lease every third of it while fn runs, then completes, or on a throw fails
   * (refunding as the throttle's refundOnFailure says) and rethrows fn's error. If an
   * extension fails (the lease ran out, or someone ended the permit), fn's context signal is
   * aborted with that error, and run() then throws completion's error (permit_expired or
   * permit_not_found, caused by the extension's) rather than report a success that may have
   * overlapped the next start. Tracked like any call: close() waits for fn.
   */
  async run<T>(
    name: string,
    fn: (context: RunContext) => T | Promise<T>,
    options: RunOptions = {},
  ): Promise<RunResult<T>> {
    this.ensureOpen();
    if (typeof fn !== 'function') throw invalid(`fn must be a function (got ${describe(fn)})`);
    const o = plainObject('run options', options);
    knownKeys('throttles.run', o, RUN_KEYS);
    return this.inFlight.track(this.runUnder(name, fn, o as RunOptions));
  }

  private async runUnder<T>(
    name: string,
    fn: (context: RunContext) => T | Promise<T>,
    options: RunOptions,
  ): Promise<RunResult<T>> {
    const got = await this.decide(
      [toItem({ name, key: options.key, cost: options.cost })],
      options as Record<string, unknown>,
      this.runCalls,
    );
    if (!got.granted) return { ran: false, retryAfterMs: got.retryAfterMs, reason: got.reason };
    const keeper = new LeaseKeeper(got);
    this.keepers.add(keeper);
    let value: T;
    try {
      value = await fn({ signal: keeper.signal, permit: got });
    } catch (error) {
      await this.stopKeeper(keeper);
      await got.fail(error).catch(() => undefined);
      throw error;
    }
    await this.stopKeeper(keeper);
    try {
      await got.complete();
    } catch (e) {
      // Lost while fn ran: say so, with the extension's error as the cause when there was one.
      if (keeper.lost !== undefined && e instanceof OrdoError)
        throw new OrdoError(e.code, e.message, { cause: keeper.lost });
      throw e;
    }
    return { ran: true, value };
  }

  /** A key's last start, last end and outcome ("did the last FOO fail?"), its own limits, pause, line and live permits. */
  async state(name: string, key = ''): Promise<ThrottleState> {
    this.ensureOpen();
    const { rows } = await this.query(this.pool, this.plans.state, [
      identifier('name', name),
      text('key', key, 0, MAX_TEXT),
    ]);
    return toThrottleState(rows[0]);
  }

  /** The keys of a throttle with a state, the most recently active first (at most `limit`, default 100). */
  async keys(name: string, options: { limit?: number } = {}): Promise<ThrottleState[]> {
    this.ensureOpen();
    const o = plainObject('keys options', options);
    knownKeys('throttles.keys', o, ['limit']);
    const limit = o.limit === undefined ? 100 : safeInteger('limit', o.limit, 1, 10_000);
    const { rows } = await this.query(this.pool, this.plans.keys, [identifier('name', name), limit]);
    return rows.map(toThrottleState);
  }

  /**
   * Gives one key its own limits (a premium tenant): each of every / limit / per / concurrency
   * given replaces the throttle's for that key from its next decision on; null or absent keeps
   * the throttle's. Returns the limits the key now has. removeKeyLimits() undoes it.
   */
  async setKeyLimits(name: string, key: string, limits: KeyLimits): Promise<EffectiveLimits> {
    this.ensureOpen();
    const o = plainObject('key limits', limits);
    knownKeys('throttles.setKeyLimits', o, ['every', 'limit', 'per', 'concurrency']);
    const ms = (what: string, v: unknown) =>
      v === undefined || v === null ? null : durationOption(what, v, 1, MAX_DURATION_MS);
    const n = (what: string, v: unknown) =>
      v === undefined || v === null ? null : safeInteger(what, v, 1, MAX_LIMIT);
    return this.keyLimits(name, key, [
      ms('every', o.every),
      n('limit', o.limit),
      ms('per', o.per),
      n('concurrency', o.concurrency),
    ]);
  }

  /** The key has the throttle's limits again. Returns them. */
  async removeKeyLimits(name: string, key: string): Promise<EffectiveLimits> {
    this.ensureOpen();
    return this.keyLimits(name, key, [null, null, null, null]);
  }

  private async keyLimits(name: string, key: string, values: (number | null)[]): Promise<EffectiveLimits> {
    const { rows } = await this.query(this.pool, this.plans.setKeyLimits, [
      identifier('name', name),
      text('key', key, 0, MAX_TEXT),
      ...values,
    ]);
    const r = rows[0]!;
    return {
      everyMs: num(r.every_ms),
      limit: num(r.rate_limit),
      perMs: num(r.per_ms),
      concurrency: num(r.concurrency),
    };
  }

  /**
   * Holds a throttle, or one key of it, until a time: every acquire is refused with reason
   * 'paused' (or waits) meanwhile. fail(error, { retryAfter }) does the same for a permit's keys.
   */
  async pause(name: string, options: PauseOptions): Promise<void> {
    this.ensureOpen();
    const o = plainObject('pause options', options);
    knownKeys('throttles.pause', o, ['key', 'until']);
    const until = o.until;
    if (until instanceof Date) {
      if (Number.isNaN(until.getTime())) throw invalid('until must be a valid Date');
      return this.pausing(name, o.key, until, null);
    }
    // A text is an ISO 8601 time ('2026-12-01T00:00:00Z') or a duration ('30s').
    if (typeof until === 'string' && ISO_DATE.test(until)) {
      const at = new Date(until);
      if (Number.isNaN(at.getTime())) throw invalid(`until is not a valid time: ${describe(until)}`);
      return this.pausing(name, o.key, at, null);
    }
    return this.pausing(name, o.key, null, durationOption('until', until, 1, MAX_DURATION_MS));
  }

  /** Ends a pause of the throttle, or of one key. */
  async resume(name: string, options: { key?: string } = {}): Promise<void> {
    this.ensureOpen();
    const o = plainObject('resume options', options);
    knownKeys('throttles.resume', o, ['key']);
    await this.pausing(name, o.key, null, null);
  }

  private async pausing(name: string, key: unknown, at: Date | null, forMs: number | null): Promise<void> {
    const checkedKey = key === undefined ? null : text('key', key, 0, MAX_TEXT);
    await this.query(this.pool, this.plans.pause, [identifier('name', name), checkedKey, at, forMs]);
  }

  /** What this client decided and ended, per throttle name (the first item's for acquireAll). */
  get counters(): ReadonlyMap<string, ThrottleCounters> {
    return this.#counters;
  }

  private countersOf(name: string): ThrottleCounters {
    let c = this.#counters.get(name);
    if (!c) {
      const refused = Object.fromEntries(REFUSAL_REASONS.map((r) => [r, 0])) as Record<
        ThrottlePolicy,
        number
      >;
      this.#counters.set(name, (c = { granted: 0, refused, completed: 0, failed: 0, refunded: 0 }));
    }
    return c;
  }

  /** Live permits of every throttle (or of one), by throttle, key and start. */
  async running(name?: string): Promise<RunningPermit[]> {
    this.ensureOpen();
    const checked = name === undefined ? null : identifier('name', name);
    const { rows } = await this.query(this.pool, this.plans.running, [checked]);
    return rows.map((r) => ({
      id: r.id,
      name: r.name,
      key: r.key,
      holder: r.holder,
      acquiredAt: new Date(r.acquired_at),
      expiresAt: new Date(r.expires_at),
    }));
  }

  /** One call on its own, when a shared statement failed or left it unanswered (it then reports its own error). */
  private async serveOne(job: Job): Promise<Record<string, any>> {
    if (job.kind === 'acquire') {
      const { items, holder } = job;
      const values = [items.map((i) => i.name), items.map((i) => i.key), items.map((i) => i.cost), holder];
      return (await this.query(this.pool, this.plans.acquire, values)).rows[0];
    }
    return (await this.query(this.pool, this.plans.complete, [job.id])).rows[0];
  }

  /** Many calls in one statement; a completion left unanswered is served alone (which names its error). */
  private async serveMany(jobs: Job[]): Promise<(Record<string, any> | undefined)[]> {
    const ids: string[] = [];
    const decide: number[] = [];
    const req: number[] = [];
    const names: string[] = [];
    const keys: string[] = [];
    const costs: number[] = [];
    const holders: string[] = [];
    for (const [i, job] of jobs.entries()) {
      if (job.kind === 'complete') {
        ids.push(job.id);
        continue;
      }
      decide.push(i);
      for (const item of job.items) {
        req.push(decide.length);
        names.push(item.name);
        keys.push(item.key);
        costs.push(item.cost);
        holders.push(job.holder);
      }
    }
    const { rows } = await this.query(this.pool, this.plans.batch, [ids, req, names, keys, costs, holders]);
    const answers: (Record<string, any> | undefined)[] = jobs.map(() => undefined);
    const ended = new Map<string, Record<string, any>>();
    for (const r of rows) {
      if (r.request === null) {
        ended.set(r.permit_id, {
          id: r.permit_id,
          name: r.name,
          key: r.key,
          outcome: 'completed',
          ended_at: r.ended_at,
          refunded: false,
        });
      } else answers[decide[r.request - 1]!] = r;
    }
    for (const [i, job] of jobs.entries()) if (job.kind === 'complete') answers[i] = ended.get(job.id);
    return answers;
  }

  /** Stops what runs in the background (lease renewals of run()); called by Ordo.close(). */
  async close(): Promise<void> {
    await this.line.close();
    await Promise.all([...this.keepers].map((k) => this.stopKeeper(k)));
  }

  private async stopKeeper(keeper: LeaseKeeper): Promise<void> {
    this.keepers.delete(keeper);
    await keeper.stop();
  }

  /** Every statement goes through here: errors become OrdoErrors, and close() waits for it. */
  private query(db: Queryable, text: string, values: unknown[]): Promise<{ rows: any[] }> {
    return this.inFlight.query(db, text, values);
  }
}

/** complete() and fail() options, checked alike for permits and starts without one. */
function endOptions(how: 'complete' | 'fail', options: FailOptions & { error?: unknown }) {
  const o = plainObject(`${how} options`, options);
  if (how === 'complete') knownKeys('throttles.complete', o, ['tx']);
  else knownKeys('throttles.fail', o, ['error', 'refund', 'retryAfter', 'tx']);
  return {
    tx: o.tx,
    error: o.error,
    refund: o.refund === undefined ? null : boolean('refund', o.refund),
    holdMs:
      o.retryAfter === undefined ? null : durationOption('retryAfter', o.retryAfter, 1, MAX_DURATION_MS),
  };
}

export function throttleNotFound(name: string): OrdoError {
  return new OrdoError('throttle_not_found', `The throttle '${name}' does not exist`);
}

function db(pool: pg.Pool, tx: unknown): Queryable {
  return tx === undefined ? pool : asQueryable(tx);
}

function permitId(id: unknown): string {
  if (typeof id !== 'string' || !UUID.test(id)) {
    throw invalid(`a permit id is a UUID such as the one acquire() returned (got ${describe(id)})`);
  }
  return id.toLowerCase();
}

function toPermitEnd(row: Record<string, any>): PermitEnd {
  return {
    id: row.id,
    name: row.name,
    key: row.key,
    outcome: row.outcome,
    endedAt: new Date(row.ended_at),
    refunded: row.refunded,
  };
}

function toItem(input: AcquireItem): Item {
  return {
    name: identifier('name', input.name),
    key: text('key', input.key ?? '', 0, MAX_TEXT),
    cost: input.cost === undefined ? 1 : safeInteger('cost', input.cost, 1, MAX_LIMIT),
  };
}

const num = (v: unknown) => (v === null || v === undefined ? null : Number(v));
const date = (v: unknown) => (v === null || v === undefined ? null : new Date(v as string));

function toThrottleState(r: Record<string, any>): ThrottleState {
  const paused = [date(r.paused_until), date(r.throttle_paused_until)].filter((d): d is Date => d !== null);
  return {
    name: r.name,
    key: r.key,
    lastStartAt: date(r.last_start),
    starts: Number(r.starts),
    lastEndAt: date(r.last_end),
    lastOutcome: r.last_outcome,
    lastError: r.last_error,
    lastPermitId: r.last_permit,
    running: (r.permits as Record<string, string>[]).map((p) => ({
      id: p.id!,
      name: r.name,
      key: r.key,
      holder: p.holder!,
      acquiredAt: new Date(p.acquired_at!),
      expiresAt: new Date(p.expires_at!),
    })),
    ownLimits: {
      everyMs: num(r.own_every_ms),
      limit: num(r.own_rate_limit),
      perMs: num(r.own_per_ms),
      concurrency: num(r.own_concurrency),
    },
    pausedUntil: paused.length === 0 ? null : new Date(Math.max(...paused.map((d) => d.getTime()))),
    waiting: Number(r.waiting),
    observedAt: new Date(r.observed_at),
  };
}
