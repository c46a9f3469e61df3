// Child process acting as one node of a batched sequence: its own ordo instance (own pool, own
// LISTEN connection, own node id). Usage:
//
//   batched-node.ts <databaseUrl> <sequence> <nodeId> [limit] [chunk] [pauseMs]
//
// Prints `ready` once connected, then waits for `go` on stdin. Draws values one at a time with
// ordo.nextval() and writes them in chunks, one line per chunk: `v <value>,<value>,…`. Stops
// after `limit` values, on `stop` (or end of stdin), then writes `done <count>` and exits 0.
// An error is written as `error <code> <message>` and the process exits 1.
import { setTimeout as sleep } from 'node:timers/promises';
import { createOrdo } from '../../src/index.js';

const [url, name, nodeId, limitArg, chunkArg, pauseArg] = process.argv.slice(2);
const limit = Number(limitArg ?? Number.POSITIVE_INFINITY);
const chunk = Number(chunkArg ?? 1000);
const pauseMs = Number(pauseArg ?? 0);

const ordo = await createOrdo({ databaseUrl: url!, nodeId: nodeId!, poolSize: 2 });

let go!: () => void;
const started = new Promise<void>((resolve) => {
  go = resolve;
});
let stopped = false;
let buffered = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (text: string) => {
  buffered += text;
  for (let i = buffered.indexOf('\n'); i >= 0; i = buffered.indexOf('\n')) {
    const command = buffered.slice(0, i).trim();
    buffered = buffered.slice(i + 1);
    if (command === 'go') go();
    if (command === 'stop') stopped = true;
  }
});
process.stdin.on('end', () => {
  stopped = true;
  go();
});

process.stdout.write('ready\n');
await started;

let count = 0;
try {
  while (!stopped && count < limit) {
    const values: number[] = [];
    for (let i = 0; i < chunk && count < limit; i++, count++) values.push(await ordo.nextval(name!));
    process.stdout.write(`v ${values.join(',')}\n`);
    // A macrotask between chunks: stdin, notifications and timers get their turn.
    await sleep(pauseMs);
  }
} catch (e) {
  const error = e as { code?: string; message?: string };
  process.stdout.write(`error ${error.code ?? 'unknown'} ${error.message ?? String(e)}\n`);
  process.exit(1);
}
process.stdout.write(`done ${count}\n`);
await ordo.close();
process.stdin.destroy();
