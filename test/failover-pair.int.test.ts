// The failover pair fixture itself (test/support/failover-pair.ts), against real
// pg_auto_failover: the pair comes up with synchronous replication, a planned failover and a
// SIGKILL of the primary each leave the other node a writable primary holding every committed
// row, the killed node comes back as the standby, and two pairs at once (test files run in
// parallel) do not touch each other. How long each step takes is printed.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type FailoverPair, failoverPair, type PairNode } from './support/failover-pair.js';

const BINDIR = process.env.PG_BINDIR ?? '/usr/lib/postgresql/15/bin';
/**
 * A failover and the wait for the pair to be whole again take ~10 s on a quiet machine; on
 * two cores shared with other test files, several times that.
 */
const SWITCHING = { timeout: 180_000 };

let pair: FailoverPair;
let other: FailoverPair;
const timings: Record<string, number> = {};
/** Every id whose INSERT on the primary was acknowledged, in the order of their commits. */
const committed: number[] = [];

beforeAll(async () => {
  // Both at once, as two test files running in parallel would.
  const started = performance.now();
  const up = (database: string) =>
    failoverPair({ database }).then((p) => {
      timings[`up (${database})`] = Math.round(performance.now() - started);
      return p;
    });
  [pair, other] = await Promise.all([up('fixture_a'), up('fixture_b')]);
}, 180_000);

afterAll(async () => {
  console.log('failover pair timings (ms)', timings);
  await Promise.all([pair?.remove(), other?.remove()]);
});

async function sql(url: string, text: string): Promise<pg.QueryResult> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 5_000 });
  client.on('error', () => undefined);
  await client.connect();
  try {
    return await client.query(text);
  } finally {
    await client.end().catch(() => undefined);
  }
}

const inRecovery = async (n: PairNode) =>
  (await sql(n.url, 'SELECT pg_is_in_recovery() AS r')).rows[0].r as boolean;

const ids = async (n: PairNode) =>
  (await sql(n.url, 'SELECT id FROM fixture_rows ORDER BY id')).rows.map((r) => r.id as number);

/** Inserts on `n`, one row a transaction, until `until.stop` or a statement fails. */
async function writeUntil(n: PairNode, until: { stop: boolean }): Promise<number> {
  const client = new pg.Client({ connectionString: n.url });
  client.on('error', () => undefined);
  await client.connect();
  let count = 0;
  try {
    while (!until.stop) {
      const { rows } = await client.query('INSERT INTO fixture_rows DEFAULT VALUES RETURNING id');
      committed.push(rows[0].id as number);
      count++;
    }
  } catch {
    // The server went away: what was acknowledged before is what counts.
  } finally {
    await client.end().catch(() => undefined);
  }
  return count;
}

/**
 * Which server libpq reaches through a URL, as an application given it would (psql comes with
 * postgresql-15's client package).
 */
function psqlPort(url: string): number {
  const r = spawnSync(join(BINDIR, 'psql'), [url, '-XAtc', 'SELECT inet_server_port()'], {
    encoding: 'utf8',
    env: { ...process.env, PGUSER: 'postgres', PGCONNECT_TIMEOUT: '5' },
  });
  if (r.status !== 0) throw new Error(`psql ${url}: ${r.stderr}`);
  return Number(r.stdout.trim());
}

