import { quoteIdent } from '../db/migrations.js';

/**
 * Every statement the outbox sends, in one place for review. The schema name is a validated
 * identifier; all values are parameters.
 */
export function outboxPlans(schema: string) {
  const s = quoteIdent(schema);
  // What receive() writes (the round's target, the batch handed out) may be lost in a crash:
  // the state is then as before it, nothing was acknowledged, and the batch comes again (an ack
  // against the lost version is refused). So its commit does not wait for the WAL flush; only
  // the acknowledgement, in the handler's transaction, does, when the handler wrote in it.
  const lazy = `CROSS JOIN (SELECT set_config('synchronous_commit', 'off', true)) AS lazy`;
  // A message's columns, in the order readBatch() reads them (toMessage() reads them by name,
  // the topic after them). The instant is seconds in a float8, date_part(): cheaper in the
  // server than extract()'s exact numeric, and in Node than pg's parser of a timestamptz's text.
  // The usual empty headers are not parsed. The transaction id (and the consumer's version) are
  // read as PostgreSQL writes them, without a cast to text.
  const fields = `position, transaction_id, type, key, message_id, data,
        NULLIF(headers, '{}'::jsonb) AS headers, date_part('epoch', created_at) AS created_s`;
  const message = `${fields}, topic`;
  return {
    /** NOTIFY channel: the payload is the topic that has new messages (sent on commit). */
    channel: `ordo_outbox.${schema}`,
    /**
     * Every message of one append, in one statement, in the caller's transaction: the
     * transaction's id, then the position of each message given (null: its id was stored
     * before), as one array.
     */
    append: `SELECT ${s}.append_answer($1, $2::text[], $3::jsonb[], $4::text[], $5::text[], $6::jsonb[]) AS answer`,
    /** The next batch of a partition this consumer leases, recorded against its version (readBatch). */
    receive: `SELECT ${fields}, version, attempt
      FROM ${s}.receive($1, $2, $3, $4, $5) ${lazy}`,
    /** A batch for a consumer that is not this library: the first free partition with messages. */
    receiveAny: `SELECT partition, ${message}, version::text, attempt
      FROM ${s}.receive_any($1, $2, $3, $4, $5) ${lazy}`,
    /**
     * After an empty receive: whether a transaction that appended to the topic is still open
     * (its messages come when it commits), and whether the partition is still this consumer's.
     */
    pending: `SELECT owner = $3 AS leased, EXISTS (SELECT 1 FROM ${s}.appender_locks($4)) AS pending
      FROM ${s}.subscription_partitions WHERE subscription = $1 AND partition = $2`,
    create: `SELECT name FROM ${s}.create_subscription($1, $2, $3, $4)`,
    join: `SELECT member FROM ${s}.join_subscription($1, $2, $3)`,
    leave: `SELECT ${s}.leave_subscription($1, $2)`,
    /** Takes or renews a partition's lease; outcome: what became of the batch of a lapsed lease (as nack's). */
    lease: `SELECT partition, outcome, attempts FROM ${s}.lease_partition($1, $2, $3, $4, $5, $6)`,
    release: `SELECT ${s}.release_partition($1, $2, $3) AS released`,
    ack: `SELECT ${s}.ack($1, $2, $3, $4::bigint, $5, $6, $7) AS handled`,
    /**
     * The same in the transaction given to the handler: its commit waits for the WAL flush only
     * if the handler wrote in it.
     */
    ackHandled: `SELECT ${s}.ack_handled($1, $2, $3, $4::bigint, $5) AS handled`,
    /** Past the first messages of a batch only (a relay whose broker confirmed a prefix). */
    ackThrough: `SELECT ${s}.ack_through($1, $2, $3, $4::bigint, $5, $6, $7) AS handled`,
    nack: `SELECT outcome, attempts FROM ${s}.nack($1, $2, $3, $4::bigint, $5, $6, $7, $8, $9)`,
    /** The same for a receipt (HTTP): refused once its lease has lapsed, even if nobody took it. */
    nackReceipt: `SELECT outcome, attempts FROM ${s}.nack($1, $2, $3, $4::bigint, $5, $6, $7, $8, $9, true)`,
    seek: `SELECT ${s}.seek_subscription($1, $2) AS moved`,
    firstSince: `SELECT ${s}.first_position_since($1, $2) AS first`,
    lag: `SELECT name, topic, partitions, partition, owner, lease_until, position, attempts, last_error, delivered,
        redelivered, dead_lettered, checkpointed_at, messages_behind, oldest_created_at, waiting, blocker_pid, blocker_xid_age,
        blocker_xact_start, blocker_state, blocker_application_name, blocker_prepared_gid, now
      FROM ${s}.subscription_lag($1)`,
    names: `SELECT name FROM ${s}.subscriptions ORDER BY name`,
    remove: `DELETE FROM ${s}.subscriptions WHERE name = $1 RETURNING name`,
    deadLetters: `SELECT ${message}, attempts, error, parked_at
      FROM ${s}.dead_letters WHERE subscription = $1 ORDER BY parked_at, position LIMIT $2`,
    /** The same, the latest parked first (what a dashboard shows). */
    deadLettersNewest: `SELECT ${message}, attempts, error, parked_at
      FROM ${s}.dead_letters WHERE subscription = $1 ORDER BY parked_at DESC, position DESC LIMIT $2`,
    prune: `SELECT ${s}.prune($1::interval, $2) AS deleted`,
    /** A relay starting: where it publishes; a new start clears the error of the last one. */
    relayStarted: `INSERT INTO ${s}.relays (name, broker, target) VALUES ($1, $2, $3)
      ON CONFLICT (name) DO UPDATE SET broker = EXCLUDED.broker, target = EXCLUDED.target, started_at = now(),
        last_error = NULL, last_error_at = NULL`,
    relayFailed: `UPDATE ${s}.relays SET last_error = left($2, 2000), last_error_at = now() WHERE name = $1`,
    relays: `SELECT name, broker, target, started_at, last_error, last_error_at FROM ${s}.relays ORDER BY name`,
  };
}

export type OutboxPlans = ReturnType<typeof outboxPlans>;
