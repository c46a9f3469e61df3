import type { HeldSupply } from './batched.js';

/** A gapless counter: the last value issued in one scope and period. */
export interface CounterValue {
  sequence: string;
  scope: string;
  /** The period's first day (YYYY-MM-DD), or null for a sequence that never resets. */
  period: string | null;
  value: number;
  /** When a value was last taken from it (committed). */
  updatedAt: Date;
}

/** A range of a batched sequence reserved by a node, of the sequence's current definition. */
export interface HeldRange {
  sequence: string;
  nodeId: string;
  first: number;
  last: number;
  /** How many values the range holds. */
  size: number;
  /**
   * How many of them were handed out; known for this node's own ranges only (another node
   * keeps its count in its memory), else null.
   */
  used: number | null;
  reservedAt: Date;
}

/** How many values a sequence has given out so far, read at `at` (the database's clock). */
export interface SequenceActivity {
  name: string;
  kind: 'gapless' | 'batched';
  /** Gapless: values issued in every scope and period. Batched: values reserved by every node. */
  taken: number;
  at: Date;
}

export function toCounterValue(r: any): CounterValue {
  return {
    sequence: r.sequence,
    scope: r.scope,
    period: r.period,
    value: Number(r.value),
    updatedAt: new Date(r.updated_at),
  };
}

export function toActivity(r: any): SequenceActivity {
  return { name: r.name, kind: r.kind, taken: Number(r.taken), at: new Date(r.at) };
}

/**
 * A row of `sequence_batches` as a held range; `mine` is what this node's allocator of the
 * sequence holds, when the range is this node's.
 */
export function toHeldRange(r: any, mine: HeldSupply | undefined): HeldRange {
  const first = Number(r.first);
  const last = Number(r.last);
  const increment = Number(r.increment);
  const size = Math.floor((last - first) / increment) + 1;
  let used: number | null = null;
  if (mine) {
    if (mine.current?.first === first) used = Math.round((mine.current.next - first) / increment);
    else if (mine.ahead.some((r) => r.first === first)) used = 0;
    // An older range of this node: it moved on to a later one, so this one was used up.
    else if (mine.current && first < mine.current.first) used = size;
  }
  return {
    sequence: r.sequence,
    nodeId: r.node_id,
    first,
    last,
    size,
    used,
    reservedAt: new Date(r.reserved_at),
  };
}
