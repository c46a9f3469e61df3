import {
  type CounterHolder,
  type CounterValue,
  type DeadLetter,
  type HeldRange,
  type Ordo,
  type OrdoError,
  type PartitionLag,
  REFUSAL_REASONS,
  type RelayStatus,
  type RunningPermit,
  type SequenceDefinition,
  type SubscriptionLag,
  type ThrottleCounters,
  type ThrottleDefinition,
  type ThrottlePolicy,
  type ThrottleState,
} from '../index.js';
import { RateHistory } from './dashboard-history.js';

/** The span of every sparkline, and how many points it has. */
export const HISTORY_WINDOW_MS = 3 * 60_000;
export const HISTORY_POINTS = 60;
/** "Now" rates are over this span: steady enough to read, recent enough to follow. */
const RATE_SPAN_MS = 10_000;
/** Viewers polling together share one read of the database this young. */
const SHARED_READ_MS = 1_000;
/** What one snapshot shows at most; a count says what was left out. */
const LIMITS = {
  /** Gapless counters read (the most recently used across all sequences). */
  countersRead: 500,
  /** Counters shown per sequence, the busiest first. */
  countersShown: 10,
  deadLetters: 5,
  running: 50,
  recentKeys: 10,
  dataPreview: 300,
};

export interface CounterRow extends Omit<CounterValue, 'sequence'> {
  /** Values issued per second lately (null until two readings). */
  perSecond: number | null;
}

export interface SequencePanel extends Omit<SequenceDefinition, 'epoch' | 'createdAt' | 'updatedAt'> {
  /** Values taken so far: gapless, issued in every scope and period; batched, reserved by every node. */
  taken: number | null;
  perSecond: number | null;
  history: (number | null)[];
  counters: CounterRow[];
  /** Counters of the sequence read but not shown. */
  moreCounters: number;
  ranges: (Omit<HeldRange, 'sequence'> & { thisNode: boolean })[];
  holders: Omit<CounterHolder, 'sequence'>[];
}

export interface DeadLetterRow extends Omit<DeadLetter, 'data' | 'headers' | 'topic' | 'transactionId'> {
  /** The message's data as JSON, cut to a few hundred characters. */
  data: string;
}

/** Where a relay publishes and how it fares; a relay is a subscription whose handler is a broker. */
export type RelayPanel = Pick<
  RelayStatus,
  'broker' | 'target' | 'state' | 'startedAt' | 'lastRelayError' | 'lastRelayErrorAt'
>;

export interface SubscriptionPanel extends Omit<SubscriptionLag, 'partitions'> {
  /** The relay this subscription is, if it is one. */
  relay: RelayPanel | null;
  deliveredPerSecond: number | null;
  history: (number | null)[];
  partitions: (PartitionLag & { deliveredPerSecond: number | null })[];
  /** The latest parked, newest first. */
  deadLetters: DeadLetterRow[];
}

export interface RunningRow extends Omit<RunningPermit, 'name'> {
  ageMs: number;
  leaseLeftMs: number;
}

export interface ThrottlePanel extends Omit<ThrottleDefinition, 'createdAt' | 'updatedAt'> {
  running: RunningRow[];
  runningCount: number;
  /** What this server granted, refused and ended since it started (each process counts its own). */
  counts: ThrottleCounters;
  /** The same, per second lately (null until two readings). */
  perSecond: {
    granted: number | null;
    completed: number | null;
    failed: number | null;
    refunded: number | null;
    refused: Record<ThrottlePolicy, number | null>;
  };
  /** Refusals per second, every reason together. */
  refusedHistory: (number | null)[];
  /** The keys most recently active: how their last permit ended. */
  recent: Pick<
    ThrottleState,
    'key' | 'starts' | 'lastStartAt' | 'lastEndAt' | 'lastOutcome' | 'lastError' | 'pausedUntil' | 'waiting'
  >[];
}

export interface DashboardSnapshot {
  /** This server's clock when read; ages are measured from it. */
  at: Date;
  nodeId: string;
  windowMs: number;
  sequences: SequencePanel[];
  subscriptions: SubscriptionPanel[];
  throttles: ThrottlePanel[];
}

