import { setTimeout as sleep } from 'node:timers/promises';
import type pg from 'pg';
import { backoffDelay } from '../sequences/batched.js';
import { quoteIdent } from './migrations.js';

/**
 * A dedicated connection that LISTENs on one channel. While it is down, notifications may be
 * lost, so every loss (and the first start) calls onReset: callers drop what a missed
 * notification could have invalidated. It reconnects with back-off until stopped.
 */
export class Listener {
  private client: pg.Client | undefined;
  private stopped = false;
  private running: Promise<void> | undefined;
  private listenedBefore = false;

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
    this.stopped = true;
    await this.client?.end().catch(() => undefined);
    await this.running;
  }

  private async loop(): Promise<void> {
    for (let attempt = 0; !this.stopped; attempt++) {
      const client = this.connect();
      this.client = client;
      const lost = new Promise<void>((resolve) => {
        client.on('error', () => resolve());
        client.on('end', () => resolve());
      });
      try {
        await client.connect();
        client.on('notification', (n) => {
          if (n.channel === this.channel) this.onMessage(n.payload ?? '');
        });
        await client.query(`LISTEN ${quoteIdent(this.channel)}`);
        // Back after a loss: anything may have changed while nobody listened.
        if (this.listenedBefore) this.onReset();
        this.listenedBefore = true;
        attempt = 0;
        await lost;
      } catch {
        // Could not connect or listen: try again after a pause.
      }
      await client.end().catch(() => undefined);
      if (this.stopped) return;
      this.onReset();
      await sleep(backoffDelay(attempt));
    }
  }
}
