import { quoteIdent } from '../db/migrations.js';

/**
 * Every statement the outbox sends, in one place for review. The schema name is a validated
 * identifier; all values are parameters.
 */
export function outboxPlans(schema: string) {
  const s = quoteIdent(schema);
  return {
    /** NOTIFY channel: the payload is the topic that has new messages (sent on commit). */
    channel: `ordo_outbox.${schema}`,
    /** Every message of one append, in one statement, in the caller's transaction. */
    append: `SELECT message_id, position, transaction_id::text FROM ${s}.append_many($1, $2::text[], $3::jsonb[], $4::text[], $5::text[], $6::jsonb[])`,
    /** The hot read: messages after the cursor that no open transaction can precede. */
    read: `SELECT position, transaction_id::text, topic, type, key, message_id, data, headers, created_at
      FROM ${s}.read_messages($1, $2::xid8, $3, $4)`,
    /**
     * After an empty read: whether messages past the cursor exist that read could not return
     * yet, and whether the subscription is still this consumer's (it may have been removed).
     */
    pending: `SELECT EXISTS (SELECT 1 FROM ${s}.messages WHERE topic = $1 AND (transaction_id, position) > ($2::xid8, $3)) AS pending,
        EXISTS (SELECT 1 FROM ${s}.subscriptions WHERE name = $4 AND owner = $5) AS leased`,
    create: `SELECT name FROM ${s}.create_subscription($1, $2, $3)`,
    lease: `SELECT last_transaction_id::text, last_position, attempts FROM ${s}.lease_subscription($1, $2, $3)`,
    release: `SELECT ${s}.release_subscription($1, $2) AS released`,
    checkpoint: `SELECT ${s}.checkpoint($1, $2, $3::xid8, $4, $5::xid8, $6, $7, $8) AS moved`,
    recordFailure: `SELECT ${s}.record_failure($1, $2, $3::xid8, $4, $5, $6) AS attempts`,
    park: `SELECT ${s}.park_message($1, $2, $3::xid8, $4, $5::xid8, $6, $7) AS parked`,
    lag: `SELECT name, topic, owner, lease_until, last_transaction_id::text, last_position, attempts, last_error,
        delivered, checkpointed_at, messages_behind, oldest_created_at, waiting, blocker_pid, blocker_xid_age,
        blocker_xact_start, blocker_state, blocker_application_name, blocker_prepared_gid, now
      FROM ${s}.subscription_lag($1)`,
    names: `SELECT name FROM ${s}.subscriptions ORDER BY name`,
    remove: `DELETE FROM ${s}.subscriptions WHERE name = $1 RETURNING name`,
    deadLetters: `SELECT position, transaction_id::text, topic, type, key, message_id, data, headers, created_at,
        attempts, error, parked_at
      FROM ${s}.dead_letters WHERE subscription = $1 ORDER BY transaction_id, position LIMIT $2`,
    prune: `SELECT ${s}.prune($1::interval, $2) AS deleted`,
  };
}

export type OutboxPlans = ReturnType<typeof outboxPlans>;
