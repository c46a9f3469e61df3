// What every relay test does to its broker: writers append to many keys while a fifth of their
// transactions roll back, and what arrives at the broker is checked against what committed.
import { randomBytes } from 'node:crypto';
import { expect } from 'vitest';
import { type Ordo, OrdoError, type RelayTarget } from '../../src/index.js';

/** One committed message: its key, its place among its key's messages, its label. */
export interface Committed {
  key: string;
  seq: number;
  label: string;
}

/** What a broker delivered, as a test reads it back. */
export interface Arrival {
  /** The id the relay sent in the broker's own field. */
  id: string;
  /** The message's data, as the body decoded from JSON. */
  data: { key: string; seq: number; label: string };
  /** The CloudEvents and message headers, as the broker carried them. */
  headers: Record<string, string>;
}

/** A name no other test uses: streams, exchanges, keys and topics of one test. */
export const uniqueName = (prefix: string): string => `${prefix}_${randomBytes(4).toString('hex')}`;

/**
 * `writers` writers append to `keys` keys (each key written by one writer, so its messages
 * commit in the order its writer wrote them), `perWriter` transactions each of one or two
 * messages, every fifth transaction rolled back. Resolves with what committed.
 */
export async function appendLoad(
  ordo: Ordo,
  topic: string,
  options: { writers?: number; keys?: number; perWriter?: number; type?: (key: string) => string } = {},
): Promise<Committed[]> {
  const writers = options.writers ?? 8;
  const keys = options.keys ?? 50;
  const perWriter = options.perWriter ?? 25;
  const committed: Committed[] = [];
  const seqs = new Map<string, number>();
  await Promise.all(
    Array.from({ length: writers }, async (_, w) => {
      const mine = Array.from({ length: keys }, (_, k) => `key-${k}`).filter((_, k) => k % writers === w);
      for (let t = 0; t < perWriter; t++) {
        const rollback = t % 5 === 4;
        const batch = Array.from({ length: 1 + (t % 2) }, (_, i) => {
          const key = mine[(t + i) % mine.length]!;
          const seq = rollback ? -1 : (seqs.get(key) ?? 0) + 1;
          if (!rollback) seqs.set(key, seq);
          return { key, seq, label: `${rollback ? 'rolled-back' : 'c'}-${w}-${t}-${i}` };
        });
        await ordo
          .transaction(async (tx) => {
            await ordo.outbox.append(
              topic,
              batch.map((m) => ({
                type: options.type?.(m.key) ?? 'placed',
                key: m.key,
                data: m,
                headers: { traceparent: `00-${'a'.repeat(32)}-${'b'.repeat(16)}-01` },
              })),
              { tx },
            );
            if (rollback) throw new RolledBack();
          })
          .catch((e: unknown) => {
            if (!(e instanceof RolledBack)) throw e;
          });
        if (!rollback) committed.push(...batch);
      }
    }),
  );
  return committed;
}

class RolledBack extends Error {}

/**
 * Every committed message arrived, no rolled-back one; per key, the first arrivals in commit
 * order; a message that arrived twice carries the same id both times. Returns how many arrivals
 * were repeats.
 */
export function checkArrivals(arrivals: Arrival[], committed: Committed[]): number {
  expect(arrivals.filter((a) => a.data.label.startsWith('rolled-back'))).toEqual([]);
  const idOf = new Map<string, string>();
  const firsts = new Map<string, number[]>();
  let repeats = 0;
  for (const a of arrivals) {
    const seen = idOf.get(a.data.label);
    if (seen !== undefined) {
      expect(a.id, `the repeat of ${a.data.label}`).toBe(seen);
      repeats++;
      continue;
    }
    idOf.set(a.data.label, a.id);
    firsts.set(a.data.key, [...(firsts.get(a.data.key) ?? []), a.data.seq]);
  }
  expect([...idOf.keys()].sort()).toEqual(committed.map((c) => c.label).sort());
  for (const [key, seqs] of firsts) {
    expect(seqs, `the order of ${key}`).toEqual(seqs.map((_, i) => i + 1));
  }
  return repeats;
}

/** The CloudEvents attributes of binary mode that every relay sends with a message. */
export function expectCloudEvents(a: Arrival, topic: string): void {
  expect(a.headers).toMatchObject({
    'ce-specversion': '1.0',
    'ce-id': a.id,
    'ce-type': 'placed',
    'ce-source': `/ordo/topics/${topic}`,
    'ce-subject': a.data.key,
    traceparent: `00-${'a'.repeat(32)}-${'b'.repeat(16)}-01`,
  });
  expect(Number.isNaN(Date.parse(a.headers['ce-time']!))).toBe(false);
}

/** A relay to `to` is refused at creation with invalid_argument, its message matching each of `expected`. */
export async function expectRefused(
  ordo: Ordo,
  topic: string,
  to: unknown,
  ...expected: (string | RegExp)[]
): Promise<void> {
  const e = await ordo.outbox.relay({ name: uniqueName('bad'), topic, to: to as RelayTarget }).then(
    () => undefined,
    (err: unknown) => err,
  );
  expect(e).toBeInstanceOf(OrdoError);
  expect((e as OrdoError).code).toBe('invalid_argument');
  for (const x of expected) expect((e as OrdoError).message).toMatch(x);
}
