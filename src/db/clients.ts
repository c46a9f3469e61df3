import type pg from 'pg';

/**
 * A new client with the pool's own settings, for a connection that must not come from the
 * pool: a LISTEN, which lives as long as the process, or a connection kept for one job.
 */
export function clientLike(pool: pg.Pool): pg.Client {
  const options = (pool as unknown as { options: pg.ClientConfig }).options;
  return new (pool as unknown as { Client: typeof pg.Client }).Client(options);
}
