import { setTimeout as sleep } from 'node:timers/promises';
import type pg from 'pg';

/**
 * Resolves once a session of the pool's database waits for a lock: the session `pid`, or any
 * but `except` whose query is like `like`. Throws after 10 s. Read on the pool, outside the
 * transactions under test (pg_stat_activity stays as first read within a transaction).
 */
export async function waitingForLock(
  pool: pg.Pool,
  options: { pid?: number; except?: number; like?: string },
): Promise<void> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const { rows } = await pool.query(
      `SELECT count(*)::int AS n FROM pg_stat_activity
        WHERE datname = current_database() AND wait_event_type = 'Lock'
          AND pid = coalesce($1::int, pid) AND pid <> coalesce($2::int, 0)
          AND query LIKE coalesce($3::text, '%')`,
      [options.pid ?? null, options.except ?? null, options.like ?? null],
    );
    if (rows[0].n > 0) return;
    if (Date.now() > deadline) throw new Error(`nothing waited for a lock: ${JSON.stringify(options)}`);
    await sleep(10);
  }
}
