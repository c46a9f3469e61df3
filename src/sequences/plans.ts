import { quoteIdent } from '../db/migrations.js';

/**
 * Every statement the sequences module sends, in one place for review. Built once per
 * schema; the schema name is a validated identifier, all values are parameters.
 */
export function sequencePlans(schema: string) {
  const s = quoteIdent(schema);
  /**
   * A number handed out must survive a crash: with synchronous_commit off (a common speed
   * setting), a commit acknowledged before its WAL is flushed can be lost, the counter goes
   * back, and the number is handed out again. Read at commit, so setting it anywhere in the
   * transaction makes that commit durable.
   */
  const durable = `CROSS JOIN (SELECT set_config('synchronous_commit', 'on', true)) AS durable`;
  const columns =
    'name, kind, start, batch, timeout_ms, increment, min_value, max_value, cycle, reset, time_zone, year_start, format, epoch, created_at, updated_at';
  return {
    /** NOTIFY channel on which redefinitions and removals reach every node. */
    channel: `ordo_sequences.${schema}`,
    /** Creates or redefines (mode), after PostgreSQL has checked the time zone. */
    define: `SELECT r.outcome, (r.definition).* FROM ${s}.define_sequence($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) AS r`,
    get: `SELECT ${columns} FROM ${s}.sequences WHERE name = $1`,
    list: `SELECT ${columns} FROM ${s}.sequences ORDER BY name`,
    /** Current value per scope and period; sequences never used appear once with nulls. */
    status: `SELECT d.name, d.reset, c.scope, to_char(nullif(c.period, '-infinity'), 'YYYY-MM-DD') AS period, c.value
      FROM ${s}.sequences AS d LEFT JOIN ${s}.counters AS c ON c.sequence = d.name
      ORDER BY d.name, c.scope, c.period`,
    remove: `SELECT ${s}.remove_sequence($1) AS removed`,
    alterTimeout: `SELECT ${s}.alter_sequence_timeout($1, $2) AS altered`,
    /** A node's ranges of a batched sequence ($4 of them): a nextval() on its storage for each, plus the ownership rows. */
    reserve: `SELECT first, last, epoch, increment, timeout_ms FROM ${s}.reserve($1, $2, $3, $4) ${durable}`,
    /** A closing node gives its unused values back, if they end the last range (compare-and-set). */
    giveBack: `SELECT ${s}.give_back($1, $2, $3, $4, $5, $6) AS given_back`,
    /** Epochs of the batched sequences a node holds ranges of (a missed NOTIFY cannot keep a range alive). */
    epochs: `SELECT name, epoch, kind, timeout_ms FROM ${s}.sequences WHERE name = ANY($1::text[])`,
    /** `how_many` consecutive values of one (sequence, scope, at), in order, in one statement. */
    take: `SELECT value, text, period FROM ${s}.take($1, $2, coalesce($3::timestamptz, now()), $4) ${durable}`,
    /**
     * One value in the caller's transaction: take() for one, as an array {value, text, period},
     * in a statement with no set-returning function or join to plan; take_value() makes the
     * commit durable itself (as `durable` does for the others).
     */
    takeValue: `SELECT ${s}.take_value($1, $2, $3) AS issued`,
    /** take(), once per (sequence, idempotency key): a retry with the key gets the same values. */
    takeOnce: `SELECT value, text, period, replayed FROM ${s}.take_once($1, $2, coalesce($3::timestamptz, now()), $4, $5) ${durable}`,
    /** Coalesced standalone calls for several (sequence, scope, at) at once. */
    takeMany: `SELECT request, value, text, period FROM ${s}.take_many($1::text[], $2::text[], $3::timestamptz[], $4::integer[]) ${durable}`,
    /** Numbers a table's column at commit (a deferred trigger); false when attached so already. */
    attach: `SELECT ${s}.attach_sequence($1, $2, $3, $4, $5) AS attached`,
    /** Waits at most $4 ms for the table's lock (DROP TRIGGER queues every reader behind it). */
    detach: `SELECT ${s}.detach_sequence($1, $2, $3, $4) AS detached`,
    /** Attachments of one sequence ($1) or of all (null). */
    attachments: `SELECT sequence, table_name::text AS table_name, column_name, scope_column, text_column
      FROM ${s}.attachments WHERE $1::text IS NULL OR sequence = $1 ORDER BY sequence, table_name::text, column_name`,
    /** Per sequence ($1, or every one when null): no row, no such sequence; a null scope, no holder. */
    holders: `SELECT d.name AS sequence, h.* FROM ${s}.sequences AS d
      LEFT JOIN LATERAL ${s}.sequence_holders(d.name) AS h ON d.kind = 'gapless'
      WHERE $1::text IS NULL OR d.name = $1 ORDER BY d.name`,
    /** Counters of one sequence ($1) or of all (null), the most recently used first, at most $2. */
    counters: `SELECT sequence, scope, to_char(nullif(period, '-infinity'), 'YYYY-MM-DD') AS period, value, updated_at
      FROM ${s}.counters WHERE $1::text IS NULL OR sequence = $1 ORDER BY updated_at DESC, sequence, scope LIMIT $2`,
    /**
     * The ranges each node holds of the current definition: those of its last two reservations
     * (the ranges of one reservation share its reserved_at), which hold the one in use and those ahead.
     */
    ranges: `SELECT sequence, node_id, first, last, epoch, reserved_at, increment FROM (
        SELECT b.*, d.increment, dense_rank() OVER (PARTITION BY b.sequence, b.node_id ORDER BY b.reserved_at DESC) AS nth
          FROM ${s}.sequence_batches AS b JOIN ${s}.sequences AS d ON d.name = b.sequence AND d.epoch = b.epoch
         WHERE $1::text IS NULL OR b.sequence = $1) AS held
      WHERE nth <= 2 ORDER BY sequence, node_id, first`,
    /** Values taken so far per sequence: gapless, in every scope and period; batched, reserved by every node. */
    activity: `SELECT d.name, d.kind, CASE WHEN d.kind = 'batched'
          THEN greatest((${s}.storage_position(d.storage) - d.start) / d.increment, 0)
          ELSE coalesce((SELECT sum((c.value - d.start) / d.increment + 1) FROM ${s}.counters AS c WHERE c.sequence = d.name), 0)
        END AS taken, clock_timestamp() AS at
      FROM ${s}.sequences AS d ORDER BY d.name`,
  };
}

export type SequencePlans = ReturnType<typeof sequencePlans>;
