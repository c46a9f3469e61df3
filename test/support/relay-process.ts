// Child process running one relay, for tests that kill a relay with SIGKILL mid-run. Usage:
//
//   node --import tsx test/support/relay-process.ts <databaseUrl> <relay options as JSON>
//
// Prints `ready` once the relay started (its subscription created, its client loaded), then
// `delivered <n>` each time the count of messages the broker confirmed grows (looked at every
// 10 ms), and `error <message>` for each failure the relay meets. On SIGTERM it stops the relay,
// which finishes the batches in flight, prints `done stopped` and exits 0; a relay that ends by
// itself (onExhausted 'stop') prints `done <reason>` and exits 1.
import { createOrdo, type RelayOptions } from '../../src/index.js';

const [url, json] = process.argv.slice(2);
const options = JSON.parse(json!) as RelayOptions;

const ordo = await createOrdo({ databaseUrl: url! });
const relay = await ordo.outbox.relay({
  ...options,
  onError: (e) => process.stdout.write(`error ${e.message.replace(/\n/g, ' ')}\n`),
});

let told = 0;
const progress = setInterval(() => {
  const { delivered } = relay.state();
  if (delivered > told) {
    told = delivered;
    process.stdout.write(`delivered ${delivered}\n`);
  }
}, 10);

let stopping = false;
process.once('SIGTERM', () => {
  stopping = true;
  void relay.stop();
});
process.stdout.write('ready\n');

const end = await relay.done;
clearInterval(progress);
process.stdout.write(`done ${end.reason}${end.error ? ` ${end.error.message.replace(/\n/g, ' ')}` : ''}\n`);
await ordo.close();
process.exit(stopping && end.reason === 'stopped' ? 0 : 1);
