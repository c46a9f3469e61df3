/**
 * Standalone calls share statements. A call goes out at once when fewer than `maxInFlight`
 * statements run; otherwise it queues, and the next statement serves every queued call (up
 * to `maxBatch`) at once, in arrival order. One statement, one commit and one round trip then
 * serve many callers: on a hot key, one lock and one WAL flush serve a whole batch.
 *
 * `many` answers request i with result i, or with undefined to have that request served on
 * its own by `one` (which then reports its exact error). When `many` fails (one bad request,
 * a lock held too long by a caller's transaction), every request of the batch is served by
 * `one`, so each caller gets its own answer. Requests served by `one` do not count against
 * `maxInFlight`.
 */
export class Batcher<Req, Res> {
  private queue: Waiter<Req, Res>[] = [];
  private inFlight = 0;
  private scheduled = false;

  constructor(
    private readonly one: (request: Req) => Promise<Res>,
    private readonly many: (requests: Req[]) => Promise<(Res | undefined)[]>,
    private readonly maxInFlight: number,
    private readonly maxBatch: number,
  ) {}

  submit(request: Req): Promise<Res> {
    return new Promise<Res>((resolve, reject) => {
      this.queue.push({ request, resolve, reject });
      this.schedule();
    });
  }

  /** Calls made in the same tick go out together: dispatch after the current microtasks. */
  private schedule(): void {
    if (this.scheduled || this.inFlight >= this.maxInFlight || this.queue.length === 0) return;
    this.scheduled = true;
    queueMicrotask(() => {
      this.scheduled = false;
      this.dispatch();
    });
  }

  private dispatch(): void {
    if (this.queue.length === 0 || this.inFlight >= this.maxInFlight) return;
    // Spread what waits over the free statements: several batches run in parallel.
    const free = this.maxInFlight - this.inFlight;
    const batch = this.queue.splice(0, Math.min(this.maxBatch, Math.ceil(this.queue.length / free)));
    this.inFlight++;
    void this.serve(batch).finally(() => {
      this.inFlight--;
      this.schedule();
    });
    this.schedule();
  }

  private async serve(batch: Waiter<Req, Res>[]): Promise<void> {
    let results: (Res | undefined)[];
    try {
      results = await this.many(batch.map((w) => w.request));
    } catch {
      // Served one by one outside the statements counted in flight: a request waiting for a
      // lock a caller's transaction holds does not hold up everyone else's statements.
      for (const w of batch) void this.serveOne(w);
      return;
    }
    for (const [i, w] of batch.entries()) {
      const result = results[i];
      if (result === undefined) void this.serveOne(w);
      else w.resolve(result);
    }
  }

  private async serveOne(w: Waiter<Req, Res>): Promise<void> {
    try {
      w.resolve(await this.one(w.request));
    } catch (error) {
      w.reject(error);
    }
  }
}

interface Waiter<Req, Res> {
  request: Req;
  resolve(result: Res): void;
  reject(error: unknown): void;
}
