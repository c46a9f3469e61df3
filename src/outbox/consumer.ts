import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import type pg from 'pg';
import { guardClient } from '../db/clients.js';
import { OrdoError, toOrdoError } from '../errors.js';
import { type OutboxMessage, toMessage } from './messages.js';
import type { OutboxPlans } from './plans.js';

export interface HandlerContext {
  /**
   * The transaction in which the checkpoint is stored: what the handler writes through it
   * commits together with the cursor, exactly once. Do not COMMIT or ROLLBACK it yourself.
   */
  tx: pg.PoolClient;
  subscription: string;
  /** 1 on the first delivery of these messages, then 2, 3, … */
  attempt: number;
  /** Aborted when this consumer loses its lease or is stopped: stop work that would be wasted. */
  signal: AbortSignal;
}

export type Handler<T = unknown> = (
  messages: OutboxMessage<T>[],
  context: HandlerContext,
) => Promise<void> | void;

/** How a consumer's loop ended. */
export interface SubscriptionEnd {
  /** 'stopped' by stop() or close(); 'exhausted' when a message failed maxAttempts times with onExhausted 'stop'. */
  reason: 'stopped' | 'exhausted';
  error?: OrdoError;
}

export interface ConsumerSettings {
  name: string;
  topic: string;
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

interface Cursor {
  tx: string;
  pos: string;
}

/** Quick looks after a delivery (1, 2, 4 … 50 ms apart: about 160 ms in all). */
const QUICK_POLLS = 8;
const HELD_MAX_DELAY_MS = 50;

type Step =
  | { kind: 'delivered' | 'idle' | 'held' | 'lost' }
  | { kind: 'failed'; retryInMs: number }
  | { kind: 'exhausted'; error: OrdoError };

/** Checkpoint tuples compare as (xid8, bigint): both are decimal text without sign. */
function after(a: Cursor, b: Cursor): boolean {
  const tx = BigInt(a.tx) - BigInt(b.tx);
  return tx > 0n || (tx === 0n && BigInt(a.pos) > BigInt(b.pos));
}

/**
 * One consumer of a subscription. It holds the subscription's lease while it consumes,
 * renews it in the background, and gives it up when stopped. Each batch runs in one
 * transaction: read, handler, checkpoint, commit; nothing is skipped, because the read only
 * returns messages that no open transaction can precede.
 */
export class Consumer {
  readonly owner = `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`;
  readonly done: Promise<SubscriptionEnd>;
  private cursor: Cursor | undefined;
  private attempts = 0;
  /** After a batch failed, messages up to its last one are delivered one at a time, to find the culprit. */
  private singleUntil: Cursor | undefined;
  private leased = false;
  private stopping = false;
  private heldDelayMs = 1;
  /** Quick looks left after a delivery, for messages committed without a notification. */
  private quickPolls = 0;
  private woken = false;
  private wakeUp: (() => void) | undefined;
  private heartbeat: NodeJS.Timeout | undefined;
  private abort = new AbortController();

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
    this.wakeUp?.();
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
        const step = await this.step();
        failures = 0;
        if (step.kind === 'exhausted') {
          end = { reason: 'exhausted', error: step.error };
          this.settings.onError?.(step.error);
          break;
        }
        if (step.kind === 'delivered') {
          this.quickPolls = QUICK_POLLS;
          this.heldDelayMs = 1;
        } else if (step.kind === 'held' || (step.kind === 'idle' && this.quickPolls-- > 0)) {
          // Committed messages wait behind an older open transaction, whose end sends no
          // notification; or a batch was just delivered, and a transaction that appended
          // beside the one whose commit woke us may commit without notifying (one notifier
          // per topic at a time). Look again soon, then less often, never more than 50 ms apart.
          await this.sleep(this.heldDelayMs);
          this.heldDelayMs = Math.min(this.heldDelayMs * 2, HELD_MAX_DELAY_MS, this.settings.pollMs);
        } else if (step.kind === 'idle') {
          this.heldDelayMs = 1;
          await this.sleep(this.pollInterval(this.settings.pollMs));
        } else if (step.kind === 'failed') {
          await this.sleep(step.retryInMs);
        }
      } catch (e) {
        const error = toOrdoError(e);
        this.settings.onError?.(error);
        if (error.code === 'subscription_not_found') {
          end = { reason: 'stopped', error };
          break;
        }
        // The database is unreachable or refused us: start over from the stored cursor.
        this.loseLease();
        await this.sleep(this.retryDelay(++failures));
      }
    }
    this.abort.abort();
    clearInterval(this.heartbeat);
    if (this.leased) {
      this.leased = false;
      await this.pool.query(this.plans.release, [this.settings.name, this.owner]).catch(() => undefined);
    }
    return end;
  }

  private async takeLease(): Promise<boolean> {
    const { rows } = await this.pool.query(this.plans.lease, [
      this.settings.name,
      this.owner,
      this.settings.leaseMs,
    ]);
    const row = rows[0];
    if (!row) return false;
    this.cursor = { tx: row.last_transaction_id, pos: String(row.last_position) };
    this.attempts = row.attempts;
    this.singleUntil = undefined;
    this.leased = true;
    this.abort = new AbortController();
    // stop() may have come while the lease was being taken: it must still end this consumer.
    if (this.stopping) this.abort.abort();
    clearInterval(this.heartbeat);
    this.heartbeat = setInterval(() => void this.renew(), this.settings.leaseMs / 3);
    this.heartbeat.unref();
    return true;
  }

  private async renew(): Promise<void> {
    if (!this.leased) return;
    try {
      const { rows } = await this.pool.query(this.plans.lease, [
        this.settings.name,
        this.owner,
        this.settings.leaseMs,
      ]);
      if (rows.length === 0) this.loseLease();
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
   * One batch: read, handle and checkpoint in one transaction. Failures are recorded on the
   * same connection after the rollback: a consumer never waits for a second connection while
   * holding one, so consumers failing at once cannot starve a pool between them.
   */
  private async step(): Promise<Step> {
    const cursor = this.cursor!;
    if (this.singleUntil && !after(this.singleUntil, cursor)) this.singleUntil = undefined;
    const limit = this.singleUntil ? 1 : this.settings.batchSize;
    const client = await this.pool.connect();
    let broken = false;
    const guard = guardClient(client);
    try {
      await client.query('BEGIN');
      // Anything committed from here on is seen by the read below or wakes the next wait.
      this.woken = false;
      const { rows } = await client.query(this.plans.read, [
        this.settings.topic,
        cursor.tx,
        cursor.pos,
        limit,
      ]);
      if (rows.length === 0) {
        await client.query('COMMIT');
        const { rows: idle } = await client.query(this.plans.pending, [
          this.settings.topic,
          cursor.tx,
          cursor.pos,
          this.settings.name,
          this.owner,
        ]);
        if (!idle[0].leased) {
          this.lostSubscription();
          return { kind: 'lost' };
        }
        return { kind: idle[0].pending ? 'held' : 'idle' };
      }
      const messages = rows.map(toMessage);
      const last = rows.at(-1)!;
      const to: Cursor = { tx: last.transaction_id, pos: String(last.position) };
      try {
        if (this.abort.signal.aborted) throw new Error('the consumer stopped or lost its lease');
        await this.settings.handler(messages, {
          tx: client,
          subscription: this.settings.name,
          attempt: this.attempts + 1,
          signal: this.abort.signal,
        });
        const moved = await client.query(this.plans.checkpoint, [
          this.settings.name,
          this.owner,
          cursor.tx,
          cursor.pos,
          to.tx,
          to.pos,
          rows.length,
          this.settings.leaseMs,
        ]);
        if (!moved.rows[0].moved) {
          await client.query('ROLLBACK');
          this.lostSubscription();
          return { kind: 'lost' };
        }
        await client.query('COMMIT');
      } catch (e) {
        await client.query('ROLLBACK');
        if (!this.leased || this.stopping) return { kind: 'lost' };
        return await this.failed(client, e, messages, cursor, to);
      }
      this.cursor = to;
      this.attempts = 0;
      return { kind: 'delivered' };
    } catch (e) {
      broken = true;
      throw e;
    } finally {
      guard.release(broken);
    }
  }

  /** Counts the failure; then parks the message, gives up, or says how long to wait. */
  private async failed(
    client: pg.PoolClient,
    e: unknown,
    messages: OutboxMessage[],
    cursor: Cursor,
    last: Cursor,
  ): Promise<Step> {
    const reason = e instanceof Error ? e.message || e.name : String(e);
    this.settings.onError?.(
      new OrdoError('handler_failed', `subscription '${this.settings.name}': the handler failed: ${reason}`, {
        cause: e,
      }),
    );
    // A failed batch of several says nothing about which message failed: deliver them one
    // by one, and count attempts against single messages only.
    const single = messages.length === 1;
    const { rows } = await client.query(this.plans.recordFailure, [
      this.settings.name,
      this.owner,
      cursor.tx,
      cursor.pos,
      reason,
      single,
    ]);
    const attempts = rows[0]?.attempts;
    if (attempts === null || attempts === undefined) {
      this.lostSubscription();
      return { kind: 'lost' };
    }
    this.attempts = attempts;
    if (!single) {
      this.singleUntil = last;
      return { kind: 'failed', retryInMs: 0 };
    }
    if (attempts < this.settings.maxAttempts) return { kind: 'failed', retryInMs: this.retryDelay(attempts) };
    const message = messages[0]!;
    if (this.settings.onExhausted === 'stop') {
      const error = new OrdoError(
        'handler_failed',
        `subscription '${this.settings.name}' stopped: message ${message.position} failed ${attempts} times: ${reason}`,
        { cause: e },
      );
      return { kind: 'exhausted', error };
    }
    const parked = await client.query(this.plans.park, [
      this.settings.name,
      this.owner,
      cursor.tx,
      cursor.pos,
      message.transactionId,
      message.position,
      reason,
    ]);
    if (!parked.rows[0].parked) {
      this.lostSubscription();
      return { kind: 'lost' };
    }
    this.cursor = { tx: message.transactionId, pos: String(message.position) };
    this.attempts = 0;
    return { kind: 'delivered' };
  }

  /** Exponential back-off with jitter, from about retryDelay up to maxRetryDelay. */
  private retryDelay(attempt: number): number {
    const { retryDelayMs, maxRetryDelayMs } = this.settings;
    const ceiling = Math.min(maxRetryDelayMs, retryDelayMs * 2 ** Math.max(0, attempt - 1));
    return retryDelayMs / 2 + Math.random() * Math.max(0, ceiling - retryDelayMs / 2);
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
