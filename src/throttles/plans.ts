import { quoteIdent } from '../db/migrations.js';

/**
 * Every statement the throttles module sends, in one place for review. Built once per
 * schema; the schema name is a validated identifier, all values are parameters.
 */
export function throttlePlans(schema: string) {
  const s = quoteIdent(schema);
  // A pause that has run out reads as none.
  const columns = `name, every_ms, rate_limit, per_ms, concurrency, lease_ms, refund_on_failure, created_at, updated_at,
    CASE WHEN paused_until > clock_timestamp() THEN paused_until END AS paused_until`;
  return {
    define: `SELECT r.outcome, (r.definition).* FROM ${s}.define_throttle($1, $2, $3, $4, $5, $6, $7, $8, $9) AS r`,
    get: `SELECT ${columns} FROM ${s}.throttles WHERE name = $1`,
    list: `SELECT ${columns} FROM ${s}.throttles ORDER BY name`,
    remove: `SELECT ${s}.remove_throttle($1) AS removed`,
    /**
     * One request of several items (throttle, key, cost), all granted with one permit or
     * none: refused with how long to wait, why, and which limit waits longest.
     */
    acquire: `SELECT granted, permit_id, holder, acquired_at, expires_at, retry_after_ms, reason, limit_name, limit_key
      FROM ${s}.acquire_all(array_fill(1, ARRAY[cardinality($1::text[])]), $1::text[], $2::text[], $3::integer[],
                            array_fill($4::text, ARRAY[cardinality($1::text[])]))`,
    complete: `SELECT id, name, key, outcome, ended_at, refunded FROM ${s}.complete_permit($1)`,
    /**
     * Standalone completions and decisions, coalesced: one round trip and one commit for all.
     * Unanswered completions are served by `complete` (which says why).
     */
    batch: `SELECT request, permit_id, granted, holder, acquired_at, expires_at, retry_after_ms, reason, limit_name,
             limit_key, name, key, ended_at
      FROM ${s}.throttle_batch($1::uuid[], $2::integer[], $3::text[], $4::text[], $5::integer[], $6::text[])`,
    fail: `SELECT id, name, key, outcome, ended_at, refunded FROM ${s}.fail_permit($1, $2, $3, $4)`,
    extend: `SELECT ${s}.extend_permit($1) AS expires_at`,
    /** fail({ retryAfter }) of a start without a permit: its keys held for $3 ms, never less than they are. */
    hold: `SELECT ${s}.hold_keys($1::text[], $2::text[], $3)`,
    /** A key's last start and end, its own limits and pause, its line and live permits, at one clock reading. */
    state: `SELECT * FROM ${s}.throttle_key_state($1, $2)`,
    /** The keys of a throttle, the most recently active first, each as `state` reads it. */
    keys: `SELECT st.* FROM ${s}.throttle_keys($1, $2) AS k (key) CROSS JOIN LATERAL ${s}.throttle_key_state($1, k.key) AS st`,
    setKeyLimits: `SELECT every_ms, rate_limit, per_ms, concurrency FROM ${s}.set_key_limits($1, $2, $3, $4, $5, $6)`,
    /** Until $3 (a time), or for $4 ms from the database's clock; both null: resumed. */
    pause: `SELECT ${s}.pause_throttle($1, $2, coalesce(clock_timestamp() + $4::bigint * interval '1 millisecond', $3::timestamptz)) AS changed`,
    /** Waiting in line: enqueue or renew, serve the lines, answer. */
    wait: `SELECT granted, permit_id, holder, acquired_at, expires_at, retry_after_ms, reason, limit_name, limit_key, next_ms
      FROM ${s}.throttle_wait($1, $2::text[], $3::text[], $4::integer[], $5, $6)`,
    leave: `SELECT permit_id, holder, acquired_at, expires_at FROM ${s}.throttle_leave($1)`,
    keepWaiting: `SELECT waiter, served FROM ${s}.throttle_keep_waiting($1::uuid[], $2)`,
    channel: `ordo_throttles.${schema}`,
    /** Live permits of every throttle, or of one. */
    running: `SELECT p.id, p.name, p.key, p.holder, p.acquired_at, p.expires_at
      FROM ${s}.permits AS p JOIN ${s}.throttles AS d ON d.name = p.name AND d.incarnation = p.incarnation
      WHERE p.ended_at IS NULL AND p.expires_at > clock_timestamp() AND ($1::text IS NULL OR p.name = $1)
      ORDER BY p.name, p.key, p.acquired_at, p.id`,
  };
}

export type ThrottlePlans = ReturnType<typeof throttlePlans>;
