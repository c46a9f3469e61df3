import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { backoffDelay } from '../db/backoff.js';
import { closedError, OrdoError, type OrdoErrorCode } from '../errors.js';
import { formatTimeout } from './definitions.js';

/** A range reserved by one nextval() on the sequence's storage: first, first + increment, …, last. */
export interface Reservation {
  first: number;
  last: number;
  increment: number;
  /** The definition's epoch when the range was reserved. */
  epoch: number;
  /** The definition's current TIMEOUT, so ALTER SEQUENCE … TIMEOUT reaches running nodes. */
  timeoutMs: number | null;
}

/** What a node's supply holds right now: the range in use (`next` the first value not handed out) and those after it. */
export interface HeldSupply {
  current: { first: number; next: number; last: number } | undefined;
  ahead: { first: number; last: number }[];
}

/**
 * Reserves `ranges` ranges in one statement (fewer near the sequence's maximum), in increasing
 * order; `waitMs` bounds how long the statement may wait for a lock.
 */
export type Reserve = (name: string, waitMs: number | null, ranges: number) => Promise<Reservation[]>;

/**
 * The most ranges one reservation asks for. A node asks for about twice what it used during its
 * last round trip, so this bounds both the statement and what a node that stops without closing
 * leaves as a gap.
 */
export const MAX_RANGES_PER_RESERVATION = 64;

/** Failures worth another try: the database was busy, unreachable, or changed under us. */
const RETRYABLE = new Set<OrdoErrorCode>(['timeout', 'database_unavailable', 'database_error']);

export const TIMEOUT_MESSAGE = 'The query was not executed because it exceeded the timeout';

/** SurrealDB 3's timeout error: the message, then the timeout (`…: 0ns`, `…: 5s`). */
export function timeoutError(timeoutMs: number, cause?: unknown): OrdoError {
  return new OrdoError('timeout', `${TIMEOUT_MESSAGE}: ${formatTimeout(timeoutMs)}`, { cause });
}

/**
 * What a node gives back when it closes: the values from `from` up to the end of the range
 * that starts at `lastFirst`, the last one it reserved (in `epoch`). None was handed out.
 */
export interface UnusedTail {
  from: number;
  lastFirst: number;
  epoch: number;
}

/**
 * One node's supply of a batched sequence. Values come from a range in memory with no I/O.
 * Ranges are reserved in the background, at most one reservation in flight, so that the node
 * never waits once it runs steadily: a reservation starts when fewer ranges are ahead than one
 * reservation brings, and it asks for about twice as many as were used during the last one's
 * round trip (doubling when callers waited for it), from 1 up to MAX_RANGES_PER_RESERVATION.
 * A node taking a value now and then holds the range in use and one ahead; a busy one holds
 * enough for a round trip. Values are unique across nodes (ranges come from one PostgreSQL
 * sequence) and increase within this node. Dropping the supply (the sequence was redefined or
 * removed) discards its ranges: a gap, never a reuse.
 */
export class Allocator {
  /** The current range: `first` … `last`, `next` the first value not handed out. */
  private first = 1;
  private next = 1;
  private last = 0;
  private increment = 1;
  private epoch: number | undefined;
  /** Ranges reserved and not yet in use, in order. */
  private ahead: Reservation[] = [];
  private reserving: Promise<void> | undefined;
  /** How many ranges the next reservation asks for. */
  private perReservation = 1;
  /** Ranges put in use so far: the count during a round trip measures the demand. */
  private installs = 0;
  /** A caller found nothing in memory while a reservation was in flight: it started too late. */
  private starved = false;
  /** Bumped by drop(): a reservation started before it must not install its range. */
  private generation = 0;
  /** Ranges of older definitions are never installed (see retire()). */
  private floor = 0;

  constructor(
    readonly name: string,
    private readonly reserve: Reserve,
    private timeoutMs: number | null,
    private readonly isClosed: () => boolean,
  ) {}

  /** The definition epoch of the ranges held, if any. */
  get heldEpoch(): number | undefined {
    return this.epoch;
  }

  /** The ranges held, for the dashboard: read only. */
  held(): HeldSupply {
    const { epoch, first, next, last, ahead } = this;
    return {
      current: epoch === undefined || last < first ? undefined : { first, next, last },
      ahead: ahead.map((r) => ({ first: r.first, last: r.last })),
    };
  }

  /** A value from memory, or undefined when the ranges held are used up. */
  handOutNow(): number | undefined {
    if (this.next > this.last) {
      const r = this.ahead.shift();
      if (!r) return undefined;
      this.install(r);
    }
    const value = this.next;
    this.next += this.increment;
    if (!this.reserving && this.ahead.length < this.perReservation) {
      this.refill().catch(() => undefined); // a failed prefetch is retried by the caller who needs it
    }
    return value;
  }

