import { OrdoError } from '../errors.js';

export interface Issued {
  value: number;
  text: string;
  /** Local start of the reset period ('2026-01-01'), or null for a sequence that never resets. */
  period: string | null;
  scope: string;
}

export interface Request {
  name: string;
  scope: string;
  /** ISO timestamp, or null for the statement's now(). */
  at: string | null;
  count: number;
}

/** Takes `count` consecutive values for one request, in one autocommitted statement. */
export type TakeOne = (request: Request) => Promise<Issued[]>;
/** Serves many requests in one autocommitted statement; result i answers request i. */
export type TakeBatch = (requests: Request[]) => Promise<Issued[][]>;

interface Waiter {
  count: number;
  resolve(issued: Issued[]): void;
  reject(error: unknown): void;
}

interface Group {
  key: Omit<Request, 'count'>;
  waiters: Waiter[];
}

/**
 * Standalone calls share statements. Calls queue while `maxInFlight` statements run; the next
 * statement serves every queued call at once, grouped by (sequence, scope, at): one request
 * per group asks for as many values as its callers want together. Each caller gets its own
 * consecutive values, in arrival order within its group, and none is skipped, because a
 * statement takes exactly the values it hands out.
 */
export class Coalescer {
  private queue = new Map<string, Group>();
  /** Values wanted by queued callers. */
  private queued = 0;
  private inFlight = 0;
  private scheduled = false;
  private readonly running = new Set<Promise<void>>();

  constructor(
    private readonly takeOne: TakeOne,
    private readonly takeBatch: TakeBatch,
    private readonly maxInFlight = 2,
    /** Values one statement takes at most (a single caller may ask for more). */
    private readonly maxBatch = 10_000,
  ) {}

  take(name: string, scope: string, at: string | null, count = 1): Promise<Issued[]> {
    if (!Number.isSafeInteger(count) || count < 1) {
      return Promise.reject(
        new OrdoError('invalid_argument', `count must be a whole number of at least 1 (got ${count})`),
      );
    }
    const id = `${name}\u0000${scope}\u0000${at ?? ''}`;
    return new Promise<Issued[]>((resolve, reject) => {
      let group = this.queue.get(id);
      if (!group) {
        group = { key: { name, scope, at }, waiters: [] };
        this.queue.set(id, group);
      }
      group.waiters.push({ count, resolve, reject });
      this.queued += count;
      this.schedule();
    });
  }

  /** Resolves when every queued caller has been answered. */
  async idle(): Promise<void> {
    while (this.running.size > 0 || this.queued > 0) {
      if (this.running.size === 0) await Promise.resolve();
      else await Promise.all(this.running);
    }
  }

  /** Calls made in the same tick go out together: dispatch after the current microtasks. */
  private schedule(): void {
    if (this.scheduled || this.inFlight >= this.maxInFlight) return;
    this.scheduled = true;
    queueMicrotask(() => {
      this.scheduled = false;
      this.dispatch();
    });
  }

  private dispatch(): void {
    if (this.queued === 0 || this.inFlight >= this.maxInFlight) return;
    const batch: Group[] = [];
    let size = 0;
    for (const [id, group] of this.queue) {
      if (size >= this.maxBatch) break;
      // Whole callers, up to maxBatch values (always at least one caller).
      let taken = 0;
      let values = 0;
      while (
        taken < group.waiters.length &&
        (size + values === 0 || size + values + group.waiters[taken]!.count <= this.maxBatch)
      ) {
        values += group.waiters[taken]!.count;
        taken++;
      }
      if (taken === 0) break;
      if (taken === group.waiters.length) {
        this.queue.delete(id);
        batch.push(group);
      } else {
        batch.push({ key: group.key, waiters: group.waiters.splice(0, taken) });
      }
      size += values;
    }
    this.queued -= size;
    this.inFlight++;
    const done = this.serve(batch).finally(() => {
      this.running.delete(done);
      this.inFlight--;
      this.schedule();
    });
    this.running.add(done);
    this.schedule();
  }

  private async serve(batch: Group[]): Promise<void> {
    if (batch.length === 1) return this.serveGroup(batch[0]!);
    let results: Issued[][];
    try {
      results = await this.takeBatch(batch.map((g) => ({ ...g.key, count: wanted(g) })));
    } catch {
      // One request failed (an unknown sequence, an exhausted one, a row held by a transaction):
      // serve each group on its own, so every caller gets its own answer.
      await Promise.all(batch.map((g) => this.serveGroup(g)));
      return;
    }
    for (const [i, g] of batch.entries()) {
      const issued = results[i];
      if (issued?.length === wanted(g)) answer(g, issued);
      else {
        const error = new OrdoError(
          'database_error',
          'take_many answered a request with the wrong number of values',
        );
        for (const w of g.waiters) w.reject(error);
      }
    }
  }

  private async serveGroup(group: Group): Promise<void> {
    try {
      answer(group, await this.takeOne({ ...group.key, count: wanted(group) }));
    } catch (error) {
      if (group.waiters.length > 1 && error instanceof OrdoError && error.code === 'sequence_exhausted') {
        // More was asked than is left: caller by caller, so what is left goes to the first ones.
        for (const w of group.waiters) {
          try {
            w.resolve(await this.takeOne({ ...group.key, count: w.count }));
          } catch (e) {
            w.reject(e);
          }
        }
      } else {
        for (const w of group.waiters) w.reject(error);
      }
    }
  }
}

function wanted(group: Group): number {
  return group.waiters.reduce((n, w) => n + w.count, 0);
}

/** Each caller its own consecutive slice, in arrival order. */
function answer(group: Group, issued: Issued[]): void {
  let from = 0;
  for (const w of group.waiters) {
    w.resolve(issued.slice(from, from + w.count));
    from += w.count;
  }
}
