import { performance } from 'node:perf_hooks';
import type pg from 'pg';
import { clientLike } from '../db/clients.js';
import type { Notifications } from '../db/notifications.js';
import type { Queryable } from '../db/queryable.js';
import { Allocator, type Reservation, type UnusedTail } from './batched.js';
import type { SequenceDefinition } from './definitions.js';
import type { SequencePlans } from './plans.js';

type Run = (db: Queryable, text: string, values: unknown[], retryMs?: number) => Promise<{ rows: any[] }>;

/** How often a node re-reads the epochs of the sequences it holds ranges of. */
const EPOCH_CHECK_MS = 2000;
/** How long a closing node waits for a sequence's lock to give its unused values back. */
const GIVE_BACK_WAIT_MS = 1000;

/**
 * This node's ranges of batched sequences. Redefinitions and removals reach it three ways:
 * a NOTIFY (immediate), the epoch returned by every reservation, and a periodic epoch check
 * of the sequences it holds ranges of, so a missed notification cannot keep a range alive
 * for more than a couple of seconds. The LISTEN connection is opened on first use only.
 */
export class BatchedRegistry {
  private readonly allocators = new Map<string, Allocator>();
  private unlisten: (() => void) | undefined;
  private checker: NodeJS.Timeout | undefined;
  /**
   * A connection of its own for reservations. pg-pool hands out connections on a later tick,
   * which a tight `await nextval()` loop never yields to; a connected client writes the
   * statement at once, so the next range is reserved while the current one is being used.
   */
  private reserver: pg.Client | undefined;
  private reserverBusy = false;
  private connecting: Promise<void> | undefined;
  /** Ranges reserved by this node, per sequence (read by the server's /metrics). */
  readonly reservations = new Map<string, number>();
  /** Told of each reservation statement and how long it took (the server's latency histogram). */
  readonly reservationListeners = new Set<(sequence: string, ms: number) => void>();

  constructor(
    private readonly pool: pg.Pool,
    private readonly plans: SequencePlans,
    private readonly nodeId: string,
    private readonly run: Run,
    private readonly isClosed: () => boolean,
    private readonly onChange: (name: string) => void,
    private readonly notifications: Notifications,
  ) {}

  get(name: string): Allocator | undefined {
    return this.allocators.get(name);
  }

  open(definition: SequenceDefinition): Allocator {
    let allocator = this.allocators.get(definition.name);
    if (!allocator) {
      allocator = new Allocator(
        definition.name,
        (n, wait, ranges) => this.reserve(n, wait, ranges),
        definition.timeoutMs,
        this.isClosed,
      );
      this.allocators.set(definition.name, allocator);
      this.watch();
    }
    return allocator;
  }

  forget(name: string): void {
    this.allocators.get(name)?.drop();
    this.allocators.delete(name);
  }

  /**
   * The sequence is now defined as `d`: this node's ranges of older definitions go, a range of
   * this one stays (Allocator.retire), and an allocator of a sequence no longer batched goes.
   */
  redefined(d: Pick<SequenceDefinition, 'name' | 'kind' | 'epoch' | 'timeoutMs'>): void {
    if (d.kind !== 'batched') return this.forget(d.name);
    this.allocators.get(d.name)?.retire(d.epoch, d.timeoutMs);
  }

  /** Resolves when no reservation is in flight. */
  async settle(): Promise<void> {
    await Promise.all([...this.allocators.values()].map((a) => a.settle()));
  }

  /**
   * Gives back the values this node never handed out, where they end the sequence's last
   * range (so a restart goes on where this node stopped), then drops every range.
   */
  async close(): Promise<void> {
    clearTimeout(this.checker);
    this.checker = undefined;
    // A reservation still in flight is waited for: its range may be the last one.
    await this.settle();
    const allocators = [...this.allocators.values()];
    const tails = allocators.map((a) => ({ name: a.name, tail: a.release() }));
    for (const name of [...this.allocators.keys()]) this.forget(name);
    await Promise.all(tails.map(({ name, tail }) => (tail ? this.giveBack(name, tail) : undefined)));
    this.unlisten?.();
    await this.connecting;
    await this.reserver?.end().catch(() => undefined);
    this.reserver = undefined;
  }

