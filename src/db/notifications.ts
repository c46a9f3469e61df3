import { randomBytes } from 'node:crypto';
import { setTimeout as delay } from 'node:timers/promises';
import type pg from 'pg';
import type { Log } from '../config.js';
import { backoffDelay } from './backoff.js';
import { quoteIdent } from './migrations.js';

/** What a caller hears on a channel: a payload, or that anything may have been missed. */
export interface ChannelHandlers {
  message(payload: string): void;
  /** The connection was lost and is back, or notifications turned out not to arrive. */
  reset(): void;
  /**
   * LISTEN on the channel has taken effect (first, and again after each reconnection): what
   * was sent before it was not heard. A caller that waits for notifications looks once now.
   */
  listening?(): void;
}

export type NotificationState = 'ok' | 'lost' | 'disconnected';

export interface NotificationStatus {
  /** 'listenUrl': LISTEN goes its own route; 'database': the same route as every query. */
  route: 'listenUrl' | 'database';
  /**
   * 'ok': a NOTIFY sent through the pool came back; 'lost': it did not (a pooler in
   * transaction mode hands the LISTEN's server connection to other clients); 'disconnected':
   * the LISTEN connection is down and being re-established.
   */
  state: NotificationState;
  since: Date;
  /** What to do about it, when not ok. */
  message: string | null;
}

/** Waits that never keep the process alive: stop() ends every wait by racing them. */
const sleep = (ms: number) => delay(ms, undefined, { ref: false });

/** How long a probe may take to come back before notifications count as lost. */
const PROBE_TIMEOUT_MS = 3000;
/** Probes are sent again this often, so a route that changes (a failover, a new pooler) is noticed. */
const PROBE_EVERY_MS = 60_000;
/** While notifications are lost, nothing that waits for one waits longer than this. */
export const LOST_POLL_MS = 100;

/**
 * The one LISTEN connection of an Ordo, for every channel of every module. It checks that
 * notifications really arrive, by a NOTIFY sent through the pool to a channel of its own:
 * behind PgBouncer in transaction mode LISTEN succeeds, yet nothing ever comes back. Every loss,
 * reconnection or lost probe calls each channel's reset(), since anything may have been missed.
 */
export class Notifications {
  private readonly channels = new Map<string, Set<ChannelHandlers>>();
  private readonly probeChannel = `ordo_probe_${randomBytes(8).toString('hex')}`;
  private client: pg.Client | undefined;
  private running: Promise<void> | undefined;
  private listening = new Set<string>();
  private current: NotificationStatus;
  private verdict: Promise<void> | undefined;
  private settle: (() => void) | undefined;
  private probeToken: string | undefined;
  private probeArrived: (() => void) | undefined;
  private warned = false;
  private isStopped = false;
  private stopping: (() => void) | undefined;
  private readonly stopped = new Promise<void>((resolve) => {
    this.stopping = resolve;
  });

  constructor(
    private readonly connect: () => pg.Client,
    /** Sends `NOTIFY channel, payload` through the pool, where ordo's other statements go. */
    private readonly notifyThroughPool: (channel: string, payload: string) => Promise<unknown>,
    route: NotificationStatus['route'],
    private readonly log: Log,
  ) {
    this.current = { route, state: 'disconnected', since: new Date(), message: 'not connected yet' };
  }

  /** Hears `channel` from now on; the connection is opened on first use. Returns the way to stop. */
  on(channel: string, handlers: ChannelHandlers): () => void {
    let set = this.channels.get(channel);
    if (!set) this.channels.set(channel, (set = new Set()));
    set.add(handlers);
    this.start();
    if (this.client && !this.listening.has(channel))
      void this.listen(this.client, channel).catch(() => undefined);
    return () => set.delete(handlers);
  }

  /** `ms`, or at most LOST_POLL_MS while notifications are known not to arrive. */
  pollInterval(ms: number): number {
    return this.current.state === 'lost' ? Math.min(ms, LOST_POLL_MS) : ms;
  }

  /** Whether notifications arrive, once the first probe has been answered (or has timed out). */
  async status(): Promise<NotificationStatus> {
    this.start();
    await Promise.race([this.firstVerdict(), this.stopped, sleep(PROBE_TIMEOUT_MS * 2)]);
    return { ...this.current };
  }

  async stop(): Promise<void> {
    this.isStopped = true;
    this.stopping?.();
    await this.client?.end().catch(() => undefined);
    await this.running;
  }

  private start(): void {
    if (!this.isStopped) this.running ??= this.loop();
  }

