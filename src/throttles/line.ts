import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import type { Notifications } from '../db/notifications.js';
import { OrdoError, toOrdoError } from '../errors.js';
import type { ThrottlePlans } from './plans.js';

/** One item of a request: `cost` units of throttle `name` for `key`. */
export interface Item {
  name: string;
  key: string;
  cost: number;
}

/** A decision row, as acquire_all and throttle_wait answer it. */
export type Decision = Record<string, any>;

/** How long a waiter stays in line without being renewed: a process killed leaves it this soon. */
const ALIVE_MS = 3000;
/** Renewals, and the look for waiters served without a notification that reached us. */
const KEEP_EVERY_MS = 1000;
/** The longest a waiter sleeps between looks when nothing wakes it (a lease that ran out, a lost notification). */
const FALLBACK_MS = 1000;

interface Waiter {
  id: string;
  items: Item[];
  holder: string;
  deadline: number;
  resolve(decision: Decision): void;
  reject(error: unknown): void;
  timer: NodeJS.Timeout | undefined;
  /** An attempt is in flight; `again`: another was asked for meanwhile. */
  busy: boolean;
  again: boolean;
  /** Asked to leave while an attempt was in flight: it leaves when that attempt ends. */
  leaving: boolean;
  last: Decision | undefined;
}

/**
 * The requests of this client that wait in line (see the SQL function throttle_wait). The line itself
 * lives in the database, shared by every process: this module keeps its own waiters alive,
 * and looks again when something may have changed for them: a grant made on their behalf or
 * a permit ended (both by NOTIFY), the wait the line was last given (a timer), or, as a
 * fallback, every second. A waiter that reaches its deadline leaves the line and is answered
 * with its last refusal (or with the permit, if it was served meanwhile).
 */
export class WaitingLine {
  private readonly waiters = new Map<string, Waiter>();
  private readonly unanswered = new Set<Promise<Decision>>();
  private keeper: NodeJS.Timeout | undefined;
  private unlisten: (() => void) | undefined;

  constructor(
    private readonly pool: pg.Pool,
    private readonly plans: ThrottlePlans,
    private readonly notifications: Notifications,
    private readonly query: (text: string, values: unknown[]) => Promise<{ rows: any[] }>,
  ) {}

  /** Waits at most `waitMs` for the request's turn (or until `signal` aborts); answers as acquire_all does. */
  wait(items: Item[], holder: string, waitMs: number, signal?: AbortSignal): Promise<Decision> {
    this.listen();
    const answer = new Promise<Decision>((resolve, reject) => {
      const w: Waiter = {
        id: randomUUID(),
        items,
        holder,
        deadline: performance.now() + waitMs,
        resolve,
        reject,
        timer: undefined,
        busy: false,
        again: false,
        leaving: false,
        last: undefined,
      };
      this.waiters.set(w.id, w);
      this.keepAlive();
      if (signal?.aborted) return void this.leave(w);
      signal?.addEventListener('abort', () => void this.leave(w), { once: true });
      void this.attempt(w);
    });
    this.unanswered.add(answer);
    const answered = () => void this.unanswered.delete(answer);
    answer.then(answered, answered);
    return answer;
  }

  /** Every waiter leaves the line now, answered with its last refusal (or its permit). */
  async close(): Promise<void> {
    await Promise.all([...this.waiters.values()].map((w) => this.leave(w)));
    // Those whose attempt was in flight leave when it ends.
    await Promise.allSettled([...this.unanswered]);
    this.unlisten?.();
    this.unlisten = undefined;
  }

  private listen(): void {
    this.unlisten ??= this.notifications.on(this.plans.channel, {
      message: (payload) => this.heard(payload),
      reset: () => {
        for (const w of this.waiters.values()) void this.attempt(w);
      },
      listening: () => {
        for (const w of this.waiters.values()) void this.attempt(w);
      },
    });
  }

  /**
   * 'granted:<waiter>' picks that permit up; 'freed:<throttle>' serves its lines once (one
   * waiter of ours asks, the line is served whole); 'serve:<ms>:<throttles>' is when a line
   * refused its first waiters until.
   */
  private heard(payload: string): void {
    const [what, rest = ''] = splitOnce(payload, ':');
    if (what === 'granted') {
      const w = this.waiters.get(rest);
      if (w) void this.attempt(w);
    } else if (what === 'freed') {
      const w = this.oldestOn([rest]);
      if (w) void this.attempt(w);
    } else if (what === 'serve') {
      const [ms, names = ''] = splitOnce(rest, ':');
      const w = this.oldestOn(names.split(','));
      if (w) this.schedule(w, Number(ms));
    }
  }

  private oldestOn(names: string[]): Waiter | undefined {
    for (const w of this.waiters.values()) if (w.items.some((i) => names.includes(i.name))) return w;
    return undefined;
  }

