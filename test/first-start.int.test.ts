// The first minute of a new user: `ordo` with no database URL, in a fresh folder, as root (as in
// containers and CI) and as a regular user. A running server or one clear line; nothing left
// behind, and never a password file that others can read.
import { chmod, chown, mkdir, mkdtemp, readdir, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { killAll, runCli, startServer } from './support/server-process.js';

const isRoot = process.getuid?.() === 0;
/** The regular user: `nobody` when the tests run as root, else whoever runs them. */
const regular = isRoot ? { uid: 65534, gid: 65534 } : {};

let folders: string[] = [];
let passwordFilesBefore: string[];

const passwordFiles = async () => (await readdir(tmpdir())).filter((f) => f.startsWith('pg-password-'));

async function folder(mode: number, owner: { uid?: number; gid?: number } = {}): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'ordo-first-'));
  folders.push(dir);
  await chmod(dir, mode);
  if (owner.uid !== undefined) await chown(dir, owner.uid, owner.gid!);
  return dir;
}

/** Every file and folder under `dir`, as paths relative to it. */
async function tree(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { recursive: true }).catch(() => []);
  return entries.map(String).sort();
}

beforeAll(async () => {
  passwordFilesBefore = await passwordFiles();
});

afterAll(async () => {
  await killAll();
  for (const dir of folders) await rm(dir, { recursive: true, force: true });
  folders = [];
});

describe('first start with no database URL', () => {
  it.runIf(isRoot)(
    'as root in a folder of mode 700: one embedded_failed line naming the folder and the ways out; nothing written',
    async () => {
      const home = await folder(0o700);
      const r = await runCli(['status'], { cwd: home });
      expect(r.code, r.err).toBe(1);
      expect(r.out).toBe('');
      const lines = r.err.trimEnd().split('\n');
      expect(lines, r.err).toHaveLength(1);
      const line = lines[0]!;
      expect(line).toMatch(/^ordo: embedded_failed: The embedded PostgreSQL in .* cannot start/);
      expect(line).toContain(`cannot enter ${home} (it holds the data directory)`);
      // The three ways out.
      expect(line).toContain('run ordo as a regular user');
      expect(line).toContain(`setfacl -m u:postgres:x ${home}`);
      expect(line).toContain('DATABASE_URL');
      expect(line).not.toMatch(/\n\s+at /);
      expect(await tree(home)).toEqual([]);
      expect(await passwordFiles()).toEqual(passwordFilesBefore);
    },
  );

  it('as a regular user in a folder of mode 700: serves on a new embedded PostgreSQL, says where, stops cleanly', async () => {
    const home = await folder(0o700, regular);
    const server = await startServer({ cwd: home, ...regular, timeoutMs: 60_000 });
    try {
      const said = server
        .logs()
        .find((l) => (l.database as { kind?: string } | undefined)?.kind === 'embedded');
      expect(said, server.output()).toBeDefined();
      expect(said!.database).toMatchObject({
        kind: 'embedded',
        dataDir: join(home, '.ordo', 'pg'),
        created: true,
      });
      expect(said!.msg).toMatch(
        /^database: the embedded PostgreSQL in .*\(created now\), on 127\.0\.0\.1:\d+/,
      );
      const put = await fetch(`${server.url}/v1/sequences/first`, {
        method: 'PUT',
        headers: { 'content-type': 'application/json' },
        body: '{}',
      });
      expect(put.status).toBe(200);
      const next = await fetch(`${server.url}/v1/sequences/first/next`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: '{}',
      });
      expect(await next.json()).toMatchObject({ value: 1 });
    } finally {
      expect(await server.stop()).toBe(0);
    }
    const files = await tree(home);
    expect(files.filter((f) => f.includes('.init-'))).toEqual([]);
    expect(files).not.toContain(join('.ordo', 'pg', 'postmaster.pid'));
    const credentials = await stat(join(home, '.ordo', 'pg', 'ordo-credentials.json'));
    expect(credentials.mode & 0o077).toBe(0);
    expect(await passwordFiles()).toEqual(passwordFilesBefore);

    // Run again from a folder below: the same database, not a new empty one.
    const below = join(home, 'src');
    await mkdir(below);
    if (regular.uid !== undefined) await chown(below, regular.uid, regular.gid!);
    const again = await runCli(['next', 'first'], { cwd: below, ...regular });
    expect(again, again.err).toMatchObject({ code: 0, out: '2\n', err: '' });
  });

  it('a first start killed during initdb leaves no data directory and no password others can read; the next start cleans up', async () => {
    const home = await folder(0o755);
    const first = runCli(['status'], { cwd: home, timeoutMs: 60_000 });
    // Kill it as soon as its staging folder exists: initdb is then running.
    const ordoDir = join(home, '.ordo');
    let staging: string | undefined;
    for (let i = 0; i < 2000 && !staging; i++) {
      staging = (await readdir(ordoDir).catch(() => [] as string[])).find((f) => f.startsWith('pg.init-'));
      if (!staging) await sleep(5);
    }
    expect(staging, 'the staging folder never appeared').toBeDefined();
    await killAll();
    await first;
    const left = await readdir(ordoDir);
    expect(left).not.toContain('pg');
    for (const name of left) {
      // Whatever is left is not readable by others: the folder is private to its owner.
      expect((await stat(join(ordoDir, name))).mode & 0o077, name).toBe(0);
    }

    const second = await runCli(['status', '--json'], { cwd: home, timeoutMs: 60_000 });
    expect(second.code, second.err).toBe(0);
    expect(JSON.parse(second.out).database).toMatchObject({ kind: 'embedded', created: true });
    expect(await readdir(ordoDir)).toEqual(['pg']);
    expect(await passwordFiles()).toEqual(passwordFilesBefore);
  });
});