  /** A value, waiting for a reservation when none is in memory. */
  async handOut(): Promise<number> {
    for (;;) {
      const value = this.handOutNow();
      if (value !== undefined) return value;
      this.starved ||= this.reserving !== undefined;
      await this.refill();
    }
  }

  /** Resolves when no reservation is in flight (whether it succeeded or not). */
  async settle(): Promise<void> {
    while (this.reserving) await this.reserving.catch(() => undefined);
  }

  /**
   * Drops every range held, returning the values never handed out that end the last range
   * reserved: that range, the ranges ahead just before it with no value between, and the rest
   * of the current range if it adjoins them. (A range ahead after a gap, where another node
   * reserved meanwhile, stays a gap.) Synchronous, so nothing can be handed out from what is
   * returned.
   */
  release(): UnusedTail | undefined {
    const { epoch, ahead, first, next, last, increment } = this;
    this.drop();
    if (epoch === undefined) return undefined;
    const held = next <= last ? [{ first: next, last }, ...ahead] : ahead;
    const lastRange = ahead.at(-1) ?? { first, last };
    let from: number | undefined;
    for (let i = held.length - 1; i >= 0; i--) {
      from = held[i]!.first;
      if (i > 0 && held[i - 1]!.last + increment !== held[i]!.first) break;
    }
    return from === undefined ? undefined : { from, lastFirst: lastRange.first, epoch };
  }

  /**
   * The definition is now the one of `epoch` (epochs only grow): ranges of older ones are
   * discarded, held or in flight, and a range of this one is kept — such as the one a
   * reservation waiting behind the redefinition's lock took just after it, or the range
   * reserved before this node's own redefinition came back to it as a notification.
   */
  retire(epoch: number, timeoutMs: number | null): void {
    this.timeoutMs = timeoutMs;
    if (epoch <= this.floor) return;
    this.floor = epoch;
    if (this.epoch !== undefined && this.epoch < epoch) this.clear();
  }

  /** Discards every range held and in flight: the sequence was removed, or anything may have changed. */
  drop(): void {
    this.generation++;
    this.clear();
  }

  private clear(): void {
    this.next = 1;
    this.last = 0;
    this.ahead = [];
    this.epoch = undefined;
  }

  /** Starts a reservation unless one is in flight. */
  private refill(): Promise<void> {
    this.reserving ??= this.reserveWithRetry().finally(() => {
      this.reserving = undefined;
    });
    return this.reserving;
  }

  private async reserveWithRetry(): Promise<void> {
    const generation = this.generation;
    const installs = this.installs;
    this.starved = false;
    const started = performance.now();
    let lastError: unknown;
    for (let attempt = 0; ; attempt++) {
      if (this.isClosed()) throw closedError();
      const remaining = this.timeoutMs === null ? null : this.timeoutMs - (performance.now() - started);
      if (remaining !== null && remaining <= 0) throw timeoutError(this.timeoutMs!, lastError);
      try {
        const ranges = await this.reserve(
          this.name,
          remaining === null ? null : Math.ceil(remaining),
          this.perReservation,
        );
        this.adapt(this.installs - installs, this.starved);
        // Dropped meanwhile, or of a definition known to be gone: the ranges become a gap.
        for (const r of ranges) if (generation === this.generation && r.epoch >= this.floor) this.accept(r);
        return;
      } catch (error) {
        if (!(error instanceof OrdoError) || !RETRYABLE.has(error.code)) throw error;
        lastError = error;
        const delay = backoffDelay(attempt);
        await sleep(remaining === null ? delay : Math.min(delay, remaining));
      }
    }
  }

  /**
   * The next reservation's size from this one's round trip: twice the ranges used meanwhile,
   * so a steady node has a round trip's worth ahead when the next one starts; twice as many as
   * before when callers waited for it (the ranges used cannot show a demand that found none).
   * The caller that starts a reservation on a cold node does not count as waiting.
   */
  private adapt(usedMeanwhile: number, starved: boolean): void {
    const wanted = Math.max(2 * usedMeanwhile, starved ? 2 * this.perReservation : 1);
    this.perReservation = Math.min(wanted, MAX_RANGES_PER_RESERVATION);
  }

  private accept(r: Reservation): void {
    // Redefined and the notification has not arrived (or was missed): nothing older is served.
    if (this.epoch !== undefined && r.epoch !== this.epoch) this.clear();
    this.epoch = r.epoch;
    this.timeoutMs = r.timeoutMs;
    // Behind any range already ahead (the one in use may have just run out with some ahead):
    // handOutNow() puts them in use in order.
    this.ahead.push(r);
  }

  private install(r: Reservation): void {
    this.installs++;
    this.first = r.first;
    this.next = r.first;
    this.last = r.last;
    this.increment = r.increment;
  }
}
