import pg from 'pg';
import { nullable } from '../db/arrays.js';
import { describe, invalid, knownKeys, MAX_TEXT, NOT_UNICODE, plainObject, text } from '../validate.js';

/** What an application appends. */
export interface MessageInput {
  /** What happened, such as 'OrderPlaced' (1–200 characters). */
  type: string;
  /** Any JSON value. */
  data: unknown;
  /** Groups messages that belong together, such as the order's id (at most 200 characters). */
  key?: string | null;
  /** A message_id the topic already holds is not stored again: retries are harmless. */
  messageId?: string | null;
  /** A JSON object of metadata (trace ids, …). */
  headers?: Record<string, unknown>;
}

/** One appended message: its position, or `duplicate` when its messageId was already stored. */
export interface Appended {
  messageId: string | null;
  position: number | null;
  transactionId: string | null;
  duplicate: boolean;
}

/** A message as a consumer receives it. */
export interface OutboxMessage<T = unknown> {
  position: number;
  /** The id of the transaction that appended it (xid8, as text: it may exceed 2^53). */
  transactionId: string;
  topic: string;
  type: string;
  key: string | null;
  messageId: string | null;
  data: T;
  headers: Record<string, unknown>;
  createdAt: Date;
}

/** The most messages one append may carry. */
export const MAX_APPEND = 10_000;
/** Topics and subscription names: also used in URLs and NOTIFY payloads. */
/** Topics and subscription names, as a JSON schema pattern too (the HTTP routes read it). */
export const OUTBOX_NAME_PATTERN = `^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,${MAX_TEXT - 1}}$`;
const NAME = new RegExp(OUTBOX_NAME_PATTERN);
const MESSAGE_KEYS = ['type', 'data', 'key', 'messageId', 'headers'] as const;

export function outboxName(what: string, value: unknown): string {
  if (typeof value !== 'string' || !NAME.test(value)) {
    throw invalid(
      `${what} must be 1 to ${MAX_TEXT} letters, digits or _ . : - (not starting with . : -) (got ${describe(value)})`,
    );
  }
  return value;
}

export interface Columns {
  types: string[];
  data: string[];
  keys: (string | null)[];
  messageIds: (string | null)[];
  headers: (string | null)[];
}

/** Checks every message before anything is written, and lays them out as columns. */
export function toColumns(input: unknown): Columns {
  const list = Array.isArray(input) ? input : [input];
  if (list.length === 0) throw invalid('append needs at least one message');
  if (list.length > MAX_APPEND)
    throw invalid(`append takes at most ${MAX_APPEND} messages (got ${list.length})`);
  const columns: Columns = { types: [], data: [], keys: [], messageIds: [], headers: [] };
  list.forEach((item, i) => {
    const what = list.length === 1 ? 'message' : `message ${i}`;
    const m = plainObject(what, item);
    knownKeys(what, m, MESSAGE_KEYS);
    columns.types.push(text(`${what}.type`, m.type, 1, MAX_TEXT));
    columns.data.push(json(`${what}.data`, m.data));
    columns.keys.push(m.key == null ? null : text(`${what}.key`, m.key, 0, MAX_TEXT));
    columns.messageIds.push(m.messageId == null ? null : text(`${what}.messageId`, m.messageId, 1, MAX_TEXT));
    // Absent headers are stored as {} by append_answer, which spares sending them.
    columns.headers.push(
      m.headers === undefined ? null : json(`${what}.headers`, plainObject(`${what}.headers`, m.headers)),
    );
  });
  return columns;
}

/** JSON.stringify writes lone surrogates as \uD8xx–\uDFxx escapes (pairs it writes as they are). */
const ESCAPED_SURROGATE = /(?<!\\)(?:\\\\)*\\u[dD][89a-fA-F][0-9a-fA-F]{2}/;

function json(what: string, value: unknown): string {
  let encoded: string | undefined;
  try {
    encoded = JSON.stringify(value);
  } catch (e) {
    throw invalid(`${what} cannot be stored as JSON: ${(e as Error).message}`);
  }
  if (encoded === undefined) throw invalid(`${what} must be a JSON value (got ${describe(value)})`);
  // Most JSON holds no escape at all: the look-behind is run only on text that does.
  if (encoded.includes('\\u') && ESCAPED_SURROGATE.test(encoded)) throw invalid(`${what} ${NOT_UNICODE}`);
  return encoded;
}

