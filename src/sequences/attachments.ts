import { durationOption } from '../durations.js';
import { identifier, knownKeys, plainObject, text } from '../validate.js';

/** Where a sequence writes its numbers at commit. */
export interface AttachOptions {
  /**
   * The table, as SQL names it: `invoices`, `billing.invoices`, `"Invoices"` (resolved on the
   * search_path of ordo's connections when not qualified). A partitioned table numbers every
   * partition, those created later too.
   */
  table: string;
  /** The column receiving the value (bigint, integer, smallint or numeric; nullable, no default). */
  column: string;
  /**
   * The column whose value (as text) is the scope: numbering per tenant. Null counts as ''.
   * text, varchar, smallint, integer, bigint or uuid: the text of a date, a timestamp or a
   * float depends on the session's settings, and would put the same row in other counters.
   */
  scopeColumn?: string;
  /** A text column receiving the formatted number. */
  textColumn?: string;
}

export interface DetachOptions {
  table: string;
  column: string;
  /**
   * How long to wait for the table (milliseconds, or a duration such as '10s'); 5s by default.
   * Removing the triggers needs the table alone, so detach waits for every transaction reading
   * or writing it, and statements arriving meanwhile queue behind it. Past this, detach fails
   * with `timeout` and changes nothing.
   */
  lockTimeout?: number | string;
}

export interface Attachment {
  sequence: string;
  /** As PostgreSQL prints it: qualified when not on the search_path. */
  table: string;
  column: string;
  scopeColumn: string | null;
  textColumn: string | null;
}

/** The transaction holding a counter of a sequence in the in-transaction mode. */
export interface CounterHolder {
  sequence: string;
  scope: string;
  period: string | null;
  /** The backend; null for a prepared (two-phase) transaction. */
  pid: number | null;
  /** Set for a prepared transaction: COMMIT PREPARED or ROLLBACK PREPARED it. */
  preparedGid: string | null;
  /** How long its transaction has been open. */
  openForMs: number | null;
  /** 'idle in transaction' is the forgotten one; 'active' a long statement. */
  state: string | null;
  applicationName: string | null;
  /**
   * Transactions waiting for it: on this counter when PostgreSQL shows which row a waiter wants,
   * else on the holder's first counter (so that a sum over counters counts each waiter once).
   */
  waiting: number;
}

/** Table names may be schema-qualified and quoted; PostgreSQL's own limit is 63 bytes a part. */
const MAX_TABLE_LENGTH = 300;
const MAX_COLUMN_LENGTH = 63;

export interface CheckedAttach {
  table: string;
  column: string;
  scopeColumn: string | null;
  textColumn: string | null;
}

export function checkAttach(sequence: string, options: AttachOptions): [string, CheckedAttach] {
  const o = plainObject('attach options', options);
  knownKeys('sequences.attach', o, ['table', 'column', 'scopeColumn', 'textColumn']);
  const optional = (what: string, value: unknown) =>
    value === undefined || value === null ? null : text(what, value, 1, MAX_COLUMN_LENGTH);
  return [
    identifier('name', sequence),
    {
      table: text('table', o.table, 1, MAX_TABLE_LENGTH),
      column: text('column', o.column, 1, MAX_COLUMN_LENGTH),
      scopeColumn: optional('scopeColumn', o.scopeColumn),
      textColumn: optional('textColumn', o.textColumn),
    },
  ];
}

/** detach's wait for the table by default, and at most. */
export const DETACH_LOCK_TIMEOUT_MS = 5_000;
const MAX_DETACH_LOCK_TIMEOUT_MS = 3_600_000;

export function checkDetach(sequence: string, options: DetachOptions): [string, string, string, number] {
  const o = plainObject('detach options', options);
  knownKeys('sequences.detach', o, ['table', 'column', 'lockTimeout']);
  return [
    identifier('name', sequence),
    text('table', o.table, 1, MAX_TABLE_LENGTH),
    text('column', o.column, 1, MAX_COLUMN_LENGTH),
    o.lockTimeout === undefined
      ? DETACH_LOCK_TIMEOUT_MS
      : durationOption('lockTimeout', o.lockTimeout, 1, MAX_DETACH_LOCK_TIMEOUT_MS),
  ];
}

export function toAttachment(row: Record<string, any>): Attachment {
  return {
    sequence: row.sequence,
    table: row.table_name,
    column: row.column_name,
    scopeColumn: row.scope_column,
    textColumn: row.text_column,
  };
}

export function toHolder(row: Record<string, any>): CounterHolder {
  return {
    sequence: row.sequence,
    scope: row.scope,
    period: row.period,
    pid: row.pid,
    preparedGid: row.prepared_gid,
    openForMs: row.xact_start === null ? null : Math.max(0, row.now.getTime() - row.xact_start.getTime()),
    state: row.state,
    applicationName: row.application_name,
    waiting: Number(row.waiting),
  };
}
