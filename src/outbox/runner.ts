import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import type pg from 'pg';
import { OrdoError, toOrdoError } from '../errors.js';
import { Consumer, type ConsumerSettings, type SubscriptionEnd } from './consumer.js';
import type { OutboxPlans } from './plans.js';

/**
 * The consumers one subscribe() runs: one per partition this instance takes. With one
 * partition, every instance runs a consumer of it and the lease decides who reads. With
 * several, instances announce themselves (join_subscription) every third of a lease and each
 * takes the partitions whose number modulo the count of live instances is its rank, oldest
 * first: a newcomer takes some over, and those of an instance that stopped or died (its entry
 * lapses with its lease) are shared out. A consumer that gives a partition up finishes its
 * batch and releases the lease, so the next holder starts where it stopped.
 */
export class PartitionRunner {
  readonly member = `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`;
  readonly done: Promise<SubscriptionEnd>;
  private readonly consumers = new Map<number, Consumer>();
  private stopping = false;
  private ended: SubscriptionEnd | undefined;
  private wakeUp: (() => void) | undefined;

  constructor(
    private readonly pool: pg.Pool,
    private readonly plans: OutboxPlans,
    private readonly settings: Omit<ConsumerSettings, 'partition'>,
    private readonly partitions: number,
    private readonly pollInterval: (ms: number) => number,
  ) {
    this.done = this.loop();
  }

  get topic(): string {
    return this.settings.topic;
  }

  notify(): void {
    for (const c of this.consumers.values()) c.notify();
  }

  async stop(): Promise<SubscriptionEnd> {
    this.stopping = true;
    this.wakeUp?.();
    for (const c of this.consumers.values()) void c.stop();
    return this.done;
  }

  private async loop(): Promise<SubscriptionEnd> {
    while (!this.stopping && !this.ended) {
      try {
        await this.rebalance(this.partitions === 1 ? [0] : await this.mine());
      } catch (e) {
        const error = toOrdoError(e);
        this.settings.onError?.(error);
        if (error.code === 'subscription_not_found') this.ended = { reason: 'stopped', error };
      }
      if (this.partitions === 1 && this.consumers.size > 0) {
        // Nothing to rebalance: wait for the consumer to end.
        this.ended ??= await this.consumers.get(0)!.done;
        break;
      }
      await this.sleep(this.settings.leaseMs / 3);
    }
    const ends = await Promise.all([...this.consumers.values()].map((c) => c.stop()));
    this.consumers.clear();
    if (this.partitions > 1) {
      await this.pool.query(this.plans.leave, [this.settings.name, this.member]).catch(() => undefined);
    }
    return this.ended ?? ends.find((e) => e.error) ?? { reason: 'stopped' };
  }

  /** The partitions this instance should read now. */
  private async mine(): Promise<number[]> {
    const { rows } = await this.pool.query(this.plans.join, [
      this.settings.name,
      this.member,
      this.settings.leaseMs,
    ]);
    const members = rows.map((r: { member: string }) => r.member);
    const rank = members.indexOf(this.member);
    if (rank < 0)
      throw new OrdoError(
        'subscription_not_found',
        `The subscription '${this.settings.name}' does not exist`,
      );
    const wanted: number[] = [];
    for (let p = rank; p < this.partitions; p += members.length) wanted.push(p);
    return wanted;
  }

  /** Starts consumers for the partitions wanted, and stops the others (they release their leases). */
  private async rebalance(wanted: number[]): Promise<void> {
    const keep = new Set(wanted);
    const leaving = [...this.consumers].filter(([p]) => !keep.has(p));
    for (const [p] of leaving) this.consumers.delete(p);
    await Promise.all(leaving.map(([, c]) => c.stop()));
    for (const partition of wanted) {
      if (this.consumers.has(partition) || this.stopping) continue;
      const consumer = new Consumer(
        this.pool,
        this.plans,
        { ...this.settings, partition },
        this.pollInterval,
      );
      this.consumers.set(partition, consumer);
      void consumer.done.then((end) => {
        // A partition given up for good (exhausted, or the subscription removed) ends the subscription.
        if (this.consumers.get(partition) === consumer && (end.reason === 'exhausted' || end.error)) {
          this.ended ??= end;
          this.wakeUp?.();
        }
      });
    }
  }

  private sleep(ms: number): Promise<void> {
    if (this.stopping || this.ended) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      function done() {
        clearTimeout(timer);
        resolve();
      }
      this.wakeUp = () => {
        this.wakeUp = undefined;
        done();
      };
    });
  }
}
