import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { chmod, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { embeddedPostgres, startEmbedded } from '../src/db/embedded.js';
import { createOrdo, OrdoError } from '../src/index.js';

let root: string;

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), 'ordo-embedded-'));
  await chmod(root, 0o755);
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

function startChild(
  dataDir: string,
  mode = 'wait',
): {
  child: ChildProcess;
  ready: Promise<number>;
  /** Listened for from the start: a child that exits right after it is ready is not missed. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  output: () => string;
} {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', 'test/support/embedded-child.ts', dataDir, mode],
    {
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  let output = '';
  const ready = new Promise<number>((resolve, reject) => {
    child.stdout!.on('data', (chunk: Buffer) => {
      output += chunk.toString();
      const m = /ready (\d+)/.exec(output);
      if (m) resolve(Number(m[1]));
    });
    child.stderr!.on('data', (chunk: Buffer) => {
      output += chunk.toString();
    });
    child.on('exit', (code) => reject(new Error(`child exited with ${code}: ${output}`)));
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on('exit', (code, signal) => resolve({ code, signal })),
  );
  return { child, ready, exited, output: () => output };
}

async function postmasterPid(dataDir: string): Promise<number | undefined> {
  const text = await readFile(join(dataDir, 'postmaster.pid'), 'utf8').catch(() => undefined);
  return text ? Number(text.split('\n')[0]) : undefined;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function until(check: () => Promise<boolean> | boolean, ms = 15_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await sleep(50);
  }
}

describe('embedded PostgreSQL', () => {
  it('initialises a data directory once, keeps values across restarts, and stops on close', async () => {
    const dataDir = join(root, 'reuse', 'pg');
    const first = await createOrdo({ embedded: { dataDir } });
    await first.sequences.define({ name: 'kept' });
    expect(await first.nextval('kept')).toBe(1);
    // A second client in the same process shares the same server.
    const second = await createOrdo({ embedded: { dataDir } });
    expect(await second.nextval('kept')).toBe(2);
    const pid = await postmasterPid(dataDir);
    expect(pid).toBeDefined();
    await first.close();
    expect(await second.nextval('kept')).toBe(3);
    await second.close();
    await until(() => !alive(pid!));
    expect(existsSync(join(dataDir, 'postmaster.pid'))).toBe(false);

    const again = await createOrdo({ embedded: { dataDir } });
    try {
      expect(await again.nextval('kept')).toBe(4);
    } finally {
      await again.close();
    }
  });

  it("runs another PostgreSQL's programs from a folder (the benches' PG_BIN), and names a program missing there", async () => {
    // Debian's PostgreSQL, which the machine's server runs on.
    const bin = readdirSync('/usr/lib/postgresql')
      .map((v) => `/usr/lib/postgresql/${v}/bin`)
      .find((d) => existsSync(join(d, 'initdb')));
    expect(bin).toBeDefined();
    const server = await startEmbedded(join(root, 'other-bin', 'pg'), bin);
    try {
      const client = new pg.Client({ connectionString: server.url });
      await client.connect();
      const { rows } = await client.query("SELECT current_setting('data_directory') AS dir, version() AS v");
      await client.end();
      expect(rows[0].dir).toBe(join(root, 'other-bin', 'pg'));
      expect(rows[0].v).toContain(`PostgreSQL ${bin!.split('/').at(-2)}`);
      expect((await embeddedPostgres(bin)).postgres).toBe(join(bin!, 'postgres'));
    } finally {
      await server.stop();
    }
    const missing = await startEmbedded(join(root, 'no-bin', 'pg'), root).catch((e: unknown) => e);
    expect(missing).toBeInstanceOf(OrdoError);
    expect((missing as OrdoError).message).toBe(`There is no PostgreSQL program ${join(root, 'initdb')}.`);
  });

  it('stops PostgreSQL when the process gets SIGTERM or SIGINT, then dies of that signal', async () => {
    const dataDir = join(root, 'signals', 'pg');
    for (const [i, signal] of (['SIGTERM', 'SIGINT'] as const).entries()) {
      const { child, ready, exited } = startChild(dataDir);
      expect(await ready).toBe(i + 1);
      const pid = await postmasterPid(dataDir);
      expect(pid && alive(pid)).toBe(true);
      child.kill(signal);
      expect((await exited).signal).toBe(signal);
      await until(() => !alive(pid!));
    }
  });

  it('an application that handles SIGTERM itself keeps its database until it closes ordo', async () => {
    const dataDir = join(root, 'own-handler', 'pg');
    const { child, ready, exited, output } = startChild(dataDir, 'own-handler');
    expect(await ready).toBe(1);
    const pid = await postmasterPid(dataDir);
    child.kill('SIGTERM');
    expect((await exited).code).toBe(0);
    expect(output()).toContain('after-signal 2');
    await until(() => !alive(pid!));
  });

  it('keeps the exit code a program sets, and stops PostgreSQL on process.exit() without close()', async () => {
    const dataDir = join(root, 'exit', 'pg');
    const closed = startChild(dataDir, 'exit-code');
    expect(await closed.ready).toBe(1);
    expect((await closed.exited).code).toBe(7);

    const abrupt = startChild(dataDir, 'exit-without-close');
    expect(await abrupt.ready).toBe(2);
    const pid = await postmasterPid(dataDir);
    expect((await abrupt.exited).code).toBe(3);
    await until(() => !alive(pid!));
  });

  it('after the owning process is killed with SIGKILL, the next start reuses the server left running', async () => {
    const dataDir = join(root, 'killed', 'pg');
    const { child, ready, exited } = startChild(dataDir);
    expect(await ready).toBe(1);
    const pid = await postmasterPid(dataDir);
    child.kill('SIGKILL');
    await exited;
    expect(alive(pid!)).toBe(true);
    const ordo = await createOrdo({ embedded: { dataDir } });
    try {
      expect(await ordo.nextval('child')).toBe(2);
    } finally {
      await ordo.close();
      // The adopted server is not ours to stop; this test cleans it up.
      process.kill(pid!, 'SIGINT');
      await until(() => !alive(pid!));
    }
  });
});
