import type pg from 'pg';

/**
 * A number taken by a SQL call of ordo's take() on `client`, as a caller in another language
 * takes it, through the function numbering at commit calls (next({ tx }) calls take_value()).
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
