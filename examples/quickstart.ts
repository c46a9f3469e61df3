// The README's runnable sample (`npm run example`): DATABASE_URL when set, else an embedded
// PostgreSQL kept in ./.ordo/pg.
import { envDatabaseUrl } from '../src/config.js';
import { createOrdo } from '../src/index.js';

const ordo = await createOrdo(envDatabaseUrl() ? {} : { embedded: true });

// Invoice numbers: no gaps, per tenant, restarting every 1 January in Paris.
await ordo.sequences.define({
  name: 'invoice',
  reset: 'year',
  timeZone: 'Europe/Paris',
  format: 'INV-{YYYY}-{n:6}',
  ifNotExists: true,
});

// Ticket numbers that never reset, usable from SQL too, as a column default:
//   CREATE TABLE tickets (id bigint PRIMARY KEY DEFAULT ordo.nextval('ticket'), title text);
await ordo.sequences.define({ name: 'ticket', ifNotExists: true });

// Inside your transaction: a rollback gives the number back.
const draft = await ordo
  .transaction(async (tx) => {
    const issued = await ordo.sequences.next('invoice', { scope: 'acme', tx });
    throw Object.assign(new Error('payment declined'), { issued });
  })
  .catch((e) => e.issued);
const kept = await ordo.transaction(async (tx) => {
  const issued = await ordo.sequences.next('invoice', { scope: 'acme', tx });
  // await tx.query('INSERT INTO invoices (number, …) VALUES ($1, …)', [issued.text, …]);
  return issued;
});
console.log(`rolled back ${draft.text}, then issued ${kept.text}: the same number, no gap`);

// Standalone calls arriving together share one statement and still get one number each.
const burst = await Promise.all(
  Array.from({ length: 5 }, () => ordo.sequences.next('invoice', { scope: 'globex' })),
);
console.log('globex:', burst.map((i) => i.text).join(', '));

// The year restarts at local midnight in Paris: 23:00 UTC on 31 December.
const newYear = await ordo.sequences.next('invoice', { scope: 'acme', at: '2030-12-31T23:00:00Z' });
console.log(`first invoice of 2031 for acme: ${newYear.text} (period ${newYear.period})`);

await ordo.close();
