import type pg from 'pg';

/**
 * A number taken by a SQL call of ordo's take() on `client`, as a caller in another language
 * takes it, as nextval() does (next({ tx }) and numbering at commit call take_value()).
 * `at` null: the transaction's now().
 */
export async function sqlTake(
  client: Pick<pg.ClientBase, 'query'>,
  schema: string,
  name: string,
  scope: string,
  at: string | null = null,
): Promise<{ value: number; period: string | null }> {
  const { rows } = await client.query(
    `SELECT value, period FROM "${schema}".take($1, $2, coalesce($3::timestamptz, now()), 1)`,
    [name, scope, at],
  );
  return { value: Number(rows[0].value), period: rows[0].period };
}

/** How many times a transaction writes counters before its takes queue on the row alone. */
export const COUNTERS_QUEUED = 16;

/**
 * Takes a number of `name` in COUNTERS_QUEUED scopes of its own (`batch-0`, …) on `client`'s
 * open transaction: its later takes wait on the counter's row, not on the counter's lock.
 */
export async function pastCounterQueue(
  client: Pick<pg.ClientBase, 'query'>,
  schema: string,
  name: string,
  at: string | null = null,
): Promise<void> {
  for (let i = 0; i < COUNTERS_QUEUED; i++) await sqlTake(client, schema, name, `batch-${i}`, at);
}
