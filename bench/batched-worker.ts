import { createOrdo } from '../src/index.js';
import { countedPool, Drain, type WorkerResult } from './batched.js';

/**
 * One node of the batched suite's multi-process scenario:
 *   node --import tsx bench/batched-worker.ts URL NAME BATCH SECONDS [WARMUP_SECONDS]
 * Its own pool and ordo instance take values of the batched sequence NAME (defined by the
 * parent with BATCH) in a tight loop. Under the suite (an IPC channel) it says 'ready' once
 * its node has taken a first value, waits for 'go', runs the warm-up and SECONDS measured,
 * and sends its result; run by hand, it starts at once and prints the result as JSON.
 */

async function main(): Promise<void> {
  const [url, name, batch, secondsArg, warmupArg] = process.argv.slice(2);
  const seconds = Number(secondsArg);
  const warmupSeconds = Number(warmupArg ?? 0);
  if (!url || !name || !batch || !(seconds > 0) || !(warmupSeconds >= 0)) {
    throw new Error('usage: batched-worker.ts URL NAME BATCH SECONDS [WARMUP_SECONDS]');
  }
  const { pool, statements } = countedPool(url, 2, 'ordo-bench-worker');
  const ordo = await createOrdo({ pool });
  try {
    statements.reserve = 0;
    statements.other = 0;
    const drain = new Drain();
    await drain.block(ordo, name);
    const send = process.send?.bind(process);
    if (send) {
      const go = new Promise<void>((resolve) => process.once('message', () => resolve()));
      send({ type: 'ready' });
      await go;
    }
    await drain.window(ordo, name, seconds, warmupSeconds);
    // Reservations still in flight are counted with their ranges.
    await ordo.sequences.idle();
    const result: WorkerResult = {
      nodeId: ordo.nodeId,
      total: drain.total,
      measured: drain.measured,
      seconds: drain.seconds,
      disorder: drain.disorder,
      ...drain.runs(),
      blockNs: drain.blockNs,
      statements: { ...statements },
      ranges: ordo.sequences.reservations.get(name) ?? 0,
    };
    if (send) {
      await new Promise<void>((resolve, reject) =>
        send({ type: 'result', result }, undefined, {}, (e: Error | null) => (e ? reject(e) : resolve())),
      );
    } else {
      console.log(
        JSON.stringify({ ...result, firsts: result.firsts.length, blockNs: result.blockNs.length }),
      );
    }
  } finally {
    await ordo.close();
    await pool.end();
  }
  process.disconnect?.();
}

main().catch((e) => {
  console.error(e);
  process.exitCode = 1;
  process.disconnect?.();
});
