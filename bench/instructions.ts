import { spawn } from 'node:child_process';
import { createReadStream } from 'node:fs';
import { chmod, chown, copyFile, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { embeddedPostgres, startEmbedded } from '../src/db/embedded.js';
import { createOrdo } from '../src/index.js';
import { outboxPlans } from '../src/outbox/plans.js';
import { sequencePlans } from '../src/sequences/plans.js';
import { COUNTERS_DDL, UPSERT, workTable } from './gapless.js';
import { inline } from './harness.js';
import { PAYLOAD, PLAIN_APPEND, PLAIN_DDL } from './outbox.js';

/**
 * Instructions per operation, counted by callgrind: a measure of a change to ordo's SQL that
 * does not move with other work on the machine, as a wall-clock A/B on shared cores does: the
 * count repeats from run to run. An embedded PostgreSQL is made, migrated and warmed,
 * then stopped and run single-user under valgrind twice per scenario, with 50 and with 150
 * iterations of one statement (each its own transaction); the difference over 100 iterations
 * is the cost of one. Needs valgrind (Debian: apt-get install valgrind).
 *
 *   npx tsx bench/instructions.ts [scenario …]   (default: throttle:16 throttle:1 append:1 append:10 take)
 *   PG_BIN=/usr/lib/postgresql/15/bin npx tsx bench/instructions.ts …   (that PostgreSQL's programs)
 *   EXTRA_SQL='CREATE OR REPLACE FUNCTION …' npx tsx bench/instructions.ts …   (run after the set-up:
 *     an A/B of a change to one of ordo's functions without a migration)
 *   KEEP_CALLGRIND=/some/dir npx tsx bench/instructions.ts …   (callgrind's files kept there, for
 *     callgrind_annotate: where a statement's instructions go)
 *
 * throttle:N  N acquires on random keys of 1,000 through throttle_batch (the statement the
 *             library's batcher sends), then the completions of the permits granted; a rate
 *             limit only (no concurrency, so no count of live permits)
 * throttle-hot:N  the same, every acquire on one key
 * plain:N, plain-hot:N  the same on a throttle defined with permits: false (no completions:
 *             they make no statement)
 * append:N    append_answer of N messages (what outbox.append() sends), beside the INSERT of
 *             the outbox bench's plain table
 * take        take_value() of one counter, beside the bench's hand-written upsert
 * attach      an INSERT of one row into a table numbered at commit (sequences.attach()), beside
 *             the same INSERT into a table with no number: the difference is numbering at commit
 * attach:N    the same with one INSERT … SELECT of N rows: what a bulk insert costs its commit
 */
/**
 * Each statement as the library (or the bench it is compared with) sends it, and what
 * single-user mode prints for each row it answers; `rows`: how many rows one statement answers.
 */
type Statement = { text: string; answer: RegExp; rows?: number };
type Scenario = { name: string; statements: Record<string, Statement> };
/** A statement that answers count(*) of the rows it made. */
const counted = (text: string, n: number): Statement => ({ text, answer: new RegExp(`count = "${n}"`, 'g') });

/** `n` acquires of throttle t on the keys `keys` (an SQL text[]), then the completions of their permits. */
const throttleBatch = (n: number, keys: string) =>
  `SELECT count(*) FROM ordo.throttle_batch((SELECT array_agg(b.permit_id) FROM ordo.throttle_batch('{}'::uuid[],
     (SELECT array_agg(i) FROM generate_series(1, ${n}) AS i), array_fill('t'::text, ARRAY[${n}]), ${keys},
     array_fill(1, ARRAY[${n}]), array_fill(NULL::text, ARRAY[${n}])) AS b), '{}', '{}', '{}', '{}', '{}')`;

/** `n` acquires of throttle p, which has no permits (nothing to complete), on the keys `keys`. */
const plainBatch = (n: number, keys: string) =>
  `SELECT count(*) FROM ordo.throttle_batch('{}'::uuid[], (SELECT array_agg(i) FROM generate_series(1, ${n}) AS i),
     array_fill('p'::text, ARRAY[${n}]), ${keys}, array_fill(1, ARRAY[${n}]), array_fill(NULL::text, ARRAY[${n}]))`;

const keysOf = (n: number, hot: boolean) =>
  hot
    ? `array_fill('hot'::text, ARRAY[${n}])`
    : `(SELECT array_agg('k' || floor(random() * 1000)::int) FROM generate_series(1, ${n}))`;

const plain = (n: number, hot: boolean): Scenario => ({
  name: `plain${hot ? '-hot' : ''}:${n}`,
  statements: { [`${n} acquires without permits`]: counted(plainBatch(n, keysOf(n, hot)), n) },
});

const throttle = (n: number, hot: boolean): Scenario => ({
  name: `throttle${hot ? '-hot' : ''}:${n}`,
  statements: {
    [`${n} acquires + completes`]: counted(throttleBatch(n, keysOf(n, hot)), n),
  },
});

// The statements as outbox.append() and sequences.next({ tx }) send them, and as the benches
// they are compared with do.
const plans = { outbox: outboxPlans('ordo'), sequences: sequencePlans('ordo') };

const append = (n: number): Scenario => {
  const column = (value: string, type: string) => `array_fill(${value}::${type}, ARRAY[${n}])`;
  const data = column(`'${JSON.stringify(PAYLOAD)}'`, 'jsonb');
  const keys = `(SELECT array_agg('order-' || floor(random() * 1000000)::int) FROM generate_series(1, ${n}))`;
  const types = column(`'OrderPlaced'`, 'text');
  return {
    name: `append:${n}`,
    statements: {
      [`append_answer of ${n}`]: {
        text: inline(plans.outbox.append, [
          `'t'`,
          types,
          data,
          keys,
          column('NULL', 'text'),
          column('NULL', 'jsonb'),
        ]),
        answer: /answer = "\{\d+/g,
      },
      [`plain INSERT of ${n}`]: {
        text: inline(PLAIN_APPEND, [`'t'`, types, keys, data]),
        answer: /position = "\d+"/g,
        rows: n,
      },
    },
  };
};

const take: Scenario = {
  name: 'take',
  statements: {
    'take_value()': {
      text: inline(plans.sequences.takeValue, [`'daily'`, `'hot'`, 'NULL']),
      answer: /issued = "\{\d+,/g,
    },
    upsert: { text: inline(UPSERT, [`'hot'`]), answer: /value = "\d+"/g },
  },
};

/** An INSERT of one row (VALUES), or of `n` rows (one INSERT … SELECT), counting the rows made. */
const insertInto = (table: string, n?: number) =>
  counted(
    `WITH i AS (INSERT INTO ${table} (number, payload) ${
      n === undefined ? `VALUES (NULL, 'x')` : `SELECT NULL, 'x' FROM generate_series(1, ${n})`
    } RETURNING id) SELECT count(*) FROM i`,
    n ?? 1,
  );
const attach = (n?: number): Scenario => ({
  name: n === undefined ? 'attach' : `attach:${n}`,
  statements: {
    [n === undefined ? 'INSERT, numbered at commit' : `INSERT of ${n}, numbered at commit`]: insertInto(
      'numbered',
      n,
    ),
    [n === undefined ? 'INSERT, no number' : `INSERT of ${n}, no number`]: insertInto('unnumbered', n),
  },
});

function scenario(spec: string): Scenario {
  const [kind, size] = spec.split(':');
  const n = Number(size ?? 1);
  if (!Number.isInteger(n) || n < 1 || n > 1000)
    throw new Error(`${spec}: a size is a whole number from 1 to 1000`);
  if (kind === 'throttle' || kind === 'throttle-hot') return throttle(n, kind === 'throttle-hot');
  if (kind === 'plain' || kind === 'plain-hot') return plain(n, kind === 'plain-hot');
  if (kind === 'append') return append(n);
  if (kind === 'take' && size === undefined) return take;
  if (kind === 'attach') return attach(size === undefined ? undefined : n);
  throw new Error(
    `${spec}: a scenario is throttle:N, throttle-hot:N, plain:N, plain-hot:N, append:N, take, attach or attach:N`,
  );
}

let scenarios: Scenario[];
try {
  const specs = process.argv.slice(2);
  scenarios = (specs.length > 0 ? specs : ['throttle:16', 'throttle:1', 'append:1', 'append:10', 'take']).map(
    scenario,
  );
} catch (e) {
  console.error((e as Error).message);
  process.exit(2);
}

const dir = await mkdtemp(join(tmpdir(), 'ordo-instructions-'));
await chmod(dir, 0o755);
const dataDir = join(dir, 'pg');
try {
  const server = await startEmbedded(dataDir, process.env.PG_BIN);
  const ordo = await createOrdo({ databaseUrl: server.url });
  await ordo.throttles.define({ name: 't', limit: 1_000_000, per: '1s', lease: '1h' });
  await ordo.throttles.define({ name: 'p', limit: 1_000_000, per: '1s', permits: false });
  await ordo.sequences.define({ name: 'daily', reset: 'day' });
  await ordo.sequences.define({ name: 'at_commit' });
  const client = new pg.Client({ connectionString: server.url });
  await client.connect();
  await client.query(PLAIN_DDL);
  await client.query(COUNTERS_DDL);
  await client.query(`${workTable('numbered')} CREATE TABLE unnumbered (LIKE numbered INCLUDING ALL)`);
  await ordo.sequences.attach('at_commit', { table: 'numbered', column: 'number' });
  if (process.env.EXTRA_SQL) await client.query(process.env.EXTRA_SQL);
  await client.query('SELECT setseed(0.25)');
  // Every key of the throttle used once, so that no count depends on which keys its draws met
  // first; then plans and tables as a running system has them.
  await client.query(throttleBatch(1000, `(SELECT array_agg('k' || i) FROM generate_series(0, 999) AS i)`));
  await client.query(plainBatch(1000, `(SELECT array_agg('k' || i) FROM generate_series(0, 999) AS i)`));
  for (let i = 0; i < 300; i++) {
    for (const s of scenarios) for (const { text } of Object.values(s.statements)) await client.query(text);
  }
  await client.query('VACUUM ANALYZE');
  await client.end();
  await ordo.close();
  await server.stop();

  const { postgres, runAs } = await embeddedPostgres(process.env.PG_BIN);
  // callgrind writes its counts here, as the user the server runs as.
  if (runAs.uid !== undefined) await chown(dir, runAs.uid, runAs.gid!);
  let runs = 0;
  const run = async ({ text, answer, rows = 1 }: Statement, iterations: number): Promise<number> => {
    const script = join(dir, `run-${++runs}.sql`);
    // Single-user mode (-j): statements end with a semicolon and an empty line.
    await writeFile(
      script,
      `SELECT setseed(0.5);\n\n${`${text.replaceAll('\n', ' ')};\n\n`.repeat(iterations)}`,
    );
    const out = join(dir, `callgrind-${runs}.out`);
    const { stdout, stderr } = await new Promise<{ stdout: string; stderr: string }>((resolve, reject) => {
      const child = spawn(
        'valgrind',
        [
          '--tool=callgrind',
          `--callgrind-out-file=${out}`,
          postgres,
          '--single',
          '-j',
          '-D',
          dataDir,
          'postgres',
        ],
        { ...runAs, stdio: ['pipe', 'pipe', 'pipe'] },
      );
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (d) => (stdout += d));
      child.stderr.on('data', (d) => (stderr += d));
      child.on('error', (e) =>
        reject(new Error(`valgrind could not be run (${e.message}): apt-get install valgrind`)),
      );
      // 'close': once its output has been read to the end, not only when it exited.
      child.on('close', () => resolve({ stdout, stderr }));
      createReadStream(script).pipe(child.stdin);
    });
    // Every statement answers; none may fail.
    const answered = (stdout.match(answer) ?? []).length / rows;
    if (answered !== iterations || /ERROR/.test(stdout + stderr)) {
      throw new Error(`${answered} of ${iterations} statements answered:\n${(stdout + stderr).slice(-2000)}`);
    }
    if (process.env.KEEP_CALLGRIND)
      await copyFile(out, join(process.env.KEEP_CALLGRIND, `${runs}-${iterations}.out`));
    const collected = /Collected\s*:\s*([\d,]+)/.exec(stderr);
    if (!collected) throw new Error(`callgrind printed no count:\n${stderr.slice(-2000)}`);
    return Number(collected[1]!.replaceAll(',', ''));
  };
  console.log('instructions per statement (its own transaction), one backend, PostgreSQL single-user:');
  for (const s of scenarios) {
    const counts: number[] = [];
    for (const [label, statement] of Object.entries(s.statements)) {
      const per = ((await run(statement, 150)) - (await run(statement, 50))) / 100;
      counts.push(per);
      console.log(
        `  ${s.name.padEnd(12)} ${label.padEnd(26)} ${Math.round(per).toLocaleString('en').padStart(12)}`,
      );
    }
    if (counts.length === 2)
      console.log(
        `  ${''.padEnd(12)} ${'ratio'.padEnd(26)} ${(counts[0]! / counts[1]!).toFixed(3).padStart(12)}`,
      );
  }
} finally {
  await rm(dir, { recursive: true, force: true });
}