  /** One call of throttle_wait for `w`: renews it, serves its lines, and answers it if served. */
  private async attempt(w: Waiter): Promise<void> {
    if (w.busy) {
      w.again = true;
      return;
    }
    if (!this.waiters.has(w.id)) return;
    w.busy = true;
    clearTimeout(w.timer);
    try {
      const { rows } = await this.query(this.plans.wait, [
        w.id,
        w.items.map((i) => i.name),
        w.items.map((i) => i.key),
        w.items.map((i) => i.cost),
        w.holder,
        ALIVE_MS,
      ]);
      const d = rows[0]!;
      if (d.granted) return this.answer(w, d);
      w.last = d;
      const hint = Math.min(Number(d.retry_after_ms), d.next_ms === null ? Infinity : Number(d.next_ms));
      // A waiter behind others ('queued') hears of its grant; the first in line knows its wait.
      this.schedule(w, d.reason === 'queued' ? Infinity : hint);
    } catch (e) {
      const error = toOrdoError(e);
      // A key held by a caller's transaction past the lock timeout, or the database away for
      // a moment: the waiter stays in line and looks again.
      if (error.code === 'timeout' || error.code === 'database_unavailable') this.schedule(w, 50);
      else {
        this.drop(w);
        void this.query(this.plans.leave, [w.id]).catch(() => undefined);
        w.reject(error);
      }
    } finally {
      w.busy = false;
      if (w.leaving) void this.leave(w);
      else if (w.again && this.waiters.has(w.id)) {
        w.again = false;
        void this.attempt(w);
      }
    }
  }

  /** The next look at `w`: after `ms`, at most FALLBACK_MS (shorter while notifications are lost), never past its deadline. */
  private schedule(w: Waiter, ms: number): void {
    if (!this.waiters.has(w.id)) return;
    clearTimeout(w.timer);
    const left = w.deadline - performance.now();
    if (left <= 0) return void this.leave(w);
    const fallback = this.notifications.pollInterval(FALLBACK_MS);
    const wait = Math.max(1, Math.min(ms, fallback));
    w.timer =
      wait >= left
        ? setTimeout(() => void this.leave(w), left)
        : setTimeout(() => void this.attempt(w), wait);
  }

  /**
   * Out of the line at the deadline (or at close, or on abort): with the permit if it was
   * served meanwhile. Not while an attempt is in flight: that attempt may enter the line again
   * (its row deleted under it) or be granted, and a permit answered to nobody would stay held
   * until its lease ran out; the attempt leaves when it ends, unless it was granted.
   */
  private async leave(w: Waiter): Promise<void> {
    if (!this.waiters.has(w.id)) return;
    if (w.busy) {
      w.leaving = true;
      return;
    }
    this.drop(w);
    try {
      const { rows } = await this.query(this.plans.leave, [w.id]);
      const served = rows[0];
      if (served?.permit_id) {
        w.resolve({ granted: true, ...served });
        return;
      }
      w.resolve(
        w.last ?? { granted: false, retry_after_ms: 0, reason: 'queued', limit_name: null, limit_key: null },
      );
    } catch (e) {
      w.reject(toOrdoError(e));
    }
  }

  private answer(w: Waiter, d: Decision): void {
    this.drop(w);
    w.resolve(d);
  }

  private drop(w: Waiter): void {
    clearTimeout(w.timer);
    this.waiters.delete(w.id);
    if (this.waiters.size === 0) {
      clearInterval(this.keeper);
      this.keeper = undefined;
    }
  }

  /** Renews this client's waiters; those served without a notification that reached us are picked up. */
  private keepAlive(): void {
    if (this.keeper) return;
    this.keeper = setInterval(() => {
      const ids = [...this.waiters.keys()];
      if (ids.length === 0) return;
      this.query(this.plans.keepWaiting, [ids, ALIVE_MS])
        .then(({ rows }) => {
          const alive = new Set<string>();
          for (const r of rows) {
            alive.add(r.waiter);
            const w = this.waiters.get(r.waiter);
            if (w && r.served) void this.attempt(w);
          }
          // Gone from the line (its throttle removed, or lapsed while the database was away):
          // stand in it again, or hear why not.
          for (const id of ids) {
            const w = this.waiters.get(id);
            if (w && !alive.has(id) && !w.busy) void this.attempt(w);
          }
        })
        .catch(() => undefined);
    }, KEEP_EVERY_MS);
    this.keeper.unref();
  }
}

function splitOnce(text: string, separator: string): [string, string | undefined] {
  const i = text.indexOf(separator);
  return i < 0 ? [text, undefined] : [text.slice(0, i), text.slice(i + 1)];
}

export function waitingWithTx(): OrdoError {
  return new OrdoError(
    'invalid_argument',
    'wait cannot be used with tx: a request waits in a line other processes must see, outside your transaction',
  );
}
