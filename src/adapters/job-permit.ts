import { durationOption } from '../durations.js';
import { OrdoError } from '../errors.js';
import type { Ordo } from '../ordo.js';
import { MAX_DURATION_MS, MAX_LIMIT, type ThrottlePolicy } from '../throttles/definitions.js';
import { LeaseKeeper } from '../throttles/lease-keeper.js';
import type { Permit } from '../throttles/permit.js';
import { type AcquireItem, MAX_ITEMS, MAX_WAIT_MS } from '../throttles/throttles.js';
import {
  describe,
  identifier,
  invalid,
  knownKeys,
  MAX_TEXT,
  plainObject,
  safeInteger,
  text,
} from '../validate.js';

/** A value given once, or read from each job (a tenant from its data). */
export type FromJob<J, T> = T | ((job: J) => T);

/** One limit a job takes: `cost` units (default 1) of throttle `name` for `key` (default ''). */
export interface JobLimit<J> {
  name: string;
  key?: FromJob<J, string>;
  cost?: FromJob<J, number>;
}

/** What every adapter takes: which limits a job needs, and whether a worker waits in line for them. */
export interface ThrottledOptions<J> {
  /**
   * The throttle a job must be granted before it runs, or several at once (a global and a
   * per-tenant limit: granted together or not at all, as acquireAll() grants them).
   */
  throttle: string | readonly JobLimit<J>[];
  /** With `throttle` as a name: the key, or how to read it from the job. */
  key?: FromJob<J, string>;
  /** With `throttle` as a name: the units the job takes, or how to read them from the job. */
  cost?: FromJob<J, number>;
  /**
   * Wait in ordo's line this long ('30s', or milliseconds; at most 10 minutes) before handing a
   * refused job back to its queue: cheaper when a start is near, since the job keeps its worker
   * and its turn, and a refunded failure lets the next one start at once.
   */
  wait?: string | number;
}

/** What the job's processor gets besides the job. */
export interface JobContext {
  /**
   * Aborted when the permit may be lost (an extension of its lease failed) or when the queue
   * itself cancels the job: stop the work, since another start may follow.
   */
  signal: AbortSignal;
  /** The permit the job runs under (its id, its lease, the limits it holds). */
  permit: Permit;
}

/** How a job went: it ran under a permit, or it must go back to its queue for `retryAfterMs`. */
export type Around<R> =
  { ran: true; value: R } | { ran: false; retryAfterMs: number; reason: ThrottlePolicy };

const OPTION_KEYS = ['throttle', 'key', 'cost', 'wait'] as const;
const LIMIT_KEYS = ['name', 'key', 'cost'] as const;

/**
 * The permit around a job, which every queue adapter shares: the job's limits taken at once
 * (acquireAll), the lease renewed while it runs (the LeaseKeeper that run() uses), and the
 * job's outcome ending the permit (complete, or fail with its error and the throttle's refund
 * rule). A refusal, or a failure that names a `retryAfter` (a downstream 429), is answered as
 * `{ ran: false }` for the adapter to hand the job back to its queue: it is the throttle's
 * decision, not the job's attempt.
 */
export class JobPermits<J> {
  private constructor(
    private readonly ordo: Ordo,
    private readonly limits: readonly JobLimit<J>[],
    private readonly waitMs: number | undefined,
  ) {}

  /**
   * Checks everything at once, before a worker takes any job: the processor, the options (with
   * `extra` for the adapter's own), and that every throttle named exists.
   */
  static async create<J>(
    adapter: string,
    ordo: unknown,
    options: unknown,
    processor: unknown,
    extra: readonly string[] = [],
  ): Promise<JobPermits<J>> {
    if (typeof (ordo as Ordo | undefined)?.throttles?.acquireAll !== 'function')
      throw invalid(
        `${adapter}: throttled() takes an ordo client first, from createOrdo() (got ${describe(ordo)})`,
      );
    const o = plainObject(`${adapter} options`, options);
    knownKeys(`${adapter} throttled()`, o, [...OPTION_KEYS, ...extra]);
    if (typeof processor !== 'function')
      throw invalid(
        `${adapter}: throttled() takes the job's processor last, a function of the job and { signal, permit } (got ${describe(processor)})`,
      );
    const limits = toLimits<J>(o);
    const waitMs = o.wait === undefined ? undefined : durationOption('wait', o.wait, 0, MAX_WAIT_MS);
    const client = ordo as Ordo;
    for (const name of new Set(limits.map((l) => l.name))) {
      if ((await client.throttles.get(name)) === null)
        throw new OrdoError(
          'throttle_not_found',
          `The throttle '${name}' does not exist: define it (ordo.throttles.define({ name: '${name}', … })) before the worker starts`,
        );
    }
    return new JobPermits<J>(client, limits, waitMs);
  }

