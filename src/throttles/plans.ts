import { quoteIdent } from '../db/migrations.js';

/**
 * Every statement the throttles module sends, in one place for review. Built once per
 * schema; the schema name is a validated identifier, all values are parameters.
 */
export function throttlePlans(schema: string) {
  const s = quoteIdent(schema);
  const columns =
    'name, every_ms, rate_limit, per_ms, concurrency, lease_ms, refund_on_failure, created_at, updated_at';
  return {
    define: `SELECT r.outcome, (r.definition).* FROM ${s}.define_throttle($1, $2, $3, $4, $5, $6, $7, $8) AS r`,
    get: `SELECT ${columns} FROM ${s}.throttles WHERE name = $1`,
    list: `SELECT ${columns} FROM ${s}.throttles ORDER BY name`,
    remove: `SELECT ${s}.remove_throttle($1) AS removed`,
    /** The one decision: granted with a permit, or refused with how long to wait. */
    acquire: `SELECT granted, permit_id, holder, acquired_at, expires_at, retry_after_ms, reason FROM ${s}.try_acquire($1, $2, $3)`,
    complete: `SELECT id, name, key, outcome, ended_at, refunded FROM ${s}.complete_permit($1)`,
    /**
     * Standalone completions and decisions, coalesced: one round trip and one commit for all.
     * Unanswered completions are served by `complete` (which says why).
     */
    batch: `SELECT request, permit_id, granted, holder, acquired_at, expires_at, retry_after_ms, reason, name, key, ended_at
      FROM ${s}.throttle_batch($1::uuid[], $2::text[], $3::text[], $4::text[])`,
    fail: `SELECT id, name, key, outcome, ended_at, refunded FROM ${s}.fail_permit($1, $2, $3)`,
    extend: `SELECT ${s}.extend_permit($1) AS expires_at`,
    /** A key's last start and end, and its live permits, at one clock reading. */
    state: `SELECT st.*, (
        SELECT coalesce(json_agg(json_build_object('id', p.id, 'holder', p.holder,
                 'acquired_at', p.acquired_at, 'expires_at', p.expires_at) ORDER BY p.acquired_at, p.id), '[]')
          FROM ${s}.permits AS p JOIN ${s}.throttles AS d ON d.name = p.name AND d.incarnation = p.incarnation
         WHERE p.name = $1 AND p.key = $2 AND p.ended_at IS NULL AND p.expires_at > st.observed_at) AS permits
      FROM ${s}.throttle_status($1, $2) AS st`,
    /** Live permits of every throttle, or of one. */
    running: `SELECT p.id, p.name, p.key, p.holder, p.acquired_at, p.expires_at
      FROM ${s}.permits AS p JOIN ${s}.throttles AS d ON d.name = p.name AND d.incarnation = p.incarnation
      WHERE p.ended_at IS NULL AND p.expires_at > clock_timestamp() AND ($1::text IS NULL OR p.name = $1)
      ORDER BY p.name, p.key, p.acquired_at, p.id`,
  };
}

export type ThrottlePlans = ReturnType<typeof throttlePlans>;
