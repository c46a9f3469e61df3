// Child process for the "killed mid-way" test: takes a number inside a transaction, says
// which, and waits to be killed with the transaction still open.
import pg from 'pg';
import { createOrdo } from '../../src/index.js';

const [url, name] = process.argv.slice(2);
const ordo = await createOrdo({ databaseUrl: url!, poolSize: 1 });
const client = new pg.Client({ connectionString: url });
await client.connect();
await client.query('BEGIN');
const { value } = await ordo.sequences.next(name!, { tx: client });
process.stdout.write(`taken ${value}\n`);
setInterval(() => undefined, 60_000);
