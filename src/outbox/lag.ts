import { OrdoError } from '../errors.js';

/** An open transaction that appended to a topic: its own messages wait for it to end. */
export interface Blocker {
  /** The backend running it; null for a prepared (two-phase) transaction. */
  pid: number | null;
  /** Set for a prepared transaction: COMMIT PREPARED or ROLLBACK PREPARED it. */
  preparedGid: string | null;
  /** Transactions begun since it began (age of its xid). */
  xidAge: number;
  /** How long it has been open. */
  openForMs: number | null;
  /** 'idle in transaction' names a forgotten transaction; 'active' a long statement. */
  state: string | null;
  applicationName: string | null;
}

/** One partition of a subscription. */
export interface PartitionLag {
  partition: number;
  /** The consumer holding the partition's lease, while its lease lasts. */
  owner: string | null;
  leaseUntil: Date | null;
  /** The highest position delivered so far (messages of transactions still open may lie below it). */
  position: number;
  /**
   * Committed messages not yet delivered, counted up to 10,000 per partition (a partition
   * further behind shows 10,000): a large backlog costs little to read.
   */
  messagesBehind: number;
  /** Age of the oldest of them; null when none. */
  oldestAgeMs: number | null;
  /** Failed deliveries of the next message, and why the last one failed. */
  attempts: number;
  lastError: string | null;
  delivered: number;
  /** Messages handed out again (after a failure, a lapsed lease, a crash before the ack). */
  redelivered: number;
  checkpointedAt: Date | null;
}

/** A subscription: its partitions summed up, and each of them. */
export interface SubscriptionLag extends Omit<PartitionLag, 'partition' | 'position'> {
  name: string;
  topic: string;
  /**
   * Open transactions that appended to the topic: their messages are delivered once they
   * commit, and nothing else waits for them.
   */
  waiting: number;
  /** The oldest of them, when there is one. */
  blockedBy: Blocker | null;
  /** Messages parked in dead_letters. */
  deadLettered: number;
  partitions: PartitionLag[];
}

const age = (now: Date, at: Date | null): number | null =>
  at === null ? null : Math.max(0, now.getTime() - at.getTime());

function toPartition(row: Record<string, any>): PartitionLag {
  const now: Date = row.now;
  return {
    partition: row.partition,
    owner: row.owner,
    leaseUntil: row.lease_until,
    position: Number(row.position),
    messagesBehind: Number(row.messages_behind),
    oldestAgeMs: age(now, row.oldest_created_at),
    attempts: row.attempts,
    lastError: row.last_error,
    delivered: Number(row.delivered),
    redelivered: Number(row.redelivered),
    checkpointedAt: row.checkpointed_at,
  };
}

/**
 * The rows of subscription_lag (one per partition), as one SubscriptionLag. No rows: the
 * subscription was removed between the function's first statement and its last.
 */
export function toLag(name: string, rows: Record<string, any>[]): SubscriptionLag {
  const first = rows[0];
  if (first === undefined)
    throw new OrdoError('subscription_not_found', `The subscription '${name}' does not exist`);
  const now: Date = first.now;
  const partitions = rows.map(toPartition);
  const blocked = first.blocker_pid !== null || first.blocker_prepared_gid !== null;
  const latest = (dates: (Date | null)[]) =>
    dates.reduce<Date | null>((a, d) => (d !== null && (a === null || d > a) ? d : a), null);
  const held = partitions.find((p) => p.owner !== null);
  const failing = partitions.find((p) => p.attempts > 0 || p.lastError !== null);
  const ages = partitions.map((p) => p.oldestAgeMs).filter((a): a is number => a !== null);
  return {
    name: first.name,
    topic: first.topic,
    owner: held?.owner ?? null,
    leaseUntil: held?.leaseUntil ?? null,
    messagesBehind: partitions.reduce((n, p) => n + p.messagesBehind, 0),
    oldestAgeMs: ages.length === 0 ? null : Math.max(...ages),
    waiting: Number(first.waiting),
    blockedBy: blocked
      ? {
          pid: first.blocker_pid,
          preparedGid: first.blocker_prepared_gid,
          xidAge: first.blocker_xid_age,
          openForMs: age(now, first.blocker_xact_start),
          state: first.blocker_state,
          applicationName: first.blocker_application_name,
        }
      : null,
    attempts: failing?.attempts ?? 0,
    lastError: failing?.lastError ?? null,
    delivered: partitions.reduce((n, p) => n + p.delivered, 0),
    redelivered: partitions.reduce((n, p) => n + p.redelivered, 0),
    deadLettered: Number(first.dead_lettered),
    checkpointedAt: latest(partitions.map((p) => p.checkpointedAt)),
    partitions,
  };
}
