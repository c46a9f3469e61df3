import { wroteNothing } from '../errors.js';

/**
 * Standalone calls share statements: the one batching mechanism of ordo (gapless numbers,
 * throttle decisions and permit ends). Its rules:
 *
 * - A call goes out at once while fewer than `slots` statements run; otherwise it queues, and
 *   the next statement serves the queued calls at once, in arrival order, up to `maxBatch`
 *   units (`units(call)`, 1 by default; always at least one call). One statement, one commit
 *   and one round trip then serve many callers: on a hot row, one lock and one WAL flush.
 * - With `spread` and several slots free, each statement takes a share of the queue, so that
 *   statements run side by side. Callers answered at once come back at once, and one statement
 *   taking them all leaves the other slots, and the database's other cores, idle. A key's calls
 *   (`keyOf`) are never split by the share, and a statement that is full leaves every later
 *   call: no call overtakes an earlier one of its key. It pays where the statement's work is
 *   the database's (throttle decisions and ends on many keys), not where it is the client's
 *   (numbers from many counters: two statements cost the client twice what one does), so only
 *   the throttles spread. Calls of different keys in two statements have no order between
 *   them: each commits when it commits.
 * - `many` answers call i with result i, or with undefined to have that call served alone. A
 *   statement of one call goes out through `one`: the shared statement's short lock wait is
 *   there so that a batch's other calls go on without a busy key, and a lone caller would get
 *   that lock timeout as its answer.
 * - When `many` fails for several calls (one bad call, a row held by a caller's transaction past
 *   the statement's short lock wait), every call is served alone by `one`, so each caller gets
 *   its own answer: calls of one key (`keyOf`) one after another in arrival
 *   order (what is left of an exhausted sequence goes to the first callers), calls of
 *   different keys at once (a key held by a transaction holds up only its own calls). Calls
 *   served alone do not count against `slots`.
 * - The short lock wait, 50 ms, is set in SQL by every shared statement (take_many,
 *   throttle_batch): long enough for a standalone statement's own commit, short enough that a
 *   caller's transaction holding one row does not hold up the whole batch.
 * - Only when the failure proves the statement wrote nothing: after a lost connection or a
 *   client-side timeout it may have committed, and serving its calls again would take numbers
 *   or permits twice; every caller then gets that error, as a lone caller would.
 */
export class Batcher<Call, Result> {
  private queue: Waiting<Call, Result>[] = [];
  private inFlight = 0;
  private scheduled = false;
  private readonly running = new Set<Promise<void>>();

  constructor(private readonly options: BatcherOptions<Call, Result>) {}

  submit(call: Call): Promise<Result> {
    return new Promise<Result>((resolve, reject) => {
      this.queue.push({ call, key: this.options.keyOf(call), resolve, reject });
      this.schedule();
    });
  }

  /** Resolves when every call submitted so far has been answered. */
  async idle(): Promise<void> {
    while (this.running.size > 0 || this.queue.length > 0) {
      if (this.running.size === 0) await Promise.resolve();
      else await Promise.all(this.running);
    }
  }

  private units(call: Call): number {
    return this.options.units?.(call) ?? 1;
  }

  /** Calls made in the same tick go out together: dispatch after the current microtasks. */
  private schedule(): void {
    if (this.scheduled || this.inFlight >= this.options.slots || this.queue.length === 0) return;
    this.scheduled = true;
    queueMicrotask(() => {
      this.scheduled = false;
      this.dispatch();
    });
  }

  private dispatch(): void {
    if (this.queue.length === 0 || this.inFlight >= this.options.slots) return;
    const share = this.options.spread
      ? Math.ceil(this.queue.length / (this.options.slots - this.inFlight))
      : this.queue.length;
    const keys = new Set<string>();
    const batch: Waiting<Call, Result>[] = [];
    const left: Waiting<Call, Result>[] = [];
    let units = 0;
    let full = false;
    for (const w of this.queue) {
      const next = this.units(w.call);
      // Full: everything after stays, so that no call overtakes one of its key.
      full ||= batch.length > 0 && units + next > this.options.maxBatch;
      if (!full && (batch.length < share || keys.has(w.key))) {
        batch.push(w);
        keys.add(w.key);
        units += next;
      } else left.push(w);
    }
    this.queue = left;
    this.track(this.serve(batch), true);
    this.schedule();
  }

  private track(work: Promise<void>, counted: boolean): void {
    if (counted) this.inFlight++;
    const done = work.finally(() => {
      this.running.delete(done);
      if (counted) {
        this.inFlight--;
        this.schedule();
      }
    });
    this.running.add(done);
  }

  private async serve(batch: Waiting<Call, Result>[]): Promise<void> {
    let results: (Result | undefined)[];
    try {
      results =
        batch.length === 1
          ? [await this.options.one(batch[0]!.call)]
          : await this.options.many(batch.map((w) => w.call));
    } catch (error) {
      // A call that was alone already has its own answer; so has every call of a statement
      // whose outcome is unknown.
      if (batch.length === 1 || !wroteNothing(error)) {
        for (const w of batch) w.reject(error);
        return;
      }
      return this.alone(batch);
    }
    const left: Waiting<Call, Result>[] = [];
    for (const [i, w] of batch.entries()) {
      const result = results[i];
      if (result === undefined) left.push(w);
      else w.resolve(result);
    }
    if (left.length > 0) await this.alone(left);
  }

  /** Each call on its own statement: in order within a key, keys side by side, outside `slots`. */
  private async alone(calls: Waiting<Call, Result>[]): Promise<void> {
    const byKey = new Map<string, Waiting<Call, Result>[]>();
    for (const w of calls) {
      const same = byKey.get(w.key);
      if (same) same.push(w);
      else byKey.set(w.key, [w]);
    }
    const lanes = [...byKey.values()].map(async (lane) => {
      for (const w of lane) {
        try {
          w.resolve(await this.options.one(w.call));
        } catch (error) {
          w.reject(error);
        }
      }
    });
    // Not waited for by the statement that failed: its slot is free for the next batch.
    this.track(
      Promise.all(lanes).then(() => undefined),
      false,
    );
  }
}

export interface BatcherOptions<Call, Result> {
  /** Serves one call alone (it then reports its own error). */
  one: (call: Call) => Promise<Result>;
  /** Serves many calls in one statement; result i answers call i (undefined: serve it alone). */
  many: (calls: Call[]) => Promise<(Result | undefined)[]>;
  /** Statements in flight at most (see statementSlots). */
  slots: number;
  /** Units one statement serves at most (a single call may ask for more). */
  maxBatch: number;
  /** What a call weighs against maxBatch (default 1). */
  units?: (call: Call) => number;
  /** Calls of one key are served alone in arrival order, and never split by `spread`. */
  keyOf: (call: Call) => string;
  /** Share the queue among the free slots rather than one statement taking it all. */
  spread?: boolean;
}

/**
 * Shared statements in flight for a pool of `poolSize`: two keep both cores of a small server
 * busy and batches big (on a hot key one lock and one commit serve a whole batch), and leave
 * half the pool to everything else.
 */
export function statementSlots(poolSize: number | undefined): number {
  return Math.max(1, Math.min(2, Math.floor((poolSize ?? 10) / 2)));
}

interface Waiting<Call, Result> {
  call: Call;
  key: string;
  resolve(result: Result): void;
  reject(error: unknown): void;
}
