import { setTimeout as sleep } from 'node:timers/promises';
import { neverSent, toOrdoError } from '../errors.js';
import { backoffDelay } from './backoff.js';
import { queryPrepared } from './drivers.js';
import type { Queryable } from './queryable.js';

/**
 * Work accepted before close() must be answered before the pool ends: pg-pool never serves
 * a request still queued when it is ended, so such a call would wait forever.
 */
export class InFlight {
  /**
   * Counted, not kept: a promise held in a long-lived Set outlives young-generation collections
   * with its reactions and, once settled, its result rows, which then take a full collection
   * to free, on the hot path of every call in a caller's transaction.
   */
  private pending = 0;
  private drained: (() => void)[] = [];

  /**
   * @param pool where statements that never reached the server are sent again: another
   *   connection may work where the first could not be opened. On a caller's transaction, or
   *   any other single connection, they cannot be, and fail at once.
   * @param retryMs how long they are tried again (0: never).
   * @param prepare statements on node-postgres go as named prepared statements (createOrdo's
   *   `prepare`).
   */
  constructor(
    private readonly pool: Queryable,
    private readonly retryMs = 0,
    private readonly prepare = false,
  ) {}

  track<T>(work: Promise<T>): Promise<T> {
    this.pending++;
    work.then(this.settled, this.settled);
    return work;
  }

  private readonly settled = (): void => {
    if (--this.pending > 0) return;
    const waiting = this.drained;
    this.drained = [];
    for (const wake of waiting) wake();
  };

  /**
   * One statement, tracked; its error becomes an OrdoError with the statement attached. A
   * statement on the pool that never reached the server is sent again (see retry).
   */
  query(db: Queryable, text: string, values: unknown[], retryMs = this.retryMs): Promise<{ rows: any[] }> {
    // The hot path of every call in a caller's transaction: one promise, tracked and translated
    // in one step (a number or an append there costs Node less than the statement's own I/O).
    const sent =
      db === this.pool && retryMs > 0
        ? this.retry(() => this.send(db, text, values), retryMs)
        : this.send(db, text, values);
    this.pending++;
    return sent.then(
      (result) => {
        this.settled();
        return result;
      },
      (e: unknown) => {
        this.settled();
        throw toOrdoError(e, text);
      },
    );
  }

  /**
   * Runs `attempt` again with back-off, for up to `retryMs`, while it fails in a way that shows
   * it did nothing (`harmless`; by default: it never reached the server, as when no connection
   * could be opened or taken in a restart or on a full server), so that trying again cannot do
   * anything twice. Other failures are thrown as they are.
   */
  async retry<T>(attempt: () => Promise<T>, retryMs = this.retryMs, harmless = neverSent): Promise<T> {
    const deadline = performance.now() + retryMs;
    for (let n = 0; ; n++) {
      try {
        return await attempt();
      } catch (e) {
        const left = deadline - performance.now();
        if (!harmless(e) || left <= 0) throw e;
        await sleep(Math.min(backoffDelay(n + 3), left));
      }
    }
  }

  get busy(): boolean {
    return this.pending > 0;
  }

  /**
   * Resolves once nothing is in flight, work accepted meanwhile included. A call of several
   * statements sends its next one from the answer's continuation: the count is looked at again
   * only once those have run (after a turn of the event loop), or close() could end the pool
   * between two statements of one call.
   */
  async idle(): Promise<void> {
    while (this.pending > 0) {
      await new Promise<void>((wake) => this.drained.push(wake));
      await new Promise<void>((turn) => setImmediate(turn));
    }
  }

  /** db.query (prepared when asked), whose synchronous throw (a driver refusing its arguments) becomes a rejection. */
  private send(db: Queryable, text: string, values: unknown[]): Promise<{ rows: any[] }> {
    try {
      return (this.prepare && queryPrepared(db, text, values)) || db.query(text, values);
    } catch (e) {
      return Promise.reject(e);
    }
  }
}
