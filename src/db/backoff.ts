/**
 * The one back-off of ordo: range reservations, reconnections, statements that never reached
 * the server, and outbox deliveries that failed (with the subscription's retryDelay and
 * maxRetryDelay as its bounds).
 */
export const BACKOFF_BASE_MS = 10;
export const BACKOFF_CAP_MS = 1000;

export interface BackoffBounds {
  /** The ceiling of the first wait (attempt 0); it doubles with each attempt. */
  base: number;
  /** The ceiling never grows past this. */
  cap: number;
}

/**
 * Exponential back-off with full jitter: a random delay in [0, min(cap, base · 2^attempt)].
 * Full jitter spreads the retries of many callers that failed together (a restart) best.
 */
export function backoffDelay(
  attempt: number,
  random: () => number = Math.random,
  { base, cap }: BackoffBounds = { base: BACKOFF_BASE_MS, cap: BACKOFF_CAP_MS },
): number {
  return random() * Math.min(cap, base * 2 ** attempt);
}
