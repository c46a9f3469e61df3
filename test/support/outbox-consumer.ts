// Child process consuming an outbox subscription, for the chaos test (a process killed with
// SIGKILL mid-batch). Usage:
//
//   outbox-consumer.ts <databaseUrl> <subscription> <topic> <lease> <batchSize> <delayMs> <label> [partitions]
//
// Prints `ready` once connected, then waits for `go` on stdin before subscribing. Each batch is
// written to the table `received (position, transaction_id, consumer)` through the handler's
// transaction (so exactly once, with the checkpoint), then the line
// `handling <count> <transactionId>:<position>,… <attempt>` is printed and the handler sleeps
// `delayMs` before returning: a kill after that line lands while the batch is uncommitted. On
// `stop` (or end of stdin), or when the subscription ends by itself, it prints
// `done <reason> [<error code>]` and exits 0. Consumer errors are printed as
// `error <code> <message>`.
//
// Environment: OUTBOX_CONSUMER_OPTIONS, more subscribe() options as JSON (maxAttempts,
// onExhausted, …); OUTBOX_CONSUMER_KILL_ON, a message type: a batch holding one makes the
// process SIGKILL itself once its handling line is out (a message that crashes its consumer).
import { setTimeout as sleep } from 'node:timers/promises';
import { createOrdo } from '../../src/index.js';

const [url, name, topic, lease, batchArg, delayArg, label, partitions] = process.argv.slice(2);
const delayMs = Number(delayArg ?? 0);
const options = JSON.parse(process.env.OUTBOX_CONSUMER_OPTIONS ?? '{}') as object;
const killOn = process.env.OUTBOX_CONSUMER_KILL_ON;

const ordo = await createOrdo({ databaseUrl: url!, poolSize: 4 });

let go!: () => void;
const started = new Promise<void>((resolve) => {
  go = resolve;
});
let stop!: () => void;
const stopped = new Promise<void>((resolve) => {
  stop = resolve;
});
let buffered = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (text: string) => {
  buffered += text;
  for (let i = buffered.indexOf('\n'); i >= 0; i = buffered.indexOf('\n')) {
    const command = buffered.slice(0, i).trim();
    buffered = buffered.slice(i + 1);
    if (command === 'go') go();
    if (command === 'stop') stop();
  }
});
process.stdin.on('end', () => {
  go();
  stop();
});

process.stdout.write('ready\n');
await started;

const subscription = await ordo.outbox.subscribe({
  name: name!,
  topic: topic!,
  lease: lease!,
  batchSize: Number(batchArg),
  partitions: Number(partitions ?? 1),
  pollInterval: '100ms',
  ...options,
  onError: (e) => process.stdout.write(`error ${e.code} ${e.message.replace(/\n/g, ' ')}\n`),
  handler: async (messages, { tx, attempt }) => {
    await tx.query(
      'INSERT INTO received (position, transaction_id, consumer) SELECT p, t::xid8, $3 FROM unnest($1::bigint[], $2::text[]) AS u (p, t)',
      [messages.map((m) => m.position), messages.map((m) => m.transactionId), label],
    );
    const line = `handling ${messages.length} ${messages.map((m) => `${m.transactionId}:${m.position}`).join(',')} ${attempt}\n`;
    if (messages.some((m) => m.type === killOn)) {
      process.stdout.write(line, () => process.kill(process.pid, 'SIGKILL'));
      await new Promise(() => undefined);
    }
    process.stdout.write(line);
    await sleep(delayMs);
  },
});

const end = await Promise.race([subscription.done, stopped.then(() => subscription.stop())]);
process.stdout.write(`done ${end.reason}${end.error ? ` ${end.error.code}` : ''}\n`);
await ordo.close();
process.stdin.destroy();
