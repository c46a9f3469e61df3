import { invalid } from '../validate.js';

/**
 * The one thing ordo needs from a connection: run a statement with parameters and return
 * rows. A `pg` Pool, Client or PoolClient fits as it is; adapters for other drivers only
 * need this method.
 */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: any[] }>;
}

export function asQueryable(tx: unknown): Queryable {
  if (typeof (tx as Queryable | null)?.query !== 'function') {
    throw invalid('tx must be a pg Client/PoolClient or an object with query(text, values)');
  }
  return tx as Queryable;
}
