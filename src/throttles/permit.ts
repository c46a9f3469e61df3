import type { Tx } from '../db/queryable.js';
import type { ThrottlePolicy } from './definitions.js';
import { OrdoError } from '../errors.js';
import { MAX_ERROR_LENGTH } from '../validate.js';

/** How a permit ended: by complete(), by fail(), or by its lease running out. */
export type PermitOutcome = 'completed' | 'failed' | 'expired';

/** What complete() and fail() answer. */
export interface PermitEnd {
  id: string;
  name: string;
  key: string;
  outcome: 'completed' | 'failed';
  /** The database's clock when the permit ended. */
  endedAt: Date;
  /** fail() only: whether the start (and token) is given back. */
  refunded: boolean;
}

export interface PermitCallOptions {
  /** Run the statement in this transaction. */
  tx?: Tx;
}

export interface FailOptions extends PermitCallOptions {
  /** Give back what the permit consumed (its `every` start, its tokens), so a retry may start at once. Default: the throttle's refundOnFailure. */
  refund?: boolean;
  /**
   * Hold the permit's keys this long (a downstream 429's Retry-After: '30s', or milliseconds):
   * every acquire on them is refused with reason 'paused' (or waits) until then.
   */
  retryAfter?: string | number;
}

/** One limit a permit holds: `cost` units of throttle `name` for `key`. */
export interface PermitItem {
  name: string;
  key: string;
  cost: number;
}

/** A refused acquire. */
export interface Refusal {
  granted: false;
  /** Milliseconds until every rate policy would allow (rounded up: sleeping that long is enough). */
  retryAfterMs: number;
  /** The policy that waits longest. For 'concurrency', a poll hint (docs/throttles.md, Refusals). */
  reason: ThrottlePolicy;
  /** The limit that waits longest (acquireAll: which of the items), or null when it is the line. */
  limit: { name: string; key: string } | null;
}

/** What Permit's methods call; implemented by Throttles. */
export interface PermitCalls {
  complete(id: string, options?: PermitCallOptions): Promise<PermitEnd>;
  fail(id: string, options?: FailOptions & { error?: unknown }): Promise<PermitEnd>;
  extend(id: string, options?: PermitCallOptions): Promise<Date>;
  /** complete() and fail() of a grant without a permit (expiresAt null): nothing is stored to end. */
  settle(
    permit: Permit,
    how: 'complete' | 'fail',
    options: FailOptions & { error?: unknown },
  ): Promise<PermitEnd>;
}

/**
 * A granted start. It counts against the throttle's concurrency until complete() or fail(),
 * or until its lease runs out (expiresAt), which extend() pushes back. From throttles defined
 * with `permits: false` it is a start only: expiresAt is null, nothing is stored under its id,
 * complete() makes no statement and fail() only pauses its keys when given retryAfter.
 */
export class Permit {
  readonly granted = true as const;
  #expiresAt: Date | null;
  readonly #grantedAt = performance.now();

  /** @internal Use ordo.throttles.acquire(). */
  constructor(
    private readonly calls: PermitCalls,
    readonly id: string,
    readonly name: string,
    readonly key: string,
    readonly holder: string,
    /** The database's clock at the grant. */
    readonly acquiredAt: Date,
    expiresAt: Date | null,
    /** Every limit the permit holds (acquireAll: one per item); name and key are the first's. */
    readonly items: readonly PermitItem[],
  ) {
    this.#expiresAt = expiresAt;
  }

  /** When the lease runs out unless extended (the database's clock); null: a start without a permit. */
  get expiresAt(): Date | null {
    return this.#expiresAt;
  }

  /**
   * @internal The database's clock now, as read at the grant and carried on by this process's
   * monotonic clock: the end of a start without a permit, which no statement records.
   */
  get clock(): Date {
    return new Date(this.acquiredAt.getTime() + (performance.now() - this.#grantedAt));
  }

  /** Ends the permit as completed. */
  complete(options?: PermitCallOptions): Promise<PermitEnd> {
    if (this.#expiresAt === null) return this.calls.settle(this, 'complete', { ...options });
    return this.calls.complete(this.id, options);
  }

  /**
   * Ends the permit as failed, recording `error` (an Error's message, or a text). With
   * `refund` (default: the throttle's refundOnFailure) the start is given back; with
   * `retryAfter` its keys are held until then.
   */
  fail(error?: unknown, options: FailOptions = {}): Promise<PermitEnd> {
    if (this.#expiresAt === null) return this.calls.settle(this, 'fail', { ...options, error });
    return this.calls.fail(this.id, { ...options, error });
  }

  /**
   * Renews the lease: expiresAt becomes the database's clock + the throttle's lease. A start
   * without a permit has no lease: refused with invalid_argument.
   */
  async extend(options?: PermitCallOptions): Promise<Date> {
    if (this.#expiresAt === null) throw noLease(this);
    const until = await this.calls.extend(this.id, options);
    if (until > this.#expiresAt) this.#expiresAt = until;
    return until;
  }

  toJSON() {
    return {
      granted: true,
      id: this.id,
      name: this.name,
      key: this.key,
      holder: this.holder,
      acquiredAt: this.acquiredAt,
      expiresAt: this.#expiresAt,
      items: this.items,
    };
  }
}

export type AcquireResult = Permit | Refusal;

/** What a start without a permit answers to what only a permit can do. */
export function noLease(permit: Permit, what = 'has no lease to extend'): OrdoError {
  return new OrdoError(
    'invalid_argument',
    `The start ${permit.id} of the throttle '${permit.name}' is not a permit (the throttle is defined with permits: false): it ${what}`,
  );
}

/** The text recorded for a failure: an Error's name and message, a text as it is, anything else as JSON. */
export function errorText(error: unknown): string | null {
  if (error === undefined || error === null) return null;
  let text: string;
  if (error instanceof Error)
    text = error.name && error.name !== 'Error' ? `${error.name}: ${error.message}` : error.message;
  else if (typeof error === 'string') text = error;
  else {
    try {
      text = JSON.stringify(error) ?? String(error);
    } catch {
      text = String(error);
    }
  }
  // NUL cannot be stored in a PostgreSQL text.
  return text.replaceAll('\u0000', '\uFFFD').slice(0, MAX_ERROR_LENGTH);
}
