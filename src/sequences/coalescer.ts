import { Batcher } from '../db/batcher.js';
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

/** take(): `count` consecutive values for one request, in one autocommitted statement. */
export type Take = (request: Request) => Promise<Issued[]>;
/** take_many(): many requests in one autocommitted statement; result i answers request i. */
export type TakeMany = (requests: Request[]) => Promise<Issued[][]>;

/**
 * Standalone calls for numbers share statements (the one Batcher of src/db/batcher.ts, with its
 * rules), and calls for the same (sequence, scope, at) in one statement share one request:
 * it asks for as many values as its callers want together, and each caller gets its own
 * consecutive values, in arrival order. None is skipped, because a statement takes exactly
 * the values it hands out.
 */
export class Coalescer {
  private readonly batcher: Batcher<Request, Issued[]>;

  constructor(
    private readonly take: Take,
    private readonly takeMany: TakeMany,
    slots = 2,
    /** Values one statement takes at most (a single caller may ask for more). */
    maxBatch = 10_000,
  ) {
    this.batcher = new Batcher({
      one: take,
      many: (requests) => this.serveMerged(requests),
      slots,
      maxBatch,
      units: (r) => r.count,
      keyOf: keyOf,
    });
  }

  /** Queues a caller for `count` values; it shares the next statement with the callers queued beside it. */
  submit(name: string, scope: string, at: string | null, count = 1): Promise<Issued[]> {
    if (!Number.isSafeInteger(count) || count < 1) {
      return Promise.reject(
        new OrdoError('invalid_argument', `count must be a whole number of at least 1 (got ${count})`),
      );
    }
    return this.batcher.submit({ name, scope, at, count });
  }

  /** Resolves when every queued caller has been answered. */
  idle(): Promise<void> {
    return this.batcher.idle();
  }

  /** One request per (sequence, scope, at), then each caller its own consecutive slice. */
  private async serveMerged(requests: Request[]): Promise<(Issued[] | undefined)[]> {
    const groups = new Map<string, { request: Request; callers: number[] }>();
    for (const [i, r] of requests.entries()) {
      const group = groups.get(keyOf(r));
      if (group) {
        group.request.count += r.count;
        group.callers.push(i);
      } else groups.set(keyOf(r), { request: { ...r }, callers: [i] });
    }
    const merged = [...groups.values()];
    const results =
      merged.length === 1
        ? [await this.take(merged[0]!.request)]
        : await this.takeMany(merged.map((g) => g.request));
    const answers: (Issued[] | undefined)[] = requests.map(() => undefined);
    for (const [g, group] of merged.entries()) {
      const issued = results[g];
      // A wrong count is never sliced: those callers are served alone.
      if (issued?.length !== group.request.count) continue;
      let from = 0;
      for (const i of group.callers) {
        const count = requests[i]!.count;
        answers[i] = issued.slice(from, from + count);
        from += count;
      }
    }
    return answers;
  }
}

function keyOf(r: Request): string {
  return `${r.name}\u0000${r.scope}\u0000${r.at ?? ''}`;
}
