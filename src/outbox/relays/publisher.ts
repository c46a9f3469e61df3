import type { RelayMessage } from './envelope.js';

/**
 * One broker connection of a relay. publish() sends at once, in call order, on one ordered
 * connection (or channel), and resolves when the broker confirms that message: the relay keeps a
 * window of them in flight and moves its checkpoint over the confirmed prefix.
 */
export interface Publisher {
  publish(message: RelayMessage): Promise<void>;
  /** Gives the connection up; publishes in flight fail. */
  close(): Promise<void>;
}

/**
 * The broker refused this message for good (too large, unroutable, a 4xx): retried with back-off,
 * then parked after maxAttempts. Any other failure of publish() is the broker's or the network's
 * (down, restarting, a timeout): the message is sent again after a back-off, without counting.
 */
export class Refused extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'Refused';
  }
}

/** The broker asked to be left alone for a while (a webhook's 429 or 503 with Retry-After). */
export class Unavailable extends Error {
  constructor(
    message: string,
    readonly retryAfterMs: number,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'Unavailable';
  }
}
