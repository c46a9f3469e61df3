import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestProject } from 'vitest/node';
import { startEmbedded } from '../../src/db/embedded.js';
import { ensureSystemPrograms } from './system-packages.js';

declare module 'vitest' {
  export interface ProvidedContext {
    databaseUrl: string;
    databaseLabel: string;
  }
}

/**
 * Integration tests run against DATABASE_URL when it is set, otherwise against an embedded
 * PostgreSQL started here in a throw-away directory, so `npm test` needs no database at all.
 * The programs some tests drive (PgBouncer, Chromium) are installed first when missing.
 */
export default async function setup(project: TestProject) {
  ensureSystemPrograms((line) => process.stderr.write(`${line}\n`));
  const given = process.env.ORDO_DATABASE_URL ?? process.env.DATABASE_URL;
  if (given) {
    project.provide('databaseUrl', given);
    project.provide('databaseLabel', 'DATABASE_URL');
    return;
  }
  const dir = await mkdtemp(join(tmpdir(), 'ordo-test-'));
  // When tests run as root, PostgreSQL runs as the `postgres` user, which must reach the directory.
  await chmod(dir, 0o755);
  const server = await startEmbedded(join(dir, 'pg'));
  project.provide('databaseUrl', server.url);
  project.provide('databaseLabel', 'embedded');
  return async () => {
    await server.stop();
    await rm(dir, { recursive: true, force: true });
  };
}