/**
 * What became of each message given. append_answer() answers with the transaction's id, then
 * each message's position in the order given, null for a message whose id was stored before
 * (in the same call or earlier).
 */
export function appendedOf(columns: Columns, answer: (string | null)[]): Appended[] {
  const transactionId = answer[0]!;
  return columns.messageIds.map((messageId, i) => {
    const position = nullable(answer[i + 1] ?? null);
    return position === null
      ? { messageId, position: null, transactionId: null, duplicate: true }
      : { messageId, position: Number(position), transactionId, duplicate: false };
  });
}

export function toMessage(row: Record<string, any>): OutboxMessage {
  return {
    position: Number(row.position),
    transactionId: row.transaction_id,
    topic: row.topic,
    type: row.type,
    key: row.key,
    messageId: row.message_id,
    data: row.data,
    headers: row.headers ?? {},
    createdAt: instant(Number(row.created_s)),
  };
}

/**
 * A message's instant from `date_part('epoch', created_at)`, which PostgreSQL computes as the
 * microseconds divided by 10^6 in a float8: the microseconds are recovered exactly (the product
 * below may be a unit off them past 2106), then cut to the millisecond as Date cuts.
 */
export function instant(seconds: number): Date {
  let micros = Math.round(seconds * 1e6);
  for (let i = 0; i < 3 && micros / 1e6 > seconds; i++) micros--;
  for (let i = 0; i < 3 && micros / 1e6 < seconds; i++) micros++;
  return new Date(micros / 1000);
}

/** A batch a consumer received: its messages, and the partition's version and attempt. */
export interface Batch {
  messages: OutboxMessage[];
  version: string;
  attempt: number;
}

/**
 * Reads a batch: `text` selects the plans' message fields (without the topic, the
 * subscription's), then the version and the attempt. Each row becomes a message as it arrives
 * and is not kept: pg keeps every parsed row until the statement ends, and those rows, alive
 * beside the messages of a large batch, would cost the consumer garbage collection per message.
 * The fields are read as PostgreSQL writes them, without pg's type parsers.
 */
export function readBatch(
  client: pg.ClientBase,
  text: string,
  values: unknown[],
  topic: string,
): Promise<Batch> {
  return new Promise((resolve, reject) => {
    client.query(new BatchQuery(text, values, topic, resolve, reject));
  });
}

/** pg's Query, with the handler of a row description that BatchQuery extends (as pg-cursor does). */
const Query = pg.Query as unknown as new (
  config: pg.QueryConfig,
  callback: (error: Error | undefined) => void,
) => pg.Query & { handleRowDescription(msg: { fields: { format: string }[] }): void };

class BatchQuery extends Query {
  private readonly batch: Batch = { messages: [], version: '', attempt: 0 };
  private failure: unknown;

  constructor(
    text: string,
    values: unknown[],
    private readonly topic: string,
    resolve: (batch: Batch) => void,
    reject: (e: unknown) => void,
  ) {
    // The callback, not the query's events: pg reports a read timeout (query_timeout) only there.
    super({ text, values }, (error) => {
      if (error ?? this.failure) reject(error ?? this.failure);
      else resolve(this.batch);
    });
  }

  override handleRowDescription(msg: { fields: { format: string }[] }): void {
    if (msg.fields.some((f) => f.format !== 'text')) {
      this.failure ??= new Error(
        "the outbox consumer reads text results: the pool's clients must not set binary",
      );
    }
    super.handleRowDescription(msg);
  }

  /** Called by pg for each row, from the socket's data handler: it must not throw. */
  handleDataRow(msg: { fields: (string | null)[] }): void {
    if (this.failure !== undefined) return;
    try {
      const f = msg.fields;
      const headers = f[6];
      this.batch.messages.push({
        position: Number(f[0]),
        transactionId: f[1]!,
        topic: this.topic,
        type: f[2]!,
        key: f[3] ?? null,
        messageId: f[4] ?? null,
        data: JSON.parse(f[5]!),
        headers: headers == null ? {} : JSON.parse(headers),
        createdAt: instant(Number(f[7])),
      });
      if (this.batch.messages.length === 1) {
        this.batch.version = f[8]!;
        this.batch.attempt = Number(f[9]);
      }
    } catch (e) {
      this.failure = e;
    }
  }
}
