// Child process for the embedded tests: starts ordo on an embedded PostgreSQL, prints a value,
// then behaves as `mode` says.
import { createOrdo } from '../../src/index.js';

const [dataDir, mode = 'wait'] = process.argv.slice(2);
const ordo = await createOrdo({ embedded: { dataDir: dataDir! }, poolSize: 1 });
await ordo.sequences.define({ name: 'child', ifNotExists: true });
const value = await ordo.nextval('child');

if (mode === 'own-handler') {
  // An application that shuts down gracefully itself: ordo must keep working until close().
  process.once('SIGTERM', async () => {
    const after = await ordo.nextval('child');
    process.stdout.write(`after-signal ${after}\n`);
    await ordo.close();
    process.exitCode = 0;
  });
}
process.stdout.write(`ready ${value}\n`);
if (mode === 'exit-without-close') process.exit(3);
if (mode === 'exit-code') {
  await ordo.close();
  process.exitCode = 7;
} else {
  setInterval(() => undefined, 60_000).unref();
  // Keep the process alive until a signal arrives.
  await new Promise((resolve) => process.once('SIGUSR2', resolve));
}
