import type pg from 'pg';
import type { InFlight } from '../db/in-flight.js';

/** Throttles: at most one start per interval, token buckets and concurrency limits per key. */
export class Throttles {
  /** @internal */
  constructor(
    private readonly pool: pg.Pool,
    private readonly schema: string,
    private readonly ensureOpen: (withTx?: boolean) => void,
    private readonly inFlight: InFlight,
    private readonly nodeId: string,
  ) {}

  /** Stops what runs in the background (lease renewals of run()); called by Ordo.close(). */
  async close(): Promise<void> {}
}