/** The key of each running total in the history (NUL cannot occur in a name, key or scope). */
const TOTAL = {
  taken: (sequence: string) => `taken\u0000${sequence}`,
  counter: (sequence: string, scope: string, period: string | null) =>
    `counter\u0000${sequence}\u0000${scope}\u0000${period ?? ''}`,
  delivered: (subscription: string, partition?: number) =>
    `delivered\u0000${subscription}\u0000${partition ?? 'all'}`,
  throttle: (what: (typeof OUTCOMES)[number], throttle: string) => `${what}\u0000${throttle}`,
  refused: (throttle: string, reason?: ThrottlePolicy) => `refused\u0000${throttle}\u0000${reason ?? 'all'}`,
};
const OUTCOMES = ['granted', 'completed', 'failed', 'refunded'] as const;

/**
 * What the dashboard shows, read through the public API. Concurrent viewers share one read a
 * second, so ten open tabs cost the database what one does.
 */
export function dashboardReader(ordo: Ordo): () => Promise<DashboardSnapshot> {
  const history = new RateHistory(HISTORY_WINDOW_MS);
  let shared: { snapshot: Promise<DashboardSnapshot>; doneAt: number | undefined } | undefined;
  return () => {
    // A read in progress is shared however long it takes (a slow database gets one at a time),
    // and its answer for a second after it came.
    if (shared && (shared.doneAt === undefined || Date.now() - shared.doneAt < SHARED_READ_MS))
      return shared.snapshot;
    const current = { snapshot: read(ordo, history), doneAt: undefined as number | undefined };
    shared = current;
    current.snapshot.then(
      () => (current.doneAt = Date.now()),
      // A failed read is not served again to the next viewer.
      () => {
        if (shared === current) shared = undefined;
      },
    );
    return current.snapshot;
  };
}

