import { describe, invalid, MAX_VALUE, safeInteger } from './validate.js';

/** Units as SurrealDB writes them, largest first, in nanoseconds. `y` is 365 days. */
const NANOS: Record<string, bigint> = {
  y: 365n * 86_400_000_000_000n,
  w: 7n * 86_400_000_000_000n,
  d: 86_400_000_000_000n,
  h: 3_600_000_000_000n,
  m: 60_000_000_000n,
  s: 1_000_000_000n,
  ms: 1_000_000n,
  us: 1_000n,
  µs: 1_000n, // U+00B5 MICRO SIGN
  μs: 1_000n, // U+03BC GREEK SMALL LETTER MU
  ns: 1n,
};

/** Units formatDuration prints, in milliseconds. */
const MILLIS: readonly [string, number][] = [
  ['y', 365 * 86_400_000],
  ['w', 7 * 86_400_000],
  ['d', 86_400_000],
  ['h', 3_600_000],
  ['m', 60_000],
  ['s', 1_000],
  ['ms', 1],
];

// `ms` before `m`, `µs`/`us`/`ns` before `s`: the longest unit wins.
const PART = /(\d+)(ns|us|µs|μs|ms|s|m|h|d|w|y)/g;
const DURATION = /^(?:\d+(?:ns|us|µs|μs|ms|s|m|h|d|w|y))+$/;

/** The longest duration text read ('1y2w3d4h5m6s7ms8us9ns' is 21 characters). */
export const MAX_DURATION_TEXT = 64;

/**
 * Milliseconds in a SurrealDB duration such as `5s`, `100ms`, `1m30s`, `1y` or `500us`.
 * Parts are summed; a total that is not a whole number of milliseconds is rounded up, so
 * only zero reads as zero (`500us` → 1, `0ns` → 0).
 */
export function parseDuration(text: string): number {
  if (typeof text !== 'string' || text.length > MAX_DURATION_TEXT || !DURATION.test(text)) {
    throw invalid(
      `duration must be whole numbers each followed by a unit (y, w, d, h, m, s, ms, us, ns), such as 5s, 100ms or 1m30s (got ${describe(text)})`,
    );
  }
  let nanos = 0n;
  for (const [, amount, unit] of text.matchAll(PART)) nanos += BigInt(amount!) * NANOS[unit!]!;
  const millis = (nanos + 999_999n) / 1_000_000n;
  if (millis > BigInt(MAX_VALUE)) {
    throw invalid(`duration must be at most ${formatDuration(MAX_VALUE)} (got ${describe(text)})`);
  }
  return Number(millis);
}

/**
 * The canonical text of a number of milliseconds: largest units first, each at most once,
 * none that is zero (`90000` → `1m30s`, `1500` → `1s500ms`, `0` → `0s`).
 */
export function formatDuration(ms: number): string {
  let rest = safeInteger('duration in milliseconds', ms, 0);
  if (rest === 0) return '0s';
  let text = '';
  for (const [unit, size] of MILLIS) {
    if (rest >= size) {
      text += `${Math.floor(rest / size)}${unit}`;
      rest %= size;
    }
  }
  return text;
}

/**
 * A duration option given as milliseconds or as SurrealDB text ('30s'), within [min, max]:
 * the one reader of such options, so every module words the error alike.
 */
export function durationOption(what: string, value: unknown, min: number, max: number): number {
  let ms: unknown = value;
  if (typeof value === 'string') {
    try {
      ms = parseDuration(value);
    } catch {
      ms = undefined;
    }
  }
  if (typeof ms !== 'number' || !Number.isSafeInteger(ms) || ms < min || ms > max) {
    throw invalid(
      `${what} must be a duration from ${formatDuration(min)} to ${formatDuration(max)}, such as '2s', '1m' or '500ms', or a whole number of milliseconds (got ${describe(value)})`,
    );
  }
  return ms;
}
