import type pg from 'pg';

/**
 * A new client with the pool's own settings, for a connection that must not come from the
 * pool: a LISTEN, which lives as long as the process, or a connection kept for one job.
 */
export function clientLike(pool: pg.Pool): pg.Client {
  const options = (pool as unknown as { options: pg.ClientConfig }).options;
  return new (pool as unknown as { Client: typeof pg.Client }).Client(options);
}

/**
 * Listens for a checked-out client's 'error' until released. pg-pool stops listening to a
 * client it hands out, so a connection cut while the caller's code runs (no query active)
 * would otherwise be an uncaught exception; the next query fails and says so instead.
 * `release(broken)` gives the client back, destroying it when it broke either way.
 */
export function guardClient(client: pg.PoolClient): { release(broken: boolean): void } {
  let cut = false;
  const onError = () => {
    cut = true;
  };
  client.on('error', onError);
  return {
    release(broken) {
      client.off('error', onError);
      client.release(broken || cut);
    },
  };
}
