import {
  type DrizzleTransaction,
  type KyselyTransaction,
  type PostgresJsTransaction,
  recognise,
} from './drivers.js';

/**
 * The one thing ordo needs from a connection: run a statement with parameters and return
 * rows, as node-postgres does (a `pg` Pool, Client or PoolClient fits as it is). The
 * adapters in drivers.ts give other drivers this method.
 */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: any[] }>;
}

/**
 * Every `tx` ordo accepts: a pg client, a postgres.js, Kysely or Drizzle transaction as it
 * is, or any Queryable (such as an adapter's).
 */
export type Tx = Queryable | PostgresJsTransaction | KyselyTransaction | DrizzleTransaction;

/** A caller's `tx` as the method ordo calls, or invalid_argument saying what is accepted. */
export function asQueryable(tx: unknown): Queryable {
  return recognise(tx);
}