  /**
   * Runs `work` under a permit for `job`, or answers why not and for how long. `queueSignal` is
   * the queue's own for the job (a cancellation, a shutdown): it ends a wait in line, and is
   * passed on within the signal `work` gets.
   */
  async around<R>(
    job: J,
    queueSignal: AbortSignal | undefined,
    work: (context: JobContext) => R | Promise<R>,
  ): Promise<Around<R>> {
    const got = await this.ordo.throttles.acquireAll(this.itemsOf(job), {
      ...(this.waitMs === undefined ? {} : { wait: this.waitMs }),
      ...(queueSignal === undefined ? {} : { signal: queueSignal }),
    });
    if (!got.granted) return { ran: false, retryAfterMs: got.retryAfterMs, reason: got.reason };
    const keeper = new LeaseKeeper(got);
    const signal = queueSignal === undefined ? keeper.signal : AbortSignal.any([keeper.signal, queueSignal]);
    let value: R;
    try {
      value = await work({ signal, permit: got });
    } catch (error) {
      await keeper.stop();
      const holdMs = retryAfterOf(error);
      await got.fail(error, holdMs === null ? {} : { retryAfter: holdMs }).catch(unended(got));
      if (holdMs !== null) return { ran: false, retryAfterMs: holdMs, reason: 'paused' };
      throw error;
    }
    await keeper.stop();
    // The job's outcome is its processor's: a permit that cannot be ended now (its lease lapsed,
    // the database is away) is recorded as expired, and the job is not run a second time for it.
    await got.complete().catch(unended(got));
    return { ran: true, value };
  }

  private itemsOf(job: J): AcquireItem[] {
    return this.limits.map((l) => ({
      name: l.name,
      key: typeof l.key === 'function' ? fromJob(l, 'key', l.key(job)) : l.key,
      cost: typeof l.cost === 'function' ? fromJob(l, 'cost', l.cost(job)) : l.cost,
    })) as AcquireItem[];
  }
}

/** The limits as given: one throttle with key and cost beside it, or a list of them. */
function toLimits<J>(o: Record<string, unknown>): JobLimit<J>[] {
  const { throttle } = o;
  if (typeof throttle === 'string')
    return [toLimit({ name: throttle, key: o.key, cost: o.cost }, 'throttle')];
  if (!Array.isArray(throttle))
    throw invalid(
      `throttle must be a throttle's name, or a list of 1 to ${MAX_ITEMS} limits { name, key?, cost? } (got ${describe(throttle)})`,
    );
  if (o.key !== undefined || o.cost !== undefined)
    throw invalid(
      'with a list of limits, give each its own key and cost: { throttle: [{ name, key, cost }, …] }',
    );
  if (throttle.length < 1 || throttle.length > MAX_ITEMS)
    throw invalid(`throttle lists 1 to ${MAX_ITEMS} limits (got ${throttle.length})`);
  return throttle.map((item, i) => {
    const limit = plainObject(`throttle[${i}]`, item);
    knownKeys(`throttle[${i}]`, limit, LIMIT_KEYS);
    return toLimit(limit, `throttle[${i}]`);
  });
}

function toLimit<J>(l: Record<string, unknown>, what: string): JobLimit<J> {
  const name = identifier(what === 'throttle' ? 'throttle' : `${what}.name`, l.name);
  const key =
    l.key === undefined || typeof l.key === 'function'
      ? l.key
      : text(`the key of '${name}'`, l.key, 0, MAX_TEXT);
  const cost =
    l.cost === undefined || typeof l.cost === 'function'
      ? l.cost
      : safeInteger(`the cost of '${name}'`, l.cost, 1, MAX_LIMIT);
  return { name, key, cost } as JobLimit<J>;
}

/** What a key or cost function returned, checked with the job's limit named. */
function fromJob<J>(limit: JobLimit<J>, what: 'key' | 'cost', value: unknown): string | number {
  return what === 'key'
    ? text(`the key read from the job for '${limit.name}'`, value, 0, MAX_TEXT)
    : safeInteger(`the cost read from the job for '${limit.name}'`, value, 1, MAX_LIMIT);
}

/**
 * The hold a failure asks for: an error with `retryAfter` ('30s', or milliseconds), as a
 * downstream 429's Retry-After is passed on. Anything else is an ordinary failure.
 */
function retryAfterOf(error: unknown): number | null {
  const given = (error as { retryAfter?: unknown } | null | undefined)?.retryAfter;
  if (given === undefined || given === null) return null;
  try {
    return durationOption('retryAfter', given, 1, MAX_DURATION_MS);
  } catch {
    return null;
  }
}

/**
 * A permit whose end could not be recorded: its lease lapses and it is recorded as expired. Said
 * as ordo says what it notices, since the job's own outcome stands.
 */
function unended(permit: Permit): (error: unknown) => void {
  return (error) => {
    const code = error instanceof OrdoError ? error.code : 'database_error';
    process.emitWarning(
      `The permit ${permit.id} of the throttle '${permit.name}' could not be ended (${(error as Error)?.message ?? String(error)}); it is recorded as expired when its lease lapses`,
      { type: 'OrdoWarning', code },
    );
  };
}
