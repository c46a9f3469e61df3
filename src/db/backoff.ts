/** The one back-off of ordo: reservations, reconnections and statements that never reached the server. */
export const BACKOFF_BASE_MS = 10;
export const BACKOFF_CAP_MS = 1000;

/** Exponential back-off with full jitter: a random delay in [0, min(cap, base · 2^attempt)]. */
export function backoffDelay(attempt: number, random: () => number = Math.random): number {
  return random() * Math.min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2 ** attempt);
}
