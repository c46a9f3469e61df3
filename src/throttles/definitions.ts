import { durationOption } from '../durations.js';
import { boolean, identifier, invalid, knownKeys, plainObject, safeInteger } from '../validate.js';

/**
 * Why a start was refused: one start per interval, the token bucket, the concurrency limit, a
 * pause (pause(), or fail() with retryAfter), or others waiting in line for the key first.
 */
export type ThrottlePolicy = 'every' | 'rate' | 'concurrency' | 'paused' | 'queued';
/** The reasons counted by `counters` (every refusal has one). */
export const REFUSAL_REASONS = ['every', 'rate', 'concurrency', 'paused', 'queued'] as const;

export interface DefineThrottleOptions {
  name: string;
  /** At most one start per this interval per key: '2s', '1m', '500ms', or milliseconds. */
  every?: string | number;
  /** Token bucket per key: bursts of `limit` starts, refilled at `limit` per `per` (GCRA). */
  limit?: number;
  /** The period `limit` refills over: '1s', '1m', or milliseconds. Goes with `limit`. */
  per?: string | number;
  /** At most this many live permits per key. */
  concurrency?: number;
  /** How long a permit lives unless completed, failed or extended (default '5m'). */
  lease?: string | number;
  /**
   * false: a grant is a start and nothing more, with no permit stored: no lease, no outcome, no
   * refund (a plain rate limiter, for every and limit/per only). Default true.
   */
  permits?: boolean;
  /** What fail() does when not told: give the start (and token) back so a retry may start at once. Default false. */
  refundOnFailure?: boolean;
  /** Return the existing definition instead of failing with throttle_exists. */
  ifNotExists?: boolean;
  /** Replace an existing definition; each key's state and live permits are kept. */
  overwrite?: boolean;
}

export interface ThrottleDefinition {
  name: string;
  everyMs: number | null;
  limit: number | null;
  perMs: number | null;
  concurrency: number | null;
  /** Whether a grant is a permit with a lease and an outcome (false: a start only). */
  permits: boolean;
  /** A permit's lease; null without permits. */
  leaseMs: number | null;
  refundOnFailure: boolean;
  /** Until when the whole throttle is paused (pause() without a key), or null. */
  pausedUntil: Date | null;
  createdAt: Date;
  updatedAt: Date;
}

export type ValidThrottle = Omit<ThrottleDefinition, 'createdAt' | 'updatedAt' | 'pausedUntil'> & {
  mode: 'create' | 'if_not_exists' | 'overwrite';
};

/** Longest every, per and lease: one year (365 days). */
export const MAX_DURATION_MS = 365 * 86_400_000;
/** Largest limit and concurrency. */
export const MAX_LIMIT = 1_000_000;
export const DEFAULT_LEASE_MS = 5 * 60_000;

const DEFINE_KEYS = [
  'name',
  'every',
  'limit',
  'per',
  'concurrency',
  'lease',
  'permits',
  'refundOnFailure',
  'ifNotExists',
  'overwrite',
] as const;

/** Checks everything that can be checked without the database, before anything is written. */
export function validateThrottle(input: DefineThrottleOptions): ValidThrottle {
  const o = plainObject('throttle definition', input);
  knownKeys('throttles.define', o, DEFINE_KEYS);
  const name = identifier('name', o.name);
  const ifNotExists = boolean('ifNotExists', o.ifNotExists ?? false);
  const overwrite = boolean('overwrite', o.overwrite ?? false);
  if (ifNotExists && overwrite) throw invalid('give ifNotExists or overwrite, not both');
  const everyMs = o.every === undefined ? null : duration('every', o.every);
  const limit = o.limit === undefined ? null : safeInteger('limit', o.limit, 1, MAX_LIMIT);
  const perMs = o.per === undefined ? null : duration('per', o.per);
  if ((limit === null) !== (perMs === null)) {
    throw invalid(
      limit === null
        ? 'per needs limit: a token bucket is limit starts per period, such as { limit: 10, per: "1s" }'
        : 'limit needs per: a token bucket is limit starts per period, such as { limit: 10, per: "1s" }',
    );
  }
  const concurrency =
    o.concurrency === undefined ? null : safeInteger('concurrency', o.concurrency, 1, MAX_LIMIT);
  if (everyMs === null && limit === null && concurrency === null) {
    throw invalid(
      `the throttle '${name}' needs at least one policy: every (one start per interval), limit with per (a token bucket) or concurrency`,
    );
  }
  const permits = boolean('permits', o.permits ?? true);
  const refundOnFailure = boolean('refundOnFailure', o.refundOnFailure ?? false);
  if (!permits) {
    const needsPermits = [
      concurrency !== null && 'concurrency',
      o.lease !== undefined && 'lease',
      refundOnFailure && 'refundOnFailure',
    ].filter(Boolean);
    if (needsPermits.length > 0)
      throw invalid(
        `the throttle '${name}' grants no permits (permits: false), so it takes every and limit with per only, not ${needsPermits.join(' or ')}: these need a permit that lives until its task ends`,
      );
  }
  return {
    name,
    everyMs,
    limit,
    perMs,
    concurrency,
    permits,
    leaseMs: !permits ? null : o.lease === undefined ? DEFAULT_LEASE_MS : duration('lease', o.lease),
    refundOnFailure,
    mode: overwrite ? 'overwrite' : ifNotExists ? 'if_not_exists' : 'create',
  };
}

/** A positive duration: text such as '2s' or '1m30s', or whole milliseconds; at most a year. */
function duration(what: string, value: unknown): number {
  return durationOption(what, value, 1, MAX_DURATION_MS);
}

export function toThrottleDefinition(row: Record<string, any>): ThrottleDefinition {
  const n = (v: unknown) => (v === null || v === undefined ? null : Number(v));
  return {
    name: row.name,
    everyMs: n(row.every_ms),
    limit: n(row.rate_limit),
    perMs: n(row.per_ms),
    concurrency: n(row.concurrency),
    permits: row.lease_ms !== null,
    leaseMs: row.lease_ms === null ? null : Number(row.lease_ms),
    refundOnFailure: row.refund_on_failure,
    pausedUntil: row.paused_until ? new Date(row.paused_until) : null,
    createdAt: new Date(row.created_at),
    updatedAt: new Date(row.updated_at),
  };
}
