import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo } from '../src/index.js';
import { freshDatabase, type TestDatabase } from './support/database.js';

let db: TestDatabase;
let ordo: Ordo;

beforeAll(async () => {
  db = await freshDatabase();
  ordo = await createOrdo({ databaseUrl: db.url });
});
afterAll(async () => {
  await ordo?.close();
  await db?.drop();
});

describe('gapless sequences', () => {
  it('defines, gets and numbers', async () => {
    const def = await ordo.sequences.define({
      name: 'invoice',
      reset: 'year',
      timeZone: 'Europe/Paris',
      format: 'INV-{YYYY}-{n:6}',
    });
    expect(def).toMatchObject({
      name: 'invoice',
      kind: 'gapless',
      start: 1,
      reset: 'year',
      timeZone: 'Europe/Paris',
    });
    const a = await ordo.sequences.next('invoice', { scope: 'acme', at: '2026-03-01T10:00:00Z' });
    expect(a).toEqual({ value: 1, text: 'INV-2026-000001', period: '2026-01-01', scope: 'acme' });
    expect(await ordo.nextval('invoice', { scope: 'acme', at: '2026-03-01T10:00:00Z' })).toBe(2);
  });
});
