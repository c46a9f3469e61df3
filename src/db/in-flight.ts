import { setTimeout as sleep } from 'node:timers/promises';
import { neverSent, toOrdoError } from '../errors.js';
import { backoffDelay } from './backoff.js';
import type { Queryable } from './queryable.js';

/**
 * Work accepted before close() must be answered before the pool ends: pg-pool never serves
 * a request still queued when it is ended, so such a call would wait forever.
 */
export class InFlight {
  private readonly pending = new Set<Promise<unknown>>();

  /**
   * @param pool where statements that never reached the server are sent again: another
   *   connection may work where the first could not be opened. On a caller's transaction, or
   *   any other single connection, they cannot be, and fail at once.
   * @param retryMs how long they are tried again (0: never).
   */
  constructor(
    private readonly pool: Queryable,
    private readonly retryMs = 0,
  ) {}

  track<T>(work: Promise<T>): Promise<T> {
    this.pending.add(work);
    work.then(
      () => this.pending.delete(work),
      () => this.pending.delete(work),
    );
    return work;
  }

  /**
   * One statement, tracked; its error becomes an OrdoError with the statement attached. A
   * statement on the pool that never reached the server is sent again (see retry).
   */
  query(db: Queryable, text: string, values: unknown[], retryMs = this.retryMs): Promise<{ rows: any[] }> {
    return this.track(
      this.retry(() => db.query(text, values), db === this.pool ? retryMs : 0).catch((e: unknown) => {
        throw toOrdoError(e, text);
      }),
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
    return this.pending.size > 0;
  }

  async idle(): Promise<void> {
    while (this.pending.size > 0) await Promise.allSettled([...this.pending]);
  }
}