  private async reserve(name: string, waitMs: number | null, ranges: number): Promise<Reservation[]> {
    const dedicated = this.reserver && !this.reserverBusy ? this.reserver : undefined;
    if (!this.reserver) this.connectReserver();
    if (dedicated) this.reserverBusy = true;
    let rows: any[];
    const started = performance.now();
    try {
      // Not retried here: the allocator retries reservations itself, within the sequence's TIMEOUT.
      ({ rows } = await this.run(
        dedicated ?? this.pool,
        this.plans.reserve,
        [name, this.nodeId, waitMs, ranges],
        0,
      ));
    } finally {
      if (dedicated) this.reserverBusy = false;
    }
    this.reservations.set(name, (this.reservations.get(name) ?? 0) + rows.length);
    const ms = performance.now() - started;
    for (const listener of this.reservationListeners) listener(name, ms);
    return rows.map((r) => ({
      first: Number(r.first),
      last: Number(r.last),
      increment: Number(r.increment),
      epoch: Number(r.epoch),
      timeoutMs: r.timeout_ms === null ? null : Number(r.timeout_ms),
    }));
  }

  /**
   * One compare-and-set on the sequence's storage, under the definition's row lock (no range
   * can be reserved meanwhile): it moves back to `from` only if no range was reserved after
   * ours and the definition is the one ours came from. Otherwise, or on any failure, the
   * values stay a gap, as when a node stops without closing.
   */
  private async giveBack(name: string, tail: UnusedTail): Promise<void> {
    const values = [name, this.nodeId, tail.epoch, tail.lastFirst, tail.from, GIVE_BACK_WAIT_MS];
    await this.run(this.pool, this.plans.giveBack, values, 0).catch(() => undefined);
  }

  private connectReserver(): void {
    if (this.connecting || this.isClosed()) return;
    const client = this.newClient();
    client.on('error', () => {
      if (this.reserver === client) this.reserver = undefined;
    });
    this.connecting = client
      .connect()
      .then(() => {
        if (this.isClosed()) return void client.end().catch(() => undefined);
        this.reserver = client;
      })
      .catch(() => undefined) // the pool serves reservations until a connection is made
      .finally(() => {
        this.connecting = undefined;
      });
  }

  private newClient(): pg.Client {
    return clientLike(this.pool);
  }

  private watch(): void {
    this.unlisten ??= this.notifications.on(this.plans.channel, {
      // The definition is read again before any range is dropped: the notification may be the
      // echo of this node's own redefinition, whose new range must not be thrown away.
      message: (name) => {
        this.onChange(name);
        if (!this.allocators.has(name)) return;
        this.checkEpochs([name]).catch(() => this.forget(name));
      },
      // Anything may have been missed: no range is served any more, but the allocators (and
      // their TIMEOUT) stay, so calls during an outage retry within their timeout instead of
      // failing at their first definition lookup. The next reservation checks kind and epoch.
      reset: () => {
        for (const allocator of this.allocators.values()) allocator.drop();
      },
    });
    this.scheduleCheck();
  }

  /** The next epoch check; sooner while notifications are known not to arrive. */
  private scheduleCheck(): void {
    if (this.checker || this.isClosed()) return;
    this.checker = setTimeout(() => {
      void this.checkEpochs()
        .catch(() => undefined)
        .finally(() => {
          this.checker = undefined;
          if (this.allocators.size > 0) this.scheduleCheck();
        });
    }, this.notifications.pollInterval(EPOCH_CHECK_MS));
    this.checker.unref();
  }

  private async checkEpochs(names = [...this.allocators.keys()]): Promise<void> {
    if (names.length === 0 || this.isClosed()) return;
    const { rows } = await this.run(this.pool, this.plans.epochs, [names]);
    const current = new Map(rows.map((r) => [r.name as string, r]));
    for (const name of names) {
      const allocator = this.allocators.get(name);
      const row = current.get(name);
      if (!allocator) continue;
      if (row?.kind !== 'batched') {
        this.onChange(name);
        this.forget(name);
      } else {
        allocator.retire(Number(row.epoch), row.timeout_ms === null ? null : Number(row.timeout_ms));
      }
    }
  }
}
