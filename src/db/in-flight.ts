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

  get busy(): boolean {
    return this.pending.size > 0;
  }

  async idle(): Promise<void> {
    while (this.pending.size > 0) await Promise.allSettled([...this.pending]);
  }
}
