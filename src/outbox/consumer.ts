import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import type pg from 'pg';
import { backoffDelay } from '../db/backoff.js';
import { guardClient } from '../db/clients.js';
import { OrdoError, toOrdoError } from '../errors.js';
import { type OutboxMessage, readBatch } from './messages.js';
import type { OutboxPlans } from './plans.js';

export interface HandlerContext {
  /**
   * The transaction in which the checkpoint is stored: what the handler writes through it
   * commits together with the acknowledgement of the batch, exactly once. It begins with the
   * first statement sent through it. Do not COMMIT or ROLLBACK it yourself.
   */
  tx: pg.PoolClient;
  subscription: string;
  /** The partition of the subscription these messages belong to (0 when it has one). */
  partition: number;
  /** 1 on the first delivery of these messages, then 2, 3, … */
  attempt: number;
  /** Aborted when this consumer loses its lease or is stopped: stop work that would be wasted. */
  signal: AbortSignal;
}

export type Handler<T = unknown> = (
  messages: OutboxMessage<T>[],
  context: HandlerContext,
) => Promise<void> | void;

/**
 * Thrown by a handler that dealt with the first `handled` messages of its batch and then stopped
 * (a relay: the broker confirmed a prefix, then failed): the checkpoint moves past those alone, so
 * only the rest is delivered again. `transient`: the failure says nothing about the message (a
 * broker that is down): the rest comes again after a back-off, without counting an attempt, so
 * an outage never parks a message; otherwise the first message not handled has failed.
 */
export class BatchInterrupted extends Error {
  constructor(
    readonly handled: number,
    readonly transient: boolean,
    cause: unknown,
    /** A transient failure that said how long to wait (Retry-After): at least that long. */
    readonly retryAfterMs = 0,
  ) {
    super(cause instanceof Error ? cause.message : String(cause), { cause });
    this.name = 'BatchInterrupted';
  }
}

/** How a consumer's loop ended. */
export interface SubscriptionEnd {
  /** 'stopped' by stop() or close(); 'exhausted' when a message failed maxAttempts times with onExhausted 'stop'. */
  reason: 'stopped' | 'exhausted';
  error?: OrdoError;
}

export interface ConsumerSettings {
  name: string;
  topic: string;
  /** The partition of the subscription this consumer reads (0 when it has one). */
  partition: number;
  handler: Handler<any>;
  batchSize: number;
  maxAttempts: number;
  onExhausted: 'park' | 'stop';
  leaseMs: number;
  pollMs: number;
  retryDelayMs: number;
  maxRetryDelayMs: number;
  onError: ((error: OrdoError) => void) | undefined;
}

/**
 * The wait before delivering a failed message again (its attempt-th failure, from 1): the one
 * back-off of ordo, its ceiling `first` doubling up to `max`.
 */
export function retryDelay(attempt: number, first: number, max: number): number {
  return backoffDelay(Math.max(0, attempt - 1), Math.random, { base: first, cap: max });
}

/**
 * The handler's transaction begins with its first statement: BEGIN goes out just before it, in
 * the same queue. A handler that sends none leaves nothing to begin or commit, and the
 * acknowledgement commits by itself: two round trips of a batch's four.
 */
function beginOnFirstQuery(client: pg.PoolClient): {
  readonly begun: Promise<unknown> | undefined;
  stopWatching(): void;
} {
  const own = Object.getOwnPropertyDescriptor(client, 'query');
  const query = client.query as (...args: unknown[]) => Promise<unknown>;
  let begun: Promise<unknown> | undefined;
  client.query = function (...args: unknown[]) {
    if (begun === undefined) {
      begun = query.call(client, 'BEGIN');
      begun.catch(() => undefined);
    }
    return query.apply(client, args);
  } as typeof client.query;
  return {
    get begun() {
      return begun;
    },
    stopWatching() {
      if (own) Object.defineProperty(client, 'query', own);
      else delete (client as { query?: unknown }).query;
    },
  };
}

/** Quick looks after a delivery (1, 2, 4 … 50 ms apart: about 160 ms in all). */
const QUICK_POLLS = 8;
const HELD_MAX_DELAY_MS = 50;

type Step =
  | { kind: 'delivered' | 'idle' | 'held' | 'lost' }
  | { kind: 'failed'; retryInMs: number }
  | { kind: 'exhausted'; error: OrdoError };

