// A database that stops answering (every PostgreSQL process stopped with SIGSTOP): calls end
// with `timeout` within statementTimeout instead of hanging, new connections give up within
// connectTimeout, and everything works again once it resumes.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo } from '../src/index.js';
import { type OwnPostgres, ownPostgres } from './support/own-postgres.js';

let own: OwnPostgres;
let ordo: Ordo;
let frozen: number[] = [];

/** The postmaster and every process it started. */
async function clusterPids(url: string): Promise<number[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  const { rows } = await client.query(`SELECT current_setting('data_directory') AS dir`);
  await client.end();
  const postmaster = Number(readFileSync(`${rows[0].dir}/postmaster.pid`, 'utf8').split('\n')[0]);
  const children = execFileSync('pgrep', ['-P', String(postmaster)], { encoding: 'utf8' })
    .split('\n')
    .filter(Boolean)
    .map(Number);
  return [postmaster, ...children];
}

const signal = (pids: number[], sig: NodeJS.Signals) => {
  for (const pid of pids) {
    try {
      process.kill(pid, sig);
    } catch {
      // gone meanwhile
    }
  }
};

beforeAll(async () => {
  own = await ownPostgres();
  ordo = await createOrdo({
    databaseUrl: own.url,
    statementTimeout: '1s',
    connectTimeout: '1s',
    poolSize: 2,
  });
  await ordo.sequences.define({ name: 'frozen' });
  expect(await ordo.nextval('frozen')).toBe(1);
});

afterAll(async () => {
  signal(frozen, 'SIGCONT');
  await ordo?.close();
  await own?.stop();
});

describe('a frozen database', () => {
  it('calls fail with timeout or database_unavailable within the configured times, then work again after it resumes', async () => {
    frozen = await clusterPids(own.url);
    signal(frozen, 'SIGSTOP');
    const started = performance.now();
    const outcomes = await Promise.all(
      Array.from({ length: 6 }, () =>
        ordo.nextval('frozen').then(
          () => 'answered',
          (e: { code?: string }) => e.code,
        ),
      ),
    );
    const elapsed = performance.now() - started;
    // Two statements in flight time out after 1 s and free their connections (closed); the
    // calls queued behind them get a new connection, which cannot open within 1 s.
    for (const o of outcomes) expect(['timeout', 'database_unavailable']).toContain(o);
    expect(outcomes).toContain('timeout');
    expect(elapsed).toBeLessThan(8_000);
    await expect(ordo.ping()).rejects.toMatchObject({
      code: expect.stringMatching(/^(timeout|database_unavailable)$/),
    });

    signal(frozen, 'SIGCONT');
    frozen = [];
    let value: number | undefined;
    for (let i = 0; i < 50 && value === undefined; i++) {
      value = await ordo.nextval('frozen').catch(() => undefined);
      if (value === undefined) await sleep(100);
    }
    // Whatever the frozen statements did, the numbers that were answered stay gapless: 1, then
    // the ones committed while nobody heard the answer, then this one.
    expect(value).toBeGreaterThanOrEqual(2);
  });
});
