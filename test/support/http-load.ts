// HTTP clients of `ordo serve` taking numbers while the database is knocked about (restarts,
// failovers): each logical call keeps its Idempotency-Key through its retries until a 200, and
// everything they saw is counted, so that a test can say no number was lost or given twice, no
// 500 came and every 503 said when to come back.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { ServerProcess } from './server-process.js';

/** Retry-After is honoured, but capped to keep the tests fast. */
const RETRY_AFTER_CAP_MS = 200;
/** A request not answered within this counts as hung (statementTimeout is 30 s, connectTimeout 10 s). */
export const REQUEST_TIMEOUT_MS = 15_000;

/** What the HTTP clients saw. */
export interface HttpLoad {
  /** Answers by status; 0 for a request that failed without an answer (connection error). */
  statuses: Map<number, number>;
  /** 503s without a Retry-After header. */
  withoutRetryAfter: number;
  /** Bodies of answers other than 200 and 503 (a few kept, for the failure message). */
  unexpected: string[];
  /** Requests that got no answer within REQUEST_TIMEOUT_MS. */
  hung: number;
  /** Logical calls given up (not answered 200 within 30 s of retrying): their numbers would be lost. */
  abandoned: number;
  /** Every value the clients hold, one entry per value received. */
  held: number[];
  /** Logical calls completed, and those that needed more than one request. */
  calls: number;
  retried: number;
  longestMs: number;
  /** performance.now() of the latest 200. */
  lastOkAt: number;
}

export function newLoad(): HttpLoad {
  return {
    statuses: new Map(),
    withoutRetryAfter: 0,
    unexpected: [],
    hung: 0,
    abandoned: 0,
    held: [],
    calls: 0,
    retried: 0,
    longestMs: 0,
    lastOkAt: 0,
  };
}

const count = (load: HttpLoad, status: number) =>
  load.statuses.set(status, (load.statuses.get(status) ?? 0) + 1);

/**
 * One HTTP client: logical calls of `POST /v1/sequences/:name/next` until `running()` turns
 * false. With keys, each logical call has a fresh Idempotency-Key, sent again unchanged after a
 * 503 or a connection error until a 200 comes; a call under way is finished before the client
 * stops, so that every number it was given is held. Without keys, a retry is a new call.
 */
export async function httpClient(
  url: string,
  sequence: string,
  withKeys: boolean,
  running: () => boolean,
  load: HttpLoad,
) {
  while (running()) {
    const key = withKeys ? randomUUID() : undefined;
    const giveUpAt = performance.now() + 30_000;
    for (let attempt = 0; ; attempt++) {
      if (performance.now() > giveUpAt) {
        load.abandoned++;
        break;
      }
      if (attempt === 1) load.retried++;
      const started = performance.now();
      let status: number;
      let retryAfter: string | null = null;
      let body = '';
      try {
        const response = await fetch(`${url}/v1/sequences/${sequence}/next`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', ...(key ? { 'idempotency-key': key } : {}) },
          body: '{}',
          signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
        });
        status = response.status;
        retryAfter = response.headers.get('retry-after');
        body = await response.text();
      } catch (e) {
        if ((e as Error).name === 'TimeoutError') load.hung++;
        status = 0;
      }
      load.longestMs = Math.max(load.longestMs, performance.now() - started);
      count(load, status);
      if (status === 200) {
        load.held.push(...(JSON.parse(body) as { values: number[] }).values);
        load.calls++;
        load.lastOkAt = performance.now();
        break;
      }
      if (status === 503) {
        if (retryAfter === null) load.withoutRetryAfter++;
        const seconds = Number(retryAfter ?? 1);
        await sleep(Math.min(Number.isFinite(seconds) ? seconds * 1000 : 1000, RETRY_AFTER_CAP_MS));
      } else if (status === 0) {
        await sleep(20);
      } else {
        if (load.unexpected.length < 10) load.unexpected.push(`${status} ${body}`);
        // A 500 may come from a statement that committed: the same key is sent again.
        await sleep(50);
      }
      if (!withKeys && !running()) break;
    }
  }
}

/** Waits until a 200 arrives after `since` (performance.now()); returns how long after it. */
export async function recovered(load: HttpLoad, since: number, timeoutMs = 15_000): Promise<number> {
  while (load.lastOkAt <= since) {
    if (performance.now() - since > timeoutMs) throw new Error(`no 200 within ${timeoutMs} ms of the blow`);
    await sleep(10);
  }
  return load.lastOkAt - since;
}

export function summary(load: HttpLoad): Record<string, unknown> {
  return {
    statuses: Object.fromEntries([...load.statuses].sort(([a], [b]) => a - b)),
    calls: load.calls,
    retriedCalls: load.retried,
    values: load.held.length,
    longestMs: Math.round(load.longestMs),
    hung: load.hung,
    abandoned: load.abandoned,
    unexpected: load.unexpected,
  };
}

/** The error lines `ordo serve` logged (pino level 50), by message, with a count. */
export function serverErrors(serve: ServerProcess): Record<string, number> {
  const out: Record<string, number> = {};
  for (const line of serve.logs()) {
    if (typeof line.level !== 'number' || line.level < 50) continue;
    const err = line.err as { message?: string; code?: string; type?: string } | undefined;
    const what = `${String(line.msg)}: ${err?.type ?? ''} ${err?.code ?? ''} ${err?.message ?? ''}`.trim();
    out[what] = (out[what] ?? 0) + 1;
  }
  return out;
}
