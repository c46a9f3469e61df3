import { setTimeout as sleep } from 'node:timers/promises';
import type pg from 'pg';
import { backoffDelay } from '../sequences/batched.js';
import { quoteIdent } from './migrations.js';

/**
 * A dedicated connection that LISTENs on one channel. While it is down, notifications may be
 * lost, so every loss and every reconnection calls onReset: callers drop what a missed
 * notification could have invalidated. It reconnects with back-off until stopped.
 */
export class Listener {
  private client: pg.Client | undefined;
  private running: Promise<void> | undefined;
  private listenedBefore = false;
  private stopping: (() => void) | undefined;
  /** Resolves when stop() is called: every wait in the loop races it. */
  private readonly stopped = new Promise<void>((resolve) => {
    this.stopping = resolve;
  });
  private isStopped = false;

  constructor(
    private readonly connect: () => pg.Client,
    private readonly channel: string,
    private readonly onMessage: (payload: string) => void,
    private readonly onReset: () => void,
  ) {}

  start(): void {
    this.running ??= this.loop();
  }

  async stop(): Promise<void> {
    this.isStopped = true;
    this.stopping?.();
    await this.client?.end().catch(() => undefined);
    await this.running;
  }

  private async loop(): Promise<void> {
    for (let attempt = 0; !this.isStopped; attempt++) {
      const client = this.connect();
      this.client = client;
      const lost = new Promise<void>((resolve) => {
        client.on('error', () => resolve());
        client.on('end', () => resolve());
      });
      try {
        await Promise.race([client.connect(), this.stopped]);
        if (this.isStopped) break;
        client.on('notification', (n) => {
          if (n.channel === this.channel) this.onMessage(n.payload ?? '');
        });
        await Promise.race([client.query(`LISTEN ${quoteIdent(this.channel)}`), this.stopped]);
        if (this.isStopped) break;
        // Back after a loss: anything may have changed while nobody listened.
        if (this.listenedBefore) this.onReset();
        this.listenedBefore = true;
        attempt = 0;
        await Promise.race([lost, this.stopped]);
      } catch {
        // Could not connect or listen: try again after a pause.
      }
      client.end().catch(() => undefined);
      if (this.isStopped) break;
      this.onReset();
      await Promise.race([sleep(backoffDelay(attempt)), this.stopped]);
    }
    this.client?.end().catch(() => undefined);
  }
}
