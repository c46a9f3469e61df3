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

/** What a node's supply holds right now: the range in use (`next` the first value not handed out) and the one after. */
export interface HeldSupply {
  current: { first: number; next: number; last: number } | undefined;
  spare: { first: number; last: number } | undefined;
}

/** Reserves a range; `waitMs` bounds how long the statement may wait for a lock. */
export type Reserve = (name: string, waitMs: number | null) => Promise<Reservation>;

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
 * One node's supply of a batched sequence. Values come from a range in memory with no I/O;
 * the next range is reserved in the background as soon as the current one is in use; at most
 * one reservation is in flight. Values are unique across nodes (ranges come from one
 * PostgreSQL sequence) and increase within this node. Dropping the supply (the sequence was
 * redefined or removed) discards its ranges: a gap, never a reuse.
 */
export class Allocator {
  /** The current range: `first` … `last`, `next` the first value not handed out. */
  private first = 1;
  private next = 1;
  private last = 0;
  private increment = 1;
  private epoch: number | undefined;
  private spare: Reservation | undefined;
  private reserving: Promise<void> | undefined;
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
    const { epoch, first, next, last, spare } = this;
    return {
      current: epoch === undefined || last < first ? undefined : { first, next, last },
      spare: spare && { first: spare.first, last: spare.last },
    };
  }

  /** A value from memory, or undefined when the current range is used up. */
  handOutNow(): number | undefined {
    if (this.next > this.last) {
      if (!this.spare) return undefined;
      this.install(this.spare);
      this.spare = undefined;
    }
    const value = this.next;
    this.next += this.increment;
    // Keep the next range ready: with one reservation in flight, a node can use at most two
    // ranges per round trip, and it should not wait for either.
    if (!this.spare && !this.reserving) {
      this.refill().catch(() => undefined); // a failed prefetch is retried by the caller who needs it
    }
    return value;
  }

  /** A value, waiting for a reservation when none is in memory. */
  async handOut(): Promise<number> {
    for (;;) {
      const value = this.handOutNow();
      if (value !== undefined) return value;
      await this.refill();
    }
  }

  /** Resolves when no reservation is in flight (whether it succeeded or not). */
  async settle(): Promise<void> {
    while (this.reserving) await this.reserving.catch(() => undefined);
  }

  /**
   * Drops every range held, returning the values never handed out when they end the last
   * range reserved: the rest of the current range (if the spare follows it) and the spare.
   * Synchronous, so nothing can be handed out from what is returned.
   */
  release(): UnusedTail | undefined {
    const { epoch, spare, first, next, last, increment } = this;
    this.drop();
    if (epoch === undefined) return undefined;
    const unused = next <= last;
    if (spare) {
      const adjoining = unused && last + increment === spare.first;
      return { from: adjoining ? next : spare.first, lastFirst: spare.first, epoch };
    }
    return unused ? { from: next, lastFirst: first, epoch } : undefined;
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
    this.spare = undefined;
    this.epoch = undefined;
  }

  private refill(): Promise<void> {
    this.reserving ??= this.reserveWithRetry().finally(() => {
      this.reserving = undefined;
    });
    return this.reserving;
  }

  private async reserveWithRetry(): Promise<void> {
    const generation = this.generation;
    const started = performance.now();
    let lastError: unknown;
    for (let attempt = 0; ; attempt++) {
      if (this.isClosed()) throw closedError();
      const remaining = this.timeoutMs === null ? null : this.timeoutMs - (performance.now() - started);
      if (remaining !== null && remaining <= 0) throw timeoutError(this.timeoutMs!, lastError);
      try {
        const r = await this.reserve(this.name, remaining === null ? null : Math.ceil(remaining));
        // Dropped meanwhile, or of a definition known to be gone: the range becomes a gap.
        if (generation === this.generation && r.epoch >= this.floor) this.accept(r);
        return;
      } catch (error) {
        if (!(error instanceof OrdoError) || !RETRYABLE.has(error.code)) throw error;
        lastError = error;
        const delay = backoffDelay(attempt);
        await sleep(remaining === null ? delay : Math.min(delay, remaining));
      }
    }
  }

  private accept(r: Reservation): void {
    // Redefined and the notification has not arrived (or was missed): nothing older is served.
    if (this.epoch !== undefined && r.epoch !== this.epoch) this.clear();
    this.epoch = r.epoch;
    this.timeoutMs = r.timeoutMs;
    if (this.next > this.last) this.install(r);
    else this.spare = r;
  }

  private install(r: Reservation): void {
    this.first = r.first;
    this.next = r.first;
    this.last = r.last;
    this.increment = r.increment;
  }
}
