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
  /** The column whose value (as text) is the scope: numbering per tenant. Null counts as ''. */
  scopeColumn?: string;
  /** A text column receiving the formatted number. */
  textColumn?: string;
}

export interface DetachOptions {
  table: string;
  column: string;
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
  /** Transactions waiting for it to end. */
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

export function checkDetach(sequence: string, options: DetachOptions): [string, string, string] {
  const o = plainObject('detach options', options);
  knownKeys('sequences.detach', o, ['table', 'column']);
  return [
    identifier('name', sequence),
    text('table', o.table, 1, MAX_TABLE_LENGTH),
    text('column', o.column, 1, MAX_COLUMN_LENGTH),
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
