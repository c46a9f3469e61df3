import type { PostgresPool, PostgresPoolClient } from 'kysely';
import type { Sql } from 'postgres';

/**
 * Kysely's own PostgresDialect on postgres.js, with no other package: each Kysely connection
 * is a reserved postgres.js connection and each statement runs as
 * `reserved.unsafe(text, parameters)`, as the kysely-postgres-js dialect does.
 */
export function postgresJsPool(sql: Sql): PostgresPool {
  return {
    async connect() {
      const reserved = await sql.reserve();
      const client = {
        async query(text: string, parameters: readonly unknown[]) {
          const result = await reserved.unsafe(text, [...parameters] as never[]);
          return { command: result.command, rowCount: result.count, rows: [...result] };
        },
        release: () => reserved.release(),
      };
      return client as unknown as PostgresPoolClient;
    },
    end: () => sql.end(),
  };
}
