import { setTimeout as sleep } from 'node:timers/promises';

/** Polls `check` every 20 ms until it holds; throws naming `what` after `ms`. */
export async function until(
  what: string,
  check: () => boolean | Promise<boolean>,
  ms = 10_000,
): Promise<void> {
  const end = performance.now() + ms;
  while (!(await check())) {
    if (performance.now() > end) throw new Error(`not within ${ms} ms: ${what}`);
    await sleep(20);
  }
}
