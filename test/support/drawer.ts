// Values drawn by an ordo client in a loop, and checks over them: shared by the tests of
// batched sequences (directly and through a pooler).
import { setTimeout as sleep } from 'node:timers/promises';
import type { Ordo } from '../../src/index.js';

export const maxOf = (...lists: number[][]) =>
  lists.reduce((m, list) => list.reduce((a, b) => Math.max(a, b), m), Number.NEGATIVE_INFINITY);
export const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

export function duplicates(...lists: number[][]): number[] {
  const seen = new Set<number>();
  const dup: number[] = [];
  for (const list of lists)
    for (const v of list) {
      if (seen.has(v)) dup.push(v);
      seen.add(v);
    }
  return dup;
}

export interface Drawer {
  values: number[];
  /** When each value was drawn (performance.now()), same index as values. */
  times: number[];
  error: unknown;
  stoppedAt: number | undefined;
  stop(): Promise<void>;
  done: Promise<void>;
}

/**
 * Draws from `name` in a loop until stopped, an error, or `limit` values. Pauses `pauseMs`
 * every `every` values: a node holds its ranges for a while, and its event loop turns (as
 * any real application's does) so notifications and timers are seen.
 */
export function drawer(
  o: Ordo,
  name: string,
  pace: { every?: number; pauseMs?: number; limit?: number } = {},
): Drawer {
  const { every = 100, pauseMs = 1, limit = Number.POSITIVE_INFINITY } = pace;
  let stopping = false;
  const d: Drawer = {
    values: [],
    times: [],
    error: undefined,
    stoppedAt: undefined,
    stop: async () => {
      stopping = true;
      await d.done;
    },
    done: Promise.resolve(),
  };
  d.done = (async () => {
    while (!stopping && d.values.length < limit) {
      try {
        d.values.push(await o.nextval(name));
        d.times.push(performance.now());
      } catch (e) {
        d.error = e;
        d.stoppedAt = performance.now();
        return;
      }
      if (d.values.length % every === 0) await sleep(pauseMs);
    }
  })();
  return d;
}
