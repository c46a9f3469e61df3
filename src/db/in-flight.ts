import { toOrdoError } from '../errors.js';
import type { Queryable } from './queryable.js';

/**
 * Work accepted before close() must be answered before the pool ends: pg-pool never serves
 * a request still queued when it is ended, so such a call would wait forever.
 */
export class InFlight {
  private readonly pending = new Set<Promise<unknown>>();

  track<T>(work: Promise<T>): Promise<T> {
    this.pending.add(work);
    const forget = () => this.pending.delete(work);
    work.then(forget, forget);
    return work;
  }

  /** One statement, tracked; its error becomes an OrdoError with the statement attached. */
  query(db: Queryable, text: string, values: unknown[]): Promise<{ rows: any[] }> {
    return this.track(
      (async () => {
        try {
          return await db.query(text, values);
        } catch (e) {
          throw toOrdoError(e, text);
        }
      })(),
    );
  }

  get busy(): boolean {
    return this.pending.size > 0;
  }

  async idle(): Promise<void> {
    while (this.pending.size > 0) await Promise.allSettled([...this.pending]);
  }
}
