import { spawn } from 'node:child_process';
import { createReadStream } from 'node:fs';
import { chmod, chown, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { embeddedPostgres, startEmbedded } from '../src/db/embedded.js';
import { createOrdo } from '../src/index.js';

/**
 * Instructions per throttle decision, counted by callgrind: a measure of a change to the
 * decision's SQL that does not move with other work on the machine (a wall-clock A/B on 2
 * shared cores cannot see 10%; this count repeats to within 0.1%). An embedded PostgreSQL is
 * made, migrated and warmed (1,000 keys, each used), then stopped and run single-user under
 * valgrind twice, with 50 and with 150 iterations of one statement: `batch` acquires through
 * throttle_batch (the statement the library's batcher sends), then the completions of the
 * permits granted; the difference over 100 iterations is the cost of one. Needs valgrind
 * (Debian: apt-get install valgrind).
 *
 *   npx tsx bench/throttle-instructions.ts [batch …]   (default: 16 1)
 */
const batches = process.argv.slice(2).map(Number);
const sizes = batches.length > 0 ? batches : [16, 1];
if (sizes.some((n) => !Number.isInteger(n) || n < 1 || n > 1000)) {
  console.error('each batch size is a whole number from 1 to 1000');
  process.exit(2);
}

/** One iteration: `n` acquires on random keys of 1,000, then their completions. */
const iteration = (n: number) =>
  `SELECT count(*) FROM ordo.throttle_batch((SELECT array_agg(b.permit_id) FROM ordo.throttle_batch('{}'::uuid[],
     (SELECT array_agg(i) FROM generate_series(1, ${n}) AS i), array_fill('t'::text, ARRAY[${n}]),
     (SELECT array_agg('k' || floor(random() * 1000)::int) FROM generate_series(1, ${n})),
     array_fill(1, ARRAY[${n}]), array_fill(NULL::text, ARRAY[${n}])) AS b), '{}', '{}', '{}', '{}', '{}');`;

const dir = await mkdtemp(join(tmpdir(), 'ordo-instructions-'));
await chmod(dir, 0o755);
const dataDir = join(dir, 'pg');
try {
  const server = await startEmbedded(dataDir);
  const ordo = await createOrdo({ databaseUrl: server.url });
  await ordo.throttles.define({ name: 't', limit: 1_000_000, per: '1s', lease: '1h' });
  const client = new pg.Client({ connectionString: server.url });
  await client.connect();
  await client.query('SELECT setseed(0.25)');
  for (let i = 0; i < 300; i++) await client.query(iteration(16));
  await client.query('VACUUM ANALYZE');
  await client.end();
  await ordo.close();
  await server.stop();

  const { postgres, runAs } = await embeddedPostgres();
  // callgrind writes its counts here, as the user the server runs as.
  if (runAs.uid !== undefined) await chown(dir, runAs.uid, runAs.gid!);
  const run = async (n: number, iterations: number): Promise<number> => {
    const script = join(dir, `run-${n}-${iterations}.sql`);
    // Single-user mode (-j): statements end with a semicolon and an empty line.
    await writeFile(
      script,
      `SELECT setseed(0.5);\n\n${`${iteration(n).replaceAll('\n', ' ')}\n\n`.repeat(iterations)}`,
    );
    const out = join(dir, `callgrind-${n}-${iterations}.out`);
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
      child.on('exit', () => resolve({ stdout, stderr }));
      createReadStream(script).pipe(child.stdin);
    });
    const done = (stdout.match(new RegExp(`count = "${n}"`, 'g')) ?? []).length;
    if (done !== iterations || /ERROR/.test(stdout + stderr)) {
      throw new Error(
        `${done} of ${iterations} iterations of ${n} answered:\n${(stdout + stderr).slice(-2000)}`,
      );
    }
    const collected = /Collected\s*:\s*([\d,]+)/.exec(stderr);
    if (!collected) throw new Error(`callgrind printed no count:\n${stderr.slice(-2000)}`);
    return Number(collected[1]!.replaceAll(',', ''));
  };
  console.log('instructions per iteration (acquires on 1,000 keys, then their completions), one backend:');
  for (const n of sizes) {
    const per = ((await run(n, 150)) - (await run(n, 50))) / 100;
    console.log(
      `  ${String(n).padStart(4)} acquires + completes: ${Math.round(per).toLocaleString('en')} (${Math.round(per / n).toLocaleString('en')} per pair)`,
    );
  }
} finally {
  await rm(dir, { recursive: true, force: true });
}
