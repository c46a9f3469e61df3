import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo } from '../src/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { runCliSync } from './support/server-process.js';
import { until } from './support/until.js';

let db: TestDatabase;
let ordo: Ordo;

beforeAll(async () => {
  db = await freshDatabase();
  ordo = await createOrdo({ databaseUrl: db.url });
  await ordo.sequences.define({ name: 'ticket', format: 'T-{n:3}', reset: 'day' });
});
afterAll(async () => {
  await ordo?.close();
  await db?.drop();
});

const cli = (...args: string[]) => runCliSync(args, { env: { DATABASE_URL: db.url } });

describe('ordo CLI', () => {
  it('prints help, and refuses unknown commands and flags with a one-line reason', () => {
    expect(cli('--help')).toMatchObject({ code: 0, out: expect.stringContaining('ordo next <name>') });
    const unknown = cli('frobnicate');
    expect(unknown.code).toBe(2);
    expect(unknown.err.trim()).toBe("ordo: unknown command 'frobnicate' (try ordo --help)");
    const flag = cli('status', '--colour');
    expect(flag.code).toBe(2);
    expect(flag.err).toContain("Unknown option '--colour'");
  });

  it('takes values, shows status and reports errors by code', () => {
    expect(cli('next', 'ticket', '--scope', 'desk', '--at', '2026-05-01T10:00:00Z')).toMatchObject({
      code: 0,
      out: 'T-001\n',
    });
    const many = cli(
      'next',
      'ticket',
      '--scope',
      'desk',
      '--count',
      '2',
      '--at',
      '2026-05-01T11:00:00Z',
      '--json',
    );
    expect(many.code).toBe(0);
    expect(JSON.parse(many.out).map((i: { value: number }) => i.value)).toEqual([2, 3]);
    const status = cli('status', '--json');
    expect(JSON.parse(status.out).sequences).toContainEqual({
      name: 'ticket',
      reset: 'day',
      scope: 'desk',
      period: '2026-05-01',
      value: 3,
    });
    // The database in use, never its password; notifications arrive on a direct connection.
    const url = new URL(db.url);
    expect(JSON.parse(status.out)).toMatchObject({
      database: { kind: 'url', host: url.hostname, port: Number(url.port || 5432), database: db.name },
      notifications: { route: 'database', state: 'ok', message: null },
    });
    const text = cli('status');
    expect(text.out.split('\n').slice(0, 2)).toEqual([
      `database: ${db.name} on ${url.hostname}:${url.port || 5432} as ${decodeURIComponent(url.username)}`,
      'notifications: arriving (on the database connection)',
    ]);
    expect(cli('url')).toMatchObject({ code: 0, out: `${db.url}\n` });
    // psql on the same database, with arguments after --.
    expect(cli('psql', '--', '-tAc', "SELECT name FROM ordo.sequences WHERE name = 'ticket'")).toMatchObject({
      code: 0,
      out: 'ticket\n',
    });
    expect(cli('migrate')).toMatchObject({ code: 0, out: 'ordo: schema is up to date\n' });
    const missing = cli('next', 'nope');
    expect(missing.code).toBe(1);
    expect(missing.err.trim()).toBe("ordo: sequence_not_found: The sequence 'nope' does not exist");
    const bad = cli('next', 'ticket', '--count', 'lots');
    expect(bad.code).toBe(2);
    expect(bad.err.trim()).toBe("ordo: --count must be a whole number (got 'lots')");
    const tooMany = cli('next', 'ticket', '--count', '10001');
    expect(tooMany.code).toBe(1);
    expect(tooMany.err).toContain('invalid_argument: count must be a whole number from 1 to 10000');
  });

  it('status lists outbox subscriptions with their lag, throttles and running permits', async () => {
    await ordo.outbox.append('orders', [{ type: 'A', data: 1 }]);
    // The subscription exists without a consumer: it is behind by the message above.
    await db.pool(1).query(`SELECT * FROM ordo.create_subscription('billing', 'orders', 'beginning')`);
    await ordo.throttles.define({ name: 'FOO', every: '1m', concurrency: 1, lease: '10m' });
    const permit = await ordo.throttles.acquire('FOO', { key: 'tenant-1', holder: 'worker-7' });
    expect(permit.granted).toBe(true);
    // Keys of note: one with its own limits, one paused, one with a waiter in line.
    await ordo.throttles.define({ name: 'BAR', concurrency: 1 });
    await ordo.throttles.setKeyLimits('BAR', 'premium', { concurrency: 5 });
    await ordo.throttles.pause('BAR', { key: 'upstream-429', until: '10m' });
    await ordo.throttles.pause('FOO', { until: '10m' });
    await ordo.throttles.define({ name: 'PLAIN', limit: 10, per: '1s', permits: false });
    const busy = await ordo.throttles.acquire('BAR', { key: 'busy' });
    expect(busy.granted).toBe(true);
    const waiter = new AbortController();
    const waiting = ordo.throttles
      .acquire('BAR', { key: 'busy', wait: '1m', signal: waiter.signal })
      .catch(() => null);
    await until(
      'the waiter is in line',
      async () => (await ordo.throttles.state('BAR', 'busy')).waiting > 0,
      30_000,
    );
    try {
      const json = cli('status', '--json');
      expect(json.code).toBe(0);
      const status = JSON.parse(json.out);
      expect(status.subscriptions).toMatchObject([{ name: 'billing', topic: 'orders', messagesBehind: 1 }]);
      expect(status.throttles).toMatchObject([
        { name: 'BAR', pausedUntil: null },
        { name: 'FOO', everyMs: 60_000, concurrency: 1, pausedUntil: expect.any(String) },
        { name: 'PLAIN', permits: false, leaseMs: null },
      ]);
      expect(status.permits).toMatchObject([
        { name: 'BAR', key: 'busy' },
        { name: 'FOO', key: 'tenant-1', holder: 'worker-7' },
      ]);
      const keyOf = (key: string) => status.keys.find((k: { name: string; key: string }) => k.key === key);
      expect(keyOf('premium')).toMatchObject({ name: 'BAR', ownLimits: { concurrency: 5 } });
      expect(keyOf('upstream-429')).toMatchObject({ name: 'BAR', pausedUntil: expect.any(String) });
      expect(keyOf('busy')).toMatchObject({ name: 'BAR', waiting: 1 });
      // A key with nothing of note is not listed.
      expect(keyOf('tenant-1')?.name).not.toBe('BAR');
      const text = cli('status');
      expect(text.code).toBe(0);
      for (const shown of [
        'outbox subscriptions',
        'billing',
        'throttles',
        '1m',
        'paused until',
        'no permits',
        'throttle keys of note',
        'premium',
        'concurrency 5',
        'upstream-429',
        'running permits',
        'worker-7',
      ]) {
        expect(text.out).toContain(shown);
      }
    } finally {
      waiter.abort();
      await waiting;
    }
  });

  it("runs statements with `ordo sql`, printing SurrealDB's answers (and --json)", () => {
    const plain = cli(
      'sql',
      "DEFINE SEQUENCE mySeq2 BATCH 1000 START 100 TIMEOUT 5s; sequence::nextval('mySeq2');",
    );
    expect(plain).toMatchObject({ code: 0, out: 'null\n100\n' });
    const json = cli(
      'sql',
      '--json',
      "DEFINE SEQUENCE mySeq3 BATCH 1000 START 100 TIMEOUT 0s; sequence::nextval('mySeq3');",
    );
    expect(json.code).toBe(1);
    expect(JSON.parse(json.out)).toEqual([
      { result: null },
      { error: 'The query was not executed because it exceeded the timeout: 0ns', code: 'timeout' },
    ]);
    const bad = cli('sql', 'DEFINE SEQUENCE');
    expect(bad.code).toBe(1);
    expect(bad.err.trim()).toBe(
      'ordo: invalid_argument: Parse error: expected a sequence name, found end of input at 1:16',
    );
  });
});