async function read(ordo: Ordo, history: RateHistory): Promise<DashboardSnapshot> {
  const [definitions, activity, counters, ranges, holders, lags, relays, throttles, running] =
    await Promise.all([
      ordo.sequences.list(),
      ordo.sequences.activity(),
      ordo.sequences.counters({ limit: LIMITS.countersRead }),
      ordo.sequences.ranges(),
      ordo.sequences.holders(),
      ordo.outbox.subscriptions(),
      ordo.outbox.relays(),
      ordo.throttles.list(),
      ordo.throttles.running(),
    ]);
  const [deadLetters, keys] = await Promise.all([
    Promise.all(
      lags.map((s) =>
        s.deadLettered === 0
          ? []
          : ordo.outbox.deadLetters(s.name, { limit: LIMITS.deadLetters, order: 'newest' }),
      ),
    ),
    // A throttle removed since the list was read has no keys.
    Promise.all(
      throttles.map((t) =>
        ordo.throttles.keys(t.name, { limit: LIMITS.recentKeys }).catch((e: OrdoError) => {
          if (e.code === 'throttle_not_found') return [];
          throw e;
        }),
      ),
    ),
  ]);
  const at = new Date();
  const processCounters = ordo.throttles.counters;

  // Every running total whose rate is shown, in one reading.
  const totals = new Map<string, number>();
  const increments = new Map(definitions.map((d) => [d.name, d.increment]));
  for (const a of activity) totals.set(TOTAL.taken(a.name), a.taken);
  // A counter's value moves by the increment per value issued.
  for (const c of counters)
    totals.set(TOTAL.counter(c.sequence, c.scope, c.period), c.value / (increments.get(c.sequence) ?? 1));
  for (const s of lags) {
    totals.set(TOTAL.delivered(s.name), s.delivered);
    for (const p of s.partitions) totals.set(TOTAL.delivered(s.name, p.partition), p.delivered);
  }
  for (const [name, c] of processCounters) {
    for (const o of OUTCOMES) totals.set(TOTAL.throttle(o, name), c[o]);
    for (const r of REFUSAL_REASONS) totals.set(TOTAL.refused(name, r), c.refused[r]);
    totals.set(
      TOTAL.refused(name),
      REFUSAL_REASONS.reduce((n, r) => n + c.refused[r], 0),
    );
  }
  history.record(at.getTime(), totals);
  const rate = (key: string) => history.rate(key, RATE_SPAN_MS);
  const series = (key: string) => history.series(key, HISTORY_POINTS);

  const taken = new Map(activity.map((a) => [a.name, a.taken]));
  const sequences = definitions.map((d): SequencePanel => {
    const { epoch: _epoch, createdAt: _createdAt, updatedAt: _updatedAt, ...definition } = d;
    const own = counters
      .filter((c) => c.sequence === d.name)
      .map(({ sequence: _sequence, ...c }) => ({
        ...c,
        perSecond: rate(TOTAL.counter(d.name, c.scope, c.period)),
      }))
      // The busiest first; among those as busy, the most recently used (the order read).
      .sort((a, b) => (b.perSecond ?? 0) - (a.perSecond ?? 0));
    return {
      ...definition,
      taken: taken.get(d.name) ?? null,
      perSecond: rate(TOTAL.taken(d.name)),
      history: series(TOTAL.taken(d.name)),
      counters: own.slice(0, LIMITS.countersShown),
      moreCounters: Math.max(0, own.length - LIMITS.countersShown),
      ranges: ranges
        .filter((r) => r.sequence === d.name)
        .map(({ sequence: _sequence, ...r }) => ({ ...r, thisNode: r.nodeId === ordo.nodeId })),
      holders: holders.filter((h) => h.sequence === d.name).map(({ sequence: _sequence, ...h }) => h),
    };
  });

  const relayOf = new Map(relays.map((r) => [r.name, r]));
  const subscriptions = lags.map((s, i): SubscriptionPanel => ({
    ...s,
    relay: relayPanel(relayOf.get(s.name)),
    deliveredPerSecond: rate(TOTAL.delivered(s.name)),
    history: series(TOTAL.delivered(s.name)),
    partitions: s.partitions.map((p) => ({
      ...p,
      deliveredPerSecond: rate(TOTAL.delivered(s.name, p.partition)),
    })),
    deadLetters: deadLetters[i]!.map(deadLetterRow),
  }));

  const throttlePanels = throttles.map((t, i): ThrottlePanel => {
    const { createdAt: _createdAt, updatedAt: _updatedAt, ...definition } = t;
    const own = running.filter((p) => p.name === t.name);
    const counts = processCounters.get(t.name) ?? {
      granted: 0,
      completed: 0,
      failed: 0,
      refunded: 0,
      refused: Object.fromEntries(REFUSAL_REASONS.map((r) => [r, 0])) as Record<ThrottlePolicy, number>,
    };
    return {
      ...definition,
      running: own.slice(0, LIMITS.running).map(({ name: _name, ...p }) => ({
        ...p,
        ageMs: Math.max(0, at.getTime() - p.acquiredAt.getTime()),
        leaseLeftMs: Math.max(0, p.expiresAt.getTime() - at.getTime()),
      })),
      runningCount: own.length,
      counts,
      perSecond: {
        granted: rate(TOTAL.throttle('granted', t.name)),
        completed: rate(TOTAL.throttle('completed', t.name)),
        failed: rate(TOTAL.throttle('failed', t.name)),
        refunded: rate(TOTAL.throttle('refunded', t.name)),
        refused: Object.fromEntries(
          REFUSAL_REASONS.map((r) => [r, rate(TOTAL.refused(t.name, r))]),
        ) as Record<ThrottlePolicy, number | null>,
      },
      refusedHistory: series(TOTAL.refused(t.name)),
      recent: keys[i]!.map((k) => ({
        key: k.key,
        starts: k.starts,
        lastStartAt: k.lastStartAt,
        lastEndAt: k.lastEndAt,
        lastOutcome: k.lastOutcome,
        lastError: k.lastError,
        pausedUntil: k.pausedUntil,
        waiting: k.waiting,
      })),
    };
  });

  return {
    at,
    nodeId: ordo.nodeId,
    windowMs: HISTORY_WINDOW_MS,
    sequences,
    subscriptions,
    throttles: throttlePanels,
  };
}

function relayPanel(r: RelayStatus | undefined): RelayPanel | null {
  if (!r) return null;
  const { broker, target, state, startedAt, lastRelayError, lastRelayErrorAt } = r;
  return { broker, target, state, startedAt, lastRelayError, lastRelayErrorAt };
}

function deadLetterRow(d: DeadLetter): DeadLetterRow {
  const json = JSON.stringify(d.data) ?? 'null';
  return {
    position: d.position,
    type: d.type,
    key: d.key,
    messageId: d.messageId,
    createdAt: d.createdAt,
    attempts: d.attempts,
    error: d.error,
    parkedAt: d.parkedAt,
    data: json.length > LIMITS.dataPreview ? `${json.slice(0, LIMITS.dataPreview)}…` : json,
  };
}
