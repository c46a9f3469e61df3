/** The open transaction that keeps committed messages from a consumer. */
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

export interface SubscriptionLag {
  name: string;
  topic: string;
  /** The consumer holding the lease, while its lease lasts. */
  owner: string | null;
  leaseUntil: Date | null;
  /** The last message handled. */
  cursor: { transactionId: string; position: number };
  /** Messages after the cursor, committed and visible now. */
  messagesBehind: number;
  /** Age of the oldest of them; null when none. */
  oldestAgeMs: number | null;
  /** Of those, how many wait for an older transaction to end before they may be read. */
  waiting: number;
  /** That transaction, when there is one. */
  blockedBy: Blocker | null;
  /** Failed deliveries of the next message, and why the last one failed. */
  attempts: number;
  lastError: string | null;
  delivered: number;
  checkpointedAt: Date | null;
}

export function toLag(row: Record<string, any>): SubscriptionLag {
  const now: Date = row.now;
  const live = row.lease_until !== null && row.lease_until > now;
  const blocked = row.blocker_pid !== null || row.blocker_prepared_gid !== null;
  return {
    name: row.name,
    topic: row.topic,
    owner: live ? row.owner : null,
    leaseUntil: live ? row.lease_until : null,
    cursor: { transactionId: row.last_transaction_id, position: Number(row.last_position) },
    messagesBehind: Number(row.messages_behind),
    oldestAgeMs:
      row.oldest_created_at === null ? null : Math.max(0, now.getTime() - row.oldest_created_at.getTime()),
    waiting: Number(row.waiting),
    blockedBy: blocked
      ? {
          pid: row.blocker_pid,
          preparedGid: row.blocker_prepared_gid,
          xidAge: row.blocker_xid_age,
          openForMs:
            row.blocker_xact_start === null ? null : now.getTime() - row.blocker_xact_start.getTime(),
          state: row.blocker_state,
          applicationName: row.blocker_application_name,
        }
      : null,
    attempts: row.attempts,
    lastError: row.last_error,
    delivered: Number(row.delivered),
    checkpointedAt: row.checkpointed_at,
  };
}