  private firstVerdict(): Promise<void> {
    this.verdict ??= new Promise((resolve) => {
      this.settle = resolve;
    });
    if (this.current.state !== 'disconnected') this.settle?.();
    return this.verdict;
  }

  private setState(state: NotificationState, message: string | null): void {
    if (state === this.current.state) return;
    this.current = { ...this.current, state, since: new Date(), message };
    if (state !== 'disconnected') this.settle?.();
    if (state === 'lost') {
      // Said once per client: a pooler does not come and go.
      if (!this.warned) this.log({ level: 'warn', code: 'notifications_lost', message: message! });
      this.warned = true;
      // Waits planned for a notification are cut short, now that none will come.
      this.resetAll();
    }
  }

  private resetAll(): void {
    for (const set of this.channels.values()) for (const h of set) h.reset();
  }

  private async listen(client: pg.Client, channel: string): Promise<void> {
    this.listening.add(channel);
    await client.query(`LISTEN ${quoteIdent(channel)}`).catch((e: unknown) => {
      this.listening.delete(channel);
      throw e;
    });
    for (const h of this.channels.get(channel) ?? []) h.listening?.();
  }

  private async loop(): Promise<void> {
    let listenedBefore = false;
    for (let attempt = 0; !this.isStopped; attempt++) {
      const client = this.connect();
      this.client = client;
      this.listening = new Set();
      const lost = new Promise<void>((resolve) => {
        client.on('error', () => resolve());
        client.on('end', () => resolve());
      });
      try {
        await Promise.race([client.connect(), this.stopped]);
        if (this.isStopped) break;
        client.on('notification', (n) => this.deliver(n.channel, n.payload ?? ''));
        for (const channel of [this.probeChannel, ...this.channels.keys()]) {
          await Promise.race([this.listen(client, channel), this.stopped]);
        }
        if (this.isStopped) break;
        // Back after a loss: anything may have changed while nobody listened.
        if (listenedBefore) this.resetAll();
        listenedBefore = true;
        attempt = 0;
        await this.probeUntil(lost);
      } catch {
        // Could not connect or listen: try again after a pause.
      }
      this.client = undefined;
      client.end().catch(() => undefined);
      if (this.isStopped) break;
      this.setState('disconnected', 'the LISTEN connection was lost; reconnecting');
      this.resetAll();
      await Promise.race([sleep(backoffDelay(attempt)), this.stopped]);
    }
  }

  /** Probes now and every PROBE_EVERY_MS until the connection is lost or ordo stops. */
  private async probeUntil(lost: Promise<void>): Promise<void> {
    let ended = false;
    void lost.then(() => (ended = true));
    while (!ended && !this.isStopped) {
      const arrived = await this.probe(lost);
      if (ended || this.isStopped) return;
      if (arrived === true) this.setState('ok', null);
      else if (arrived === false) {
        this.setState(
          'lost',
          `Notifications sent through the database connection do not reach ordo's LISTEN connection ` +
            `(a connection pooler in transaction mode, such as PgBouncer, does this). ordo now polls ` +
            `every ${LOST_POLL_MS} ms instead of waiting for them. Give ordo a direct route for LISTEN ` +
            `with the listenUrl option (--listen-url, ORDO_LISTEN_URL).`,
        );
      }
      await Promise.race([sleep(PROBE_EVERY_MS), lost, this.stopped]);
    }
  }

  /** true: came back; false: did not within PROBE_TIMEOUT_MS; undefined: could not be sent. */
  private async probe(lost: Promise<void>): Promise<boolean | undefined> {
    const token = randomBytes(8).toString('hex');
    this.probeToken = token;
    const arrived = new Promise<true>((resolve) => {
      this.probeArrived = () => resolve(true);
    });
    try {
      await this.notifyThroughPool(this.probeChannel, token);
    } catch {
      return undefined; // the database is unreachable: no verdict on notifications
    }
    // Timed from the commit of the NOTIFY, so a busy pool does not count against the route.
    const result = await Promise.race([
      arrived,
      sleep(PROBE_TIMEOUT_MS).then(() => false as const),
      lost.then(() => undefined),
      this.stopped.then(() => undefined),
    ]);
    this.probeToken = undefined;
    return result;
  }

  private deliver(channel: string, payload: string): void {
    if (channel === this.probeChannel) {
      if (payload === this.probeToken) this.probeArrived?.();
      return;
    }
    for (const h of this.channels.get(channel) ?? []) h.message(payload);
  }
}