/** What nack() made of a failed batch, or lease_partition() of the batch of a lapsed lease. */
interface Failure {
  outcome: 'split' | 'retry' | 'parked' | 'exhausted' | null;
  attempts: number | null;
}

/**
 * One consumer of a partition of a subscription. It holds the partition's lease while it
 * consumes, renews it in the background, and gives it up when stopped. Each batch is received
 * (the database records it against the partition's version), handled in one transaction that
 * also acknowledges it, or handed back with nack() when the handler fails. What a batch holds
 * and in which order is decided by the database alone (receive()).
 */
export class Consumer {
  readonly owner = `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`;
  readonly done: Promise<SubscriptionEnd>;
  private leased = false;
  private stopping = false;
  private heldDelayMs = 1;
  /** Quick looks left after a delivery, for messages committed without a notification. */
  private quickPolls = 0;
  private woken = false;
  private wakeUp: (() => void) | undefined;
  private heartbeat: NodeJS.Timeout | undefined;
  /** The renewal in flight: awaited before the lease is released, which it would otherwise take back. */
  private renewing: Promise<void> = Promise.resolve();
  private abort = new AbortController();
  /** The batch of a lapsed lease, failed when this consumer took the lease: acted on before the next batch. */
  private lapsed: Failure | undefined;
  /** Transient failures in a row (BatchInterrupted), for the back-off of the next look. */
  private outages = 0;
  /** Waiting out the delay after a failure: notifications do not end it, stop() does. */
  private backingOff = false;
  /**
   * The next batch holds one message: the first of a batch a handler refused in part, so that
   * its failure is its own and counted (a batch of several that fails is split first).
   */
  private single = false;

  constructor(
    private readonly pool: pg.Pool,
    private readonly plans: OutboxPlans,
    private readonly settings: ConsumerSettings,
    /** The wait between reads when nothing wakes the consumer: shortened while notifications are lost. */
    private readonly pollInterval: (ms: number) => number,
  ) {
    this.done = this.loop();
  }

  get topic(): string {
    return this.settings.topic;
  }

  /** A notification for this topic (or a lost listener): read again now. */
  notify(): void {
    this.woken = true;
    // A back-off after a failure is waited out: new messages do not make a failing broker or
    // handler ready sooner (the wake-up is kept for the look after it).
    if (!this.backingOff) this.wakeUp?.();
  }

  async stop(): Promise<SubscriptionEnd> {
    this.stopping = true;
    // A handler that watches the signal may end early; its batch is then rolled back, not counted as a failure.
    this.abort.abort();
    this.wakeUp?.();
    return this.done;
  }

  private async loop(): Promise<SubscriptionEnd> {
    let end: SubscriptionEnd = { reason: 'stopped' };
    let failures = 0;
    while (!this.stopping) {
      try {
        if (!this.leased && !(await this.takeLease())) {
          await this.sleep(Math.min(this.pollInterval(this.settings.pollMs), this.settings.leaseMs / 3));
          continue;
        }
        if (this.stopping) break;
        const step = this.afterLapse() ?? (await this.step());
        failures = 0;
        if (step.kind === 'exhausted') {
          end = { reason: 'exhausted', error: step.error };
          this.settings.onError?.(step.error);
          break;
        }
        if (step.kind === 'delivered') {
          this.single = false;
          this.quickPolls = QUICK_POLLS;
          this.heldDelayMs = 1;
        } else if (step.kind === 'held' || (step.kind === 'idle' && this.quickPolls-- > 0)) {
          // A transaction that appended to the topic is still open, and its commit may send no
          // notification (one notifier per topic at a time); or a batch was just delivered,
          // and another appender may commit beside the one whose commit woke us. Look again
          // soon, then less often, never more than 50 ms apart.
          await this.sleep(this.heldDelayMs);
          this.heldDelayMs = Math.min(this.heldDelayMs * 2, HELD_MAX_DELAY_MS, this.settings.pollMs);
        } else if (step.kind === 'idle') {
          this.heldDelayMs = 1;
          await this.sleep(this.pollInterval(this.settings.pollMs));
        } else if (step.kind === 'failed' && step.retryInMs > 0) {
          this.backingOff = true;
          try {
            await this.sleep(step.retryInMs);
          } finally {
            this.backingOff = false;
          }
        }
      } catch (e) {
        const error = toOrdoError(e);
        this.settings.onError?.(error);
        if (error.code === 'subscription_not_found') {
          end = { reason: 'stopped', error };
          break;
        }
        // The database is unreachable or refused us: start over from the stored state.
        this.loseLease();
        await this.sleep(this.retryDelay(++failures));
      }
    }
    this.abort.abort();
    clearInterval(this.heartbeat);
    await this.renewing;
    if (this.leased) {
      this.leased = false;
      await this.pool
        .query(this.plans.release, [this.settings.name, this.settings.partition, this.owner])
        .catch(() => undefined);
    }
    return end;
  }

