// Child process for the embedded tests: starts ordo on an embedded PostgreSQL, prints the
// server's URL and a value, then waits for a signal.
import { createOrdo } from '../../src/index.js';

const [dataDir] = process.argv.slice(2);
const ordo = await createOrdo({ embedded: { dataDir: dataDir! }, poolSize: 1 });
await ordo.sequences.define({ name: 'child', ifNotExists: true });
const value = await ordo.nextval('child');
process.stdout.write(`ready ${value}\n`);
setInterval(() => undefined, 60_000);
