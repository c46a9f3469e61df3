import { hostname } from 'node:os';
import type pg from 'pg';
import type { InFlight } from '../db/in-flight.js';
import { asQueryable, type Queryable, type Tx } from '../db/queryable.js';
import { OrdoError } from '../errors.js';
import { boolean, describe, identifier, invalid, knownKeys, plainObject, text } from '../validate.js';
import {
  type DefineThrottleOptions,
  type ThrottleDefinition,
  type ThrottlePolicy,
  toThrottleDefinition,
  validateThrottle,
} from './definitions.js';
import { Batcher } from './batcher.js';
import { LeaseKeeper } from './lease-keeper.js';
import {
  type AcquireResult,
  errorText,
  type FailOptions,
  Permit,
  type PermitCallOptions,
  type PermitCalls,
  type PermitEnd,
  type PermitOutcome,
} from './permit.js';
import { type ThrottlePlans, throttlePlans } from './plans.js';

export interface AcquireOptions {
  /** Limits apply per key (a tenant, a user, a task id); default ''. At most 200 characters. */
  key?: string;
  /** Who holds the permit, shown by state() and `ordo status`; default `host:pid:nodeId`. */
  holder?: string;
  /**
   * Decide inside this transaction: the grant (and the key's row lock) commits or rolls back
   * with it. The key's decisions wait for that transaction to end: keep it short.
   */
  tx?: Tx;
}

export interface RunOptions {
  key?: string;
  holder?: string;
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
  /** The database's clock when this was read. */
  observedAt: Date;
}

const MAX_TEXT = 200;
/** Most requests one coalesced statement serves. */
const MAX_BATCH = 256;

/** A standalone call waiting for a shared statement. */
type Job = { kind: 'acquire'; name: string; key: string; holder: string } | { kind: 'complete'; id: string };
const ACQUIRE_KEYS = ['key', 'holder', 'tx'] as const;
const RUN_KEYS = ['key', 'holder'] as const;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/**
 * Throttles: at most one start per interval, token buckets and concurrency limits per key,
 * with leases that know how each task ended. Every decision is one SQL call on the database
 * clock (see sql/migrations/0004_throttles.sql).
 */
export class Throttles {
  private readonly plans: ThrottlePlans;
  private readonly defaultHolder: string;
  private readonly keepers = new Set<LeaseKeeper>();
  private readonly calls: PermitCalls;
  private readonly runCalls: PermitCalls;
  /** Standalone acquires and completions, coalesced into shared statements. */
  private readonly shared: Batcher<Job, Record<string, any>>;