  /** Takes or renews the lease; false when another consumer holds it. */
  private async lease(): Promise<boolean> {
    const { name, partition, leaseMs, maxAttempts, onExhausted } = this.settings;
    const { rows } = await this.pool.query(this.plans.lease, [
      name,
      partition,
      this.owner,
      leaseMs,
      maxAttempts,
      onExhausted === 'park',
    ]);
    const row = rows[0] as Failure | undefined;
    if (row?.outcome) this.lapsed = row;
    return row !== undefined;
  }

  private async takeLease(): Promise<boolean> {
    if (!(await this.lease())) return false;
    this.leased = true;
    this.abort = new AbortController();
    // stop() may have come while the lease was being taken: it must still end this consumer.
    if (this.stopping) this.abort.abort();
    clearInterval(this.heartbeat);
    this.heartbeat = setInterval(() => {
      this.renewing = this.renew();
    }, this.settings.leaseMs / 3);
    this.heartbeat.unref();
    return true;
  }

  private async renew(): Promise<void> {
    if (!this.leased) return;
    try {
      if (!(await this.lease())) this.loseLease();
    } catch (e) {
      // Removed: the loop finds out at its next lease. Anything else: the lease lasts three renewals.
      if (toOrdoError(e).code === 'subscription_not_found') this.lostSubscription();
    }
  }

  private loseLease(): void {
    this.leased = false;
    clearInterval(this.heartbeat);
    this.abort.abort();
  }

  /** The subscription row is gone or no longer ours: re-lease now, which ends the loop if it was removed. */
  private lostSubscription(): void {
    this.loseLease();
    this.notify();
  }

  /**
   * One batch: received, then handled and acknowledged in one transaction. A failure is handed
   * back on the same connection after the rollback: a consumer never waits for a second
   * connection while holding one, so consumers failing at once cannot starve a pool between them.
   */
  private async step(): Promise<Step> {
    const { name, partition, topic } = this.settings;
    const client = await this.pool.connect();
    let broken = false;
    const guard = guardClient(client);
    try {
      // Anything committed from here on is seen by the receive below or wakes the next wait.
      this.woken = false;
      const { messages, version, attempt } = await readBatch(
        client,
        this.plans.receive,
        [name, partition, this.owner, this.single ? 1 : this.settings.batchSize, this.settings.leaseMs],
        topic,
      );
      if (messages.length === 0) {
        const { rows: idle } = await client.query(this.plans.pending, [name, partition, this.owner, topic]);
        if (!idle[0]?.leased) {
          this.lostSubscription();
          return { kind: 'lost' };
        }
        return { kind: idle[0].pending ? 'held' : 'idle' };
      }
      const tx = beginOnFirstQuery(client);
      try {
        try {
          if (this.abort.signal.aborted) throw new Error('the consumer stopped or lost its lease');
          await this.settings.handler(messages, {
            tx: client,
            subscription: name,
            partition,
            attempt,
            signal: this.abort.signal,
          });
        } finally {
          // Whatever happened: the client goes back to the pool as it came.
          tx.stopWatching();
        }
        await tx.begun;
        const acked = await client.query(this.plans.ackHandled, [
          name,
          partition,
          this.owner,
          version,
          this.settings.leaseMs,
        ]);
        if (acked.rows[0].handled === null) {
          if (tx.begun) await client.query('ROLLBACK');
          this.lostSubscription();
          return { kind: 'lost' };
        }
        if (tx.begun) await client.query('COMMIT');
      } catch (e) {
        if (tx.begun) await client.query('ROLLBACK');
        // What a handler handled before it stopped is acknowledged, stopping or not.
        if (e instanceof BatchInterrupted && this.leased)
          return await this.interrupted(client, e, messages, version);
        if (!this.leased || this.stopping) return { kind: 'lost' };
        return await this.failed(client, e, messages, version);
      }
      this.outages = 0;
      return { kind: 'delivered' };
    } catch (e) {
      broken = true;
      throw e;
    } finally {
      guard.release(broken);
    }
  }

