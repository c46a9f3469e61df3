import { OrdoError } from '../errors.js';

export interface Issued {
  value: number;
  text: string;
  /** Local start of the reset period ('2026-01-01'), or null for a sequence that never resets. */
  period: string | null;
  scope: string;
}

/** Takes `count` consecutive values in one autocommitted statement. */
export type TakeMany = (name: string, scope: string, at: string | null, count: number) => Promise<Issued[]>;

interface Waiter {
  resolve(issued: Issued): void;
  reject(error: unknown): void;
}

interface Key {
  name: string;
  scope: string;
  at: string | null;
}

/**
 * Standalone calls for the same (sequence, scope, at) share statements: while one statement
 * is in flight, new callers queue; when it returns, one statement takes as many values as
 * callers wait. Each caller gets its own number, in arrival order, and none is skipped,
 * because the values a statement takes are exactly the values it hands out.
 */
export class Coalescer {
  private readonly queues = new Map<string, Waiter[]>();
  private readonly draining = new Set<Promise<void>>();

  constructor(
    private readonly takeMany: TakeMany,
    private readonly maxBatch = 1000,
  ) {}

  take(name: string, scope: string, at: string | null): Promise<Issued> {
    const id = `${name}\u0000${scope}\u0000${at ?? ''}`;
    return new Promise<Issued>((resolve, reject) => {
      const queue = this.queues.get(id);
      if (queue) {
        queue.push({ resolve, reject });
        return;
      }
      const fresh: Waiter[] = [{ resolve, reject }];
      this.queues.set(id, fresh);
      const done = this.drain(id, { name, scope, at }, fresh).finally(() => this.draining.delete(done));
      this.draining.add(done);
    });
  }

  /** Resolves when every queued caller has been answered. */
  async idle(): Promise<void> {
    while (this.draining.size > 0) await Promise.all(this.draining);
  }

  private async drain(id: string, key: Key, queue: Waiter[]): Promise<void> {
    while (queue.length > 0) {
      const batch = queue.splice(0, this.maxBatch);
      try {
        const issued = await this.takeMany(key.name, key.scope, key.at, batch.length);
        for (const [i, w] of batch.entries()) w.resolve(issued[i]!);
      } catch (error) {
        if (batch.length > 1 && error instanceof OrdoError && error.code === 'sequence_exhausted') {
          // The batch asked for more than is left: serve callers one by one, so each value
          // still left goes to a caller and only the rest are refused.
          await this.oneByOne(key, batch);
        } else {
          for (const w of batch) w.reject(error);
        }
      }
    }
    this.queues.delete(id);
  }

  private async oneByOne(key: Key, batch: Waiter[]): Promise<void> {
    for (const w of batch) {
      try {
        const [issued] = await this.takeMany(key.name, key.scope, key.at, 1);
        w.resolve(issued!);
      } catch (error) {
        w.reject(error);
      }
    }
  }
}
