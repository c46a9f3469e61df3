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
 * Every connection of a pool ordo owns hears its own 'error' for its whole life. pg-pool stops
 * listening to a client it hands out, and it hands one out synchronously, inside the socket
 * read that finished the previous query: when the server's "terminating connection" arrives in
 * that same read (a pg_terminate_backend, a restart), it is emitted before the new holder
 * could listen, an uncaught exception that ends the process. The error still fails the query
 * it concerns, and the pool still discards the client. A pool you pass is yours to set up so.
 */
export function hearClientErrors(pool: pg.Pool): void {
  pool.on('connect', (client) => client.on('error', () => undefined));
}

/**
 * Notes that a checked-out client's connection was cut while the caller's code ran (no query
 * active), so that `release(broken)` destroys it instead of pooling it again; the next query
 * on it fails and says so. On a pool you pass, this is also what keeps that error from being
 * uncaught while ordo holds the client.
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
