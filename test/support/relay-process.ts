// Child process running one relay, for tests that kill a relay with SIGKILL mid-run. Usage:
//
//   node --import tsx test/support/relay-process.ts <databaseUrl> <relay options as JSON> [wait]
//
// Prints `ready` once the relay started (its subscription created, its client loaded), then
// `delivered <n>` each time the count of messages the broker confirmed grows (looked at every
// 10 ms), and `error <message>` for each failure the relay meets. With `wait`, it prints `loaded`
// once connected and starts the relay only on a line `go` on stdin: a test starts the process
// ahead of time, and the relay at the moment it chooses. On SIGTERM it stops the relay, which
// finishes the batches in flight, prints `done stopped` and exits 0; a relay that ends by itself
// (onExhausted 'stop') prints `done <reason>` and exits 1.
import { createInterface } from 'node:readline';
import { createOrdo, type RelayOptions } from '../../src/index.js';

const [url, json, wait] = process.argv.slice(2);
const options = JSON.parse(json!) as RelayOptions;

let starting = false;
let stopping = false;
let stop = (): void => {
  // Before the relay starts there is nothing in flight.
  if (!starting) process.exit(0);
};
process.on('SIGTERM', () => {
  stopping = true;
  stop();
});

const ordo = await createOrdo({ databaseUrl: url! });
if (wait === 'wait') {
  const lines = createInterface({ input: process.stdin });
  const go = new Promise<void>((resolve) => lines.on('line', (line) => line.trim() === 'go' && resolve()));
  process.stdout.write('loaded\n');
  await go;
  lines.close();
}

starting = true;
const running = await ordo.outbox.relay({
  ...options,
  onError: (e) => process.stdout.write(`error ${e.message.replace(/\n/g, ' ')}\n`),
});
stop = () => void running.stop();
let told = 0;
const progress = setInterval(() => {
  const { delivered } = running.state();
  if (delivered > told) {
    told = delivered;
    process.stdout.write(`delivered ${delivered}\n`);
  }
}, 10);
// A SIGTERM that came while the relay was starting.
if (stopping) stop();
process.stdout.write('ready\n');

const end = await running.done;
clearInterval(progress);
process.stdout.write(`done ${end.reason}${end.error ? ` ${end.error.message.replace(/\n/g, ' ')}` : ''}\n`);
await ordo.close();
process.exit(stopping && end.reason === 'stopped' ? 0 : 1);
