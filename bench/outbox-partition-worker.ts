import { setTimeout as sleep } from 'node:timers/promises';
import { createOrdo, type OutboxMessage } from '../src/index.js';

/**
 * One instance of the outbox suite's partitions scenario, in a process of its own:
 *   node --import tsx bench/outbox-partition-worker.ts URL TOPIC PARTITIONS SLOW_MS
 * It subscribes to the subscription TOPIC (PARTITIONS partitions, batches of 10) with a
 * handler that takes SLOW_MS per batch, sends 'ready' over IPC once subscribed, then the
 * number of messages of each batch handled; on 'stop' it stops its subscription and exits.
 */
async function main(): Promise<void> {
  const [url, topic, partitionsArg, slowArg] = process.argv.slice(2);
  const partitions = Number(partitionsArg);
  const slowMs = Number(slowArg);
  const send = process.send?.bind(process);
  if (!url || !topic || !(partitions >= 1) || !(slowMs >= 0) || !send) {
    throw new Error(
      'usage (under the outbox suite, with IPC): outbox-partition-worker.ts URL TOPIC PARTITIONS SLOW_MS',
    );
  }
  const named = new URL(url);
  named.searchParams.set('application_name', 'ordo-bench-partitions');
  const ordo = await createOrdo({ databaseUrl: named.toString(), poolSize: 4 });
  const stopped = new Promise<void>((resolve) => process.once('message', () => resolve()));
  const sub = await ordo.outbox.subscribe({
    name: topic,
    topic,
    partitions,
    batchSize: 10,
    lease: '3s',
    pollInterval: '100ms',
    handler: async (batch: OutboxMessage[]) => {
      await sleep(slowMs);
      send({ handled: batch.length });
    },
  });
  send({ ready: true });
  await stopped;
  await sub.stop();
  await ordo.close();
  process.disconnect();
}

await main();
