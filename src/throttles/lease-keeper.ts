import type { Permit } from './permit.js';

/**
 * Keeps a permit alive while its task runs: extends the lease every third of it, on Node's
 * monotonic timers (the lease's length comes from the database: expiresAt − acquiredAt, so a
 * wrong wall clock changes nothing). The first extension that fails aborts `signal` with that
 * error: the task should stop, since its permit may be dead and another start may follow.
 */
export class LeaseKeeper {
  readonly #controller = new AbortController();
  #timer: NodeJS.Timeout | undefined;
  #pending: Promise<unknown> | undefined;
  #stopped = false;
  readonly #everyMs: number;

  /** A start without a permit (expiresAt null) has no lease: nothing is kept, nothing is lost. */
  constructor(private readonly permit: Permit) {
    if (permit.expiresAt === null) {
      this.#everyMs = 0;
      this.#stopped = true;
      return;
    }
    const leaseMs = permit.expiresAt.getTime() - permit.acquiredAt.getTime();
    this.#everyMs = Math.max(1, Math.floor(leaseMs / 3));
    this.#schedule();
  }

  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  /** Why the lease was lost, once it was. */
  get lost(): unknown {
    return this.#controller.signal.aborted ? this.#controller.signal.reason : undefined;
  }

  /** No more extensions; resolves once the one in flight (if any) has answered. */
  async stop(): Promise<void> {
    this.#stopped = true;
    clearTimeout(this.#timer);
    await this.#pending;
  }

  #schedule(): void {
    if (this.#stopped) return;
    this.#timer = setTimeout(() => {
      this.#pending = this.permit.extend().then(
        () => this.#schedule(),
        (error: unknown) => {
          if (!this.#stopped) this.#controller.abort(error);
        },
      );
    }, this.#everyMs);
  }
}