describe('a pg_auto_failover pair of the test’s own', () => {
  it('comes up: node1 primary, node2 its synchronous standby, the database on both', async () => {
    const [n1, n2] = pair.nodes;
    expect(pair.url).toBe(
      `postgres://127.0.0.1:${n1.port},127.0.0.1:${n2.port}/fixture_a?target_session_attrs=read-write&sslmode=prefer`,
    );
    const states = await pair.states();
    expect(states.map((s) => [s.name, s.reported, s.assigned])).toEqual([
      ['node1', 'primary', 'primary'],
      ['node2', 'secondary', 'secondary'],
    ]);
    expect((await pair.primary()).name).toBe('node1');
    expect((await pair.standby()).name).toBe('node2');
    expect(await inRecovery(n2)).toBe(true);
    const { rows } = await sql(n1.url, 'SHOW synchronous_standby_names');
    expect(rows[0].synchronous_standby_names).toBe('ANY 1 (pgautofailover_standby_2)');
    // The database the caller named, on both nodes (the standby's is pg_basebackup's copy).
    for (const n of pair.nodes) {
      expect((await sql(n.url, 'SELECT current_database() AS d')).rows[0].d).toBe('fixture_a');
    }
    // Every server of the pair listens on 127.0.0.1 alone, each on a port of its own.
    for (const url of [n1.url, n2.url, pair.monitorUrl]) {
      expect((await sql(url, 'SHOW listen_addresses')).rows[0].listen_addresses).toBe('127.0.0.1');
    }
    expect(new Set([n1.port, n2.port, Number(new URL(pair.monitorUrl).port), 5432]).size).toBe(4);
    expect(psqlPort(pair.url)).toBe(n1.port);
  });

  it('a commit on the primary is on the standby: replication is synchronous', async () => {
    const [n1, n2] = pair.nodes;
    await sql(n1.url, 'CREATE TABLE fixture_rows (id serial PRIMARY KEY, at timestamptz DEFAULT now())');
    const { rows } = await sql(
      n1.url,
      `SELECT application_name, sync_state FROM pg_stat_replication WHERE state = 'streaming'`,
    );
    expect(rows).toEqual([{ application_name: 'pgautofailover_standby_2', sync_state: 'quorum' }]);
    // remote_apply: the commit returns once the standby has applied it, so a read there right
    // after sees it. With the standby not synchronous, the commit would not wait for it.
    const client = new pg.Client({ connectionString: n1.url });
    await client.connect();
    await client.query(`SET synchronous_commit = remote_apply`);
    const { rows: inserted } = await client.query('INSERT INTO fixture_rows DEFAULT VALUES RETURNING id');
    await client.end();
    committed.push(inserted[0].id as number);
    expect(await ids(n2)).toEqual(committed);
  });

  it(
    'failover(): the other node accepts writes, the old primary becomes its standby',
    SWITCHING,
    async () => {
      const f = await pair.failover();
      timings['planned failover: writable primary'] = f.ms;
      expect([f.from.name, f.to.name]).toEqual(['node1', 'node2']);
      const { rows } = await sql(f.to.url, 'INSERT INTO fixture_rows DEFAULT VALUES RETURNING id');
      committed.push(rows[0].id as number);
      expect(await ids(f.to)).toEqual(committed);

      const started = performance.now();
      const standby = await pair.standby();
      timings['planned failover: old primary a synchronous standby'] = Math.round(
        performance.now() - started,
      );
      expect(standby.name).toBe('node1');
      expect(await inRecovery(standby)).toBe(true);
      expect((await pair.primary()).name).toBe('node2');
      expect(psqlPort(pair.url)).toBe(f.to.port);
    },
  );

  it('killPrimary(): the survivor is writable and holds every acknowledged commit', SWITCHING, async () => {
    const primary = await pair.primary();
    expect(primary.name).toBe('node2');
    await pair.standby();
    // Writes go on up to the kill: every INSERT the primary acknowledged was on the standby too.
    const writing = { stop: false };
    const writer = writeUntil(primary, writing);
    await sleep(300);
    const k = await pair.killPrimary();
    writing.stop = true;
    const written = await writer;
    timings['unplanned failover (SIGKILL): writable primary'] = k.ms;
    expect([k.from.name, k.to.name]).toEqual(['node2', 'node1']);
    expect(written).toBeGreaterThan(0);
    expect(await inRecovery(k.to)).toBe(false);
    // Acknowledged on node2 means on node1: none is missing.
    const survivor = new Set(await ids(k.to));
    expect(committed.filter((id) => !survivor.has(id))).toEqual([]);
    const { rows } = await sql(k.to.url, 'INSERT INTO fixture_rows DEFAULT VALUES RETURNING id');
    committed.push(rows[0].id as number);
    // The killed node is down: nothing answers on its port.
    await expect(sql(k.from.url, 'SELECT 1')).rejects.toThrow();
    expect(psqlPort(pair.url)).toBe(k.to.port);
  });

  it('rejoin(): the killed node comes back as the standby, with every row', SWITCHING, async () => {
    const r = await pair.rejoin();
    timings['rejoin: killed node a synchronous standby'] = r.ms;
    expect(r.node.name).toBe('node2');
    expect(await inRecovery(r.node)).toBe(true);
    expect((await pair.primary()).name).toBe('node1');
    const client = new pg.Client({ connectionString: pair.node('node1').url });
    await client.connect();
    await client.query(`SET synchronous_commit = remote_apply`);
    const { rows } = await client.query('INSERT INTO fixture_rows DEFAULT VALUES RETURNING id');
    await client.end();
    committed.push(rows[0].id as number);
    // Rows written before its kill, while it was away, and now.
    const back = await ids(r.node);
    expect(committed.filter((id) => !back.includes(id))).toEqual([]);
  });

  it('the other pair, running all along, saw none of it', async () => {
    expect(other.dir).not.toBe(pair.dir);
    const ports = (p: FailoverPair) => [...p.nodes.map((n) => n.port), Number(new URL(p.monitorUrl).port)];
    expect(ports(other).filter((port) => ports(pair).includes(port))).toEqual([]);
    expect((await other.states()).map((s) => [s.name, s.reported, s.assigned])).toEqual([
      ['node1', 'primary', 'primary'],
      ['node2', 'secondary', 'secondary'],
    ]);
    // No failover ever began there, and its nodes know nothing of the first pair's table.
    const { rows } = await sql(
      other.monitorUrl,
      `SELECT count(*)::int AS n FROM pgautofailover.event WHERE goalstate IN ('draining', 'prepare_promotion')`,
    );
    expect(rows[0].n).toBe(0);
    const { rows: tables } = await sql(other.nodes[0].url, `SELECT to_regclass('fixture_rows') AS t`);
    expect(tables[0].t).toBeNull();
    expect(other.url).toContain('/fixture_b?');
  });

  it('remove() ends every process of a pair and its folder, and may be called twice', async () => {
    const dir = other.dir;
    const urls = [...other.nodes.map((n) => n.url), other.monitorUrl];
    await other.remove();
    await other.remove();
    expect(existsSync(dir)).toBe(false);
    for (const url of urls) await expect(sql(url, 'SELECT 1')).rejects.toThrow();
    // The first pair goes on.
    expect((await pair.primary()).name).toBe('node1');
  });

  it('stop() stops every server, keeps the folder for its logs, and may be called twice', async () => {
    await pair.stop();
    await pair.stop();
    expect(existsSync(pair.dir)).toBe(true);
    for (const n of pair.nodes) await expect(sql(n.url, 'SELECT 1')).rejects.toThrow();
    expect(await pair.log()).toContain('pg_autoctl');
  });
});
