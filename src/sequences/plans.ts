import { quoteIdent } from '../db/migrations.js';

/**
 * Every statement the sequences module sends, in one place for review. Built once per
 * schema; the schema name is a validated identifier, all values are parameters.
 */
export function sequencePlans(schema: string) {
  const s = quoteIdent(schema);
  const columns =
    'name, kind, start, increment, min_value, max_value, cycle, reset, time_zone, format, created_at, updated_at';
  return {
    /** Inserts a definition after PostgreSQL has checked the time zone; nothing on conflict. */
    define: `INSERT INTO ${s}.sequences (name, kind, start, increment, min_value, max_value, cycle, reset, time_zone, format)
      SELECT $1, $2, $3, $4, $5, $6, $7, $8, ${s}.check_time_zone($9), $10
      ON CONFLICT (name) DO NOTHING
      RETURNING ${columns}`,
    get: `SELECT ${columns} FROM ${s}.sequences WHERE name = $1`,
    list: `SELECT ${columns} FROM ${s}.sequences ORDER BY name`,
    /** Current value per scope and period; sequences never used appear once with nulls. */
    status: `SELECT d.name, d.reset, c.scope, to_char(nullif(c.period, '-infinity'), 'YYYY-MM-DD') AS period, c.value
      FROM ${s}.sequences AS d LEFT JOIN ${s}.counters AS c ON c.sequence = d.name
      ORDER BY d.name, c.scope, c.period`,
    remove: `DELETE FROM ${s}.sequences WHERE name = $1 RETURNING name`,
    /** The hot path: `how_many` consecutive values, in order, in one statement. */
    take: `SELECT value, text, period FROM ${s}.take($1, $2, coalesce($3::timestamptz, now()), $4)`,
    /** Coalesced standalone calls for several (sequence, scope, at) at once. */
    takeMany: `SELECT request, value, text, period FROM ${s}.take_many($1::text[], $2::text[], $3::timestamptz[], $4::integer[])`,
  };
}

export type SequencePlans = ReturnType<typeof sequencePlans>;
