import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { createOrdo } from '../src/index.js';
import { outboxPlans } from '../src/outbox/plans.js';
import { sequencePlans } from '../src/sequences/plans.js';
import { withScratchDatabase } from './cpu.js';
import { COUNTERS_DDL, UPSERT } from './gapless.js';
import { inline } from './harness.js';
import { PAYLOAD, PLAIN_APPEND, PLAIN_DDL } from './outbox.js';

/**
 * ordo's SQL against the hand-written statements the benches compare it with, driven by
 * pgbench rather than Node: what is left of a gap when no client library runs. 16 clients,
 * one transaction per script run, the scripts alternating in rounds of 10 s; before each round
 * the tables it writes are emptied and a CHECKPOINT is taken, so that no script meets a larger
 * table than another. Needs pgbench (Debian: postgresql-client) and the server at DATABASE_URL.
 *
 *   DATABASE_URL=… npx tsx bench/pgbench.ts [append|take|take-keys …] [rounds]   (default: all, 3 rounds)
 *
 * append  BEGIN; one message; COMMIT: append_answer, a plain INSERT into the outbox bench's
 *         table, and a plain INSERT into a table laid out as ordo.messages (LIKE … INCLUDING ALL)
 * take    BEGIN; a number of one hot counter; INSERT the invoice; COMMIT: take_value, and the
 *         gapless bench's upsert
 * take-keys  the same on a counter drawn from 64 per transaction
 */
const url = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const args = process.argv.slice(2);
const rounds = Number(args.find((a) => /^\d+$/.test(a)) ?? 3);
const suites = args.filter((a) => !/^\d+$/.test(a));
if (suites.some((s) => !['append', 'take', 'take-keys'].includes(s)) || rounds < 1) {
  console.error('usage: npx tsx bench/pgbench.ts [append|take|take-keys …] [rounds]');
  process.exit(2);
}
const run = promisify(execFile);

const payload = `'${JSON.stringify(PAYLOAD)}'::jsonb`;
// One message, as outbox.append() sends it and as the outbox bench's plain INSERT does.
const [topic, types, keys, data] = [
  `'t'`,
  `ARRAY['OrderPlaced']`,
  `ARRAY['order-' || :k]`,
  `ARRAY[${payload}]`,
];
const plans = { outbox: outboxPlans('ordo'), sequences: sequencePlans('ordo') };
const plainAppend = (table: string) => `\\set k random(1, 1000000)
BEGIN;
${inline(PLAIN_APPEND.replace('bench_plain_outbox', table), [topic, types, keys, data])};
COMMIT;
`;
/**
 * BEGIN; a number of the counter of `scope` (SQL, after `prelude`); INSERT the invoice; COMMIT:
 * as sequences.next({ tx }) and the gapless bench's upsert send them.
 */
function takeSuite(scope: string, prelude = '') {
  return {
    variants: {
      take_value: `${prelude}BEGIN;
SELECT (t.issued)[1] AS number FROM (${inline(plans.sequences.takeValue, [`'daily'`, scope, 'NULL'])}) AS t \\gset
INSERT INTO bench_invoices (number) VALUES (:number);
COMMIT;
`,
      upsert: `${prelude}BEGIN;
${inline(UPSERT, [scope])} \\gset
INSERT INTO bench_invoices (number) VALUES (:value);
COMMIT;
`,
    },
    baseline: 'upsert',
    empty: 'TRUNCATE bench_invoices, bench_counters, ordo.counters',
  };
}

/** Each suite's scripts; `baseline` is the one the others are compared with. */
const scripts: Record<string, { variants: Record<string, string>; baseline: string; empty: string }> = {
  append: {
    variants: {
      append_answer: `\\set k random(1, 1000000)
BEGIN;
${inline(plans.outbox.append, [topic, types, data, keys, 'ARRAY[NULL::text]', 'ARRAY[NULL::jsonb]'])};
COMMIT;
`,
      'plain INSERT': plainAppend('bench_plain_outbox'),
      'INSERT, ordo.messages layout': plainAppend('bench_shaped_outbox'),
    },
    baseline: 'plain INSERT',
    empty: 'TRUNCATE ordo.messages, bench_plain_outbox, bench_shaped_outbox',
  },
  take: takeSuite(`'hot'`),
  'take-keys': takeSuite(`'k' || :k`, '\\set k random(0, 63)\n'),
};

const dir = await mkdtemp(join(tmpdir(), 'ordo-pgbench-'));
try {
  await withScratchDatabase('ordo_pgbench', url, async (target) => {
    const ordo = await createOrdo({ databaseUrl: target });
    await ordo.sequences.define({ name: 'daily', reset: 'day' });
    await ordo.close();
    const admin = new pg.Client({ connectionString: target });
    await admin.connect();
    await admin.query(PLAIN_DDL);
    await admin.query(COUNTERS_DDL);
    await admin.query(`CREATE TABLE bench_shaped_outbox (LIKE ordo.messages INCLUDING ALL);
      CREATE TABLE bench_invoices (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, number bigint NOT NULL)`);
    const u = new URL(target);
    const connection = [
      '-h',
      u.hostname,
      '-p',
      u.port || '5432',
      '-U',
      decodeURIComponent(u.username || 'postgres'),
    ];
    const env = { ...process.env, PGPASSWORD: decodeURIComponent(u.password) };
    const database = u.pathname.slice(1);
    for (const name of suites.length > 0 ? suites : Object.keys(scripts)) {
      const suite = scripts[name]!;
      const tps = new Map<string, number[]>();
      for (let r = 0; r < rounds; r++) {
        for (const [variant, script] of Object.entries(suite.variants)) {
          await admin.query(suite.empty);
          await admin.query('CHECKPOINT');
          const file = join(dir, `${name}-${Object.keys(suite.variants).indexOf(variant)}.sql`);
          await writeFile(file, script);
          const { stdout } = await run(
            'pgbench',
            [...connection, '-n', '-c', '16', '-j', '2', '-T', '10', '-f', file, database],
            { env },
          ).catch((e: { stderr?: string; message: string }) => {
            throw new Error(`pgbench failed (apt-get install postgresql-client): ${e.stderr ?? e.message}`);
          });
          const t = /tps = ([\d.]+)/.exec(stdout);
          if (!t || /aborted|failed transactions: [1-9]/.test(stdout)) throw new Error(`pgbench: ${stdout}`);
          tps.set(variant, [...(tps.get(variant) ?? []), Number(t[1])]);
        }
      }
      const base = tps.get(suite.baseline)!;
      console.log(
        `${name}: 16 clients, ${rounds} rounds of 10 s; tps per round (× ${suite.baseline} in that round)`,
      );
      for (const [variant, values] of tps) {
        const cells = values.map((x, i) => `${Math.round(x)} (${(x / base[i]!).toFixed(2)}×)`);
        console.log(`  ${variant.padEnd(30)} ${cells.join('  ')}`);
      }
    }
    await admin.end();
  });
} finally {
  await rm(dir, { recursive: true, force: true });
}