  /** @internal */
  constructor(
    private readonly pool: pg.Pool,
    schema: string,
    private readonly ensureOpen: (withTx?: boolean) => void,
    private readonly inFlight: InFlight,
    nodeId: string,
  ) {
    this.plans = throttlePlans(schema);
    // Two statements in flight: both cores of a small server busy, and big batches (on a hot
    // key one lock and one commit serve a whole batch). More callers share them.
    const poolSize = (pool as { options?: { max?: number } }).options?.max ?? 10;
    const slots = Math.max(1, Math.min(2, Math.floor(poolSize / 2)));
    this.shared = new Batcher(
      (job) => this.serveOne(job),
      (jobs) => this.serveMany(jobs),
      slots,
      MAX_BATCH,
    );
    this.defaultHolder = `${hostname()}:${process.pid}:${nodeId}`.slice(0, MAX_TEXT);
    // A permit from acquire() ends and extends through the public calls by id (refused once
    // close() has begun); one held by run() bypasses that check, since close() waits for run().
    this.calls = {
      complete: (id, options) => this.complete(id, options),
      fail: (id, options) => this.fail(id, options),
      extend: (id, options) => this.extend(id, options),
    };
    this.runCalls = {
      complete: (id, options) => this.end('complete', id, { ...options }),
      fail: (id, options) => this.end('fail', id, { ...options }),
      extend: (id, options) => this.renew(id, { ...options }),
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
   * One decision on the database clock: a Permit, or a refusal with how long to wait.
   * complete() or fail() the permit when the task ends; extend() it if the task may outlast
   * the lease.
   */
  async acquire(name: string, options: AcquireOptions = {}): Promise<AcquireResult> {
    this.ensureOpen(options?.tx !== undefined);
    return this.decide(name, options, this.calls);
  }

  private async decide(name: string, options: AcquireOptions, calls: PermitCalls): Promise<AcquireResult> {
    const o = plainObject('acquire options', options);
    knownKeys('throttles.acquire', o, ACQUIRE_KEYS);
    const checkedName = identifier('name', name);
    const key = text('key', o.key ?? '', 0, MAX_TEXT);
    const holder = text('holder', o.holder ?? this.defaultHolder, 1, MAX_TEXT);
    const r =
      o.tx === undefined
        ? await this.inFlight.track(this.shared.submit({ kind: 'acquire', name: checkedName, key, holder }))
        : (await this.query(asQueryable(o.tx), this.plans.acquire, [checkedName, key, holder])).rows[0]!;
    if (!r.granted) return { granted: false, retryAfterMs: Number(r.retry_after_ms), reason: r.reason };
    return new Permit(
      calls,
      r.permit_id,
      checkedName,
      key,
      r.holder,
      new Date(r.acquired_at),
      new Date(r.expires_at),
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
    const o = plainObject(`${how} options`, options);
    if (how === 'complete') {
      knownKeys('throttles.complete', o, ['tx']);
      const checked = permitId(id);
      if (o.tx === undefined) {
        return toPermitEnd(await this.inFlight.track(this.shared.submit({ kind: 'complete', id: checked })));
      }
      const { rows } = await this.query(asQueryable(o.tx), this.plans.complete, [checked]);
      return toPermitEnd(rows[0]);
    }
    knownKeys('throttles.fail', o, ['error', 'refund', 'tx']);
    const refund = o.refund === undefined ? null : boolean('refund', o.refund);
    const { rows } = await this.query(db(this.pool, o.tx), this.plans.fail, [
      permitId(id),
      errorText(o.error),
      refund,
    ]);
    return toPermitEnd(rows[0]);
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
    const got = await this.decide(name, options, this.runCalls);
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

  /** A key's last start, last end and outcome ("did the last FOO fail?"), and its live permits. */
  async state(name: string, key = ''): Promise<ThrottleState> {
    this.ensureOpen();
    const checkedName = identifier('name', name);
    const checkedKey = text('key', key, 0, MAX_TEXT);
    const { rows } = await this.query(this.pool, this.plans.state, [checkedName, checkedKey]);
    const r = rows[0];
    const date = (v: unknown) => (v === null || v === undefined ? null : new Date(v as string));
    return {
      name: checkedName,
      key: checkedKey,
      lastStartAt: date(r.last_start),
      starts: Number(r.starts),
      lastEndAt: date(r.last_end),
      lastOutcome: r.last_outcome,
      lastError: r.last_error,
      lastPermitId: r.last_permit,
      running: (r.permits as Record<string, string>[]).map((p) => ({
        id: p.id!,
        name: checkedName,
        key: checkedKey,
        holder: p.holder!,
        acquiredAt: new Date(p.acquired_at!),
        expiresAt: new Date(p.expires_at!),
      })),
      observedAt: new Date(r.observed_at),
    };
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
      return (await this.query(this.pool, this.plans.acquire, [job.name, job.key, job.holder])).rows[0];
    }
    return (await this.query(this.pool, this.plans.complete, [job.id])).rows[0];
  }

  /** Many calls in one statement; a completion left unanswered is served alone (which names its error). */
  private async serveMany(jobs: Job[]): Promise<(Record<string, any> | undefined)[]> {
    const ids: string[] = [];
    const decide: number[] = [];
    for (const [i, job] of jobs.entries()) {
      if (job.kind === 'complete') ids.push(job.id);
      else decide.push(i);
    }
    const acquires = decide.map((i) => jobs[i] as Extract<Job, { kind: 'acquire' }>);
    const { rows } = await this.query(this.pool, this.plans.batch, [
      ids,
      acquires.map((a) => a.name),
      acquires.map((a) => a.key),
      acquires.map((a) => a.holder),
    ]);
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
