import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo, OrdoError } from '../src/index.js';
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

describe('ordo.query (SurrealQL-compatible statements)', () => {
  it("gives the SurrealDB documentation's answers", async () => {
    expect(
      await ordo.query(
        "DEFINE SEQUENCE mySeq2 BATCH 1000 START 100 TIMEOUT 5s; sequence::nextval('mySeq2');",
      ),
    ).toEqual([{ result: null }, { result: 100 }]);
    expect(
      await ordo.query(
        "DEFINE SEQUENCE mySeq3 BATCH 1000 START 100 TIMEOUT 0s; sequence::nextval('mySeq3');",
      ),
    ).toEqual([
      { result: null },
      { error: 'The query was not executed because it exceeded the timeout: 0ns', code: 'timeout' },
    ]);
    expect(await ordo.query('DEFINE SEQUENCE mySeq2 BATCH 10')).toEqual([
      { error: "The sequence 'mySeq2' already exists", code: 'sequence_exists' },
    ]);
    expect(await ordo.query("RETURN sequence::nextval('nope')")).toEqual([
      { error: "The sequence 'nope' does not exist", code: 'sequence_not_found' },
    ]);
  });

  it('runs every statement, keywords in any case, and reports each on its own', async () => {
    const results = await ordo.query(`
      define sequence IF NOT EXISTS mySeq2 batch 5;      -- exists: nothing happens
      Define Sequence inv GAPLESS RESET YEARLY TIMEZONE 'Europe/Paris' FORMAT 'INV-{YYYY}-{n:6}';
      sequence::nextval('inv');
      REMOVE SEQUENCE nothing;
      REMOVE SEQUENCE IF EXISTS nothing;
      RETURN SEQUENCE::NEXTVAL("inv");
    `);
    expect(results).toEqual([
      { result: null },
      { result: null },
      { result: 1 },
      { error: "The sequence 'nothing' does not exist", code: 'sequence_not_found' },
      { result: null },
      { result: 2 },
    ]);
    expect(await ordo.sequences.get('inv')).toMatchObject({
      kind: 'gapless',
      reset: 'year',
      timeZone: 'Europe/Paris',
    });
  });

  it('OVERWRITE redefines without going backwards; ALTER changes the timeout; INFO FOR DB prints definitions', async () => {
    await ordo.query('DEFINE SEQUENCE ow BATCH 100 START 0');
    const before = await ordo.nextval('ow');
    await ordo.query('DEFINE SEQUENCE OVERWRITE ow BATCH 10 START 0 TIMEOUT 1m');
    const after = await ordo.nextval('ow');
    expect(after).toBeGreaterThan(before + 99); // the rest of the old range is never reused
    await ordo.query('ALTER SEQUENCE ow TIMEOUT 250ms');
    expect((await ordo.sequences.get('ow'))?.timeoutMs).toBe(250);
    await ordo.query('ALTER SEQUENCE ow DROP TIMEOUT');
    expect((await ordo.sequences.get('ow'))?.timeoutMs).toBeNull();
    const [info] = await ordo.query('INFO FOR DB');
    const sequences = (info as { result: { sequences: Record<string, string> } }).result.sequences;
    expect(sequences.ow).toBe(`DEFINE SEQUENCE ow BATCH 10 START ${(await ordo.sequences.get('ow'))!.start}`);
    // Every printed definition defines the same sequence again (round trip through OVERWRITE).
    for (const [name, text] of Object.entries(sequences)) {
      const before = await ordo.sequences.get(name);
      const overwritten = await ordo.query(text.replace('DEFINE SEQUENCE', 'DEFINE SEQUENCE OVERWRITE'));
      expect(overwritten).toEqual([{ result: null }]);
      expect(await ordo.sequences.get(name)).toMatchObject({
        kind: before!.kind,
        batch: before!.batch,
        reset: before!.reset,
        format: before!.format,
        timeoutMs: before!.timeoutMs,
      });
    }
  });

  it('refuses text that does not parse, running none of it, with line:column', async () => {
    const error = await ordo
      .query('DEFINE SEQUENCE fine;\nDEFINE SEQUENCE broken BATCH ten;')
      .catch((e) => e);
    expect(error).toBeInstanceOf(OrdoError);
    expect(error).toMatchObject({ code: 'invalid_argument' });
    expect(error.message).toContain('at 2:30');
    expect(await ordo.sequences.get('fine')).toBeNull();
    // A value the statement cannot use is no syntax error: that statement fails, the others run.
    expect(await ordo.query('DEFINE SEQUENCE fine;\nDEFINE SEQUENCE broken BATCH 0;')).toEqual([
      { result: null },
      {
        error: "BATCH must be a whole number from 1 to 1000000, found '0' at 2:30",
        code: 'invalid_argument',
      },
    ]);
    expect(await ordo.sequences.get('fine')).not.toBeNull();
    expect(await ordo.sequences.get('broken')).toBeNull();
    await expect(ordo.query('SELECT * FROM person')).rejects.toMatchObject({ code: 'invalid_argument' });
    expect(await ordo.query('DEFINE SEQUENCE g GAPLESS BATCH 5')).toEqual([
      { error: 'batch applies to batched sequences only', code: 'invalid_argument' },
    ]);
  });
});