  /**
   * A batch the handler dealt with in part: past the prefix it handled, then the rest again, at
   * once after a refusal (its first message then fails on its own, and is counted), after the
   * back-off after an outage.
   */
  private async interrupted(
    client: pg.PoolClient,
    e: BatchInterrupted,
    messages: OutboxMessage[],
    version: string,
  ): Promise<Step> {
    // A handler that says it handled all of a batch it failed still failed its last message.
    const handled = Math.min(Math.max(0, Math.floor(e.handled)), messages.length - 1);
    if (handled > 0) {
      const { name, partition, leaseMs } = this.settings;
      const { rows } = await client.query(this.plans.ackThrough, [
        name,
        partition,
        this.owner,
        version,
        messages[handled - 1]!.position,
        handled,
        leaseMs,
      ]);
      if (rows[0].handled === null) {
        this.lostSubscription();
        return { kind: 'lost' };
      }
    }
    if (this.stopping) return { kind: 'lost' };
    if (e.transient) {
      this.settings.onError?.(
        new OrdoError('handler_failed', `subscription '${this.settings.name}': ${e.message}`, {
          cause: e.cause,
        }),
      );
      return { kind: 'failed', retryInMs: Math.max(this.retryDelay(++this.outages), e.retryAfterMs) };
    }
    if (handled === 0 && messages.length === 1) return this.failed(client, e.cause, messages, version);
    // The message refused comes next on its own, so that its failure is counted.
    this.single = true;
    return { kind: 'failed', retryInMs: 0 };
  }

  /** Hands the batch back: split it, retry it later, park its message, or give up. */
  private async failed(
    client: pg.PoolClient,
    e: unknown,
    messages: OutboxMessage[],
    version: string,
  ): Promise<Step> {
    const { name, partition, maxAttempts, onExhausted } = this.settings;
    const reason = e instanceof Error ? e.message || e.name : String(e);
    this.settings.onError?.(
      new OrdoError('handler_failed', `subscription '${name}': the handler failed: ${reason}`, { cause: e }),
    );
    const { rows } = await client.query(this.plans.nack, [
      name,
      partition,
      this.owner,
      version,
      reason,
      maxAttempts,
      onExhausted === 'park',
      // This consumer waits by itself, holding the lease: nothing to schedule.
      [0],
      false,
    ]);
    const failure = rows[0] as Failure;
    return this.settle(
      failure,
      `message ${messages[0]!.position} failed ${failure.attempts} times: ${reason}`,
      e,
    );
  }

  /**
   * The batch of a lapsed lease (its consumer died or hung) was failed as this consumer took
   * the lease: the same as a failure of its own, so a message that kills its consumer is
   * retried, parked or stops the subscription after maxAttempts.
   */
  private afterLapse(): Step | undefined {
    const failure = this.lapsed;
    this.lapsed = undefined;
    if (failure === undefined) return undefined;
    return this.settle(
      failure,
      `a message of partition ${this.settings.partition} failed ${failure.attempts} times: its lease lapsed before it was acknowledged (its consumer died or hung)`,
    );
  }

  /** What a failed batch means for the loop: split, retry it later, parked and passed, or give up. */
  private settle(failure: Failure, why: string, cause?: unknown): Step {
    switch (failure.outcome) {
      case null:
        this.lostSubscription();
        return { kind: 'lost' };
      // A failed batch of several says nothing about which message failed: they come one by one next.
      case 'split':
        return { kind: 'failed', retryInMs: 0 };
      case 'retry':
        return { kind: 'failed', retryInMs: this.retryDelay(failure.attempts!) };
      case 'parked':
        return { kind: 'delivered' };
      case 'exhausted': {
        const message = `subscription '${this.settings.name}' stopped: ${why}`;
        return { kind: 'exhausted', error: new OrdoError('handler_failed', message, { cause }) };
      }
    }
  }

  private retryDelay(attempt: number): number {
    return retryDelay(attempt, this.settings.retryDelayMs, this.settings.maxRetryDelayMs);
  }

  /** Waits `ms`, or less when notified or stopped. */
  private sleep(ms: number): Promise<void> {
    if (this.stopping) return Promise.resolve();
    if (this.woken) {
      this.woken = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.wakeUp = undefined;
        this.woken = false;
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.wakeUp = done;
    });
  }
}
