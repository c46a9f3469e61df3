import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { CounterHolder, Ordo, SubscriptionLag } from '../index.js';

/** Latency buckets of HTTP requests, in seconds. */
const LATENCY_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5];

/**
 * Which metrics a registry holds: what this process counts (requests, values issued, ranges
 * reserved, throttle decisions, appends), what it reads from the database at each scrape (held
 * counters, running permits, lag), or both. The workers of `ordo serve --workers` count, and the
 * primary reads the database once for them all.
 */
export type MetricParts = 'both' | 'process' | 'database';

/** Prometheus metrics of one server, in a registry of its own (never the global one). */
export function createMetrics(ordo: Ordo, parts: MetricParts = 'both') {
  const registry = new Registry();
  const counted = parts !== 'database';
  const read = parts !== 'process';
  const requests = new RequestCounts(counted ? [registry] : []);
  const issuedBySequence = new Map<string, number>();
  new Counter({
    name: 'ordo_values_issued_total',
    help: 'Sequence values issued through this server, by sequence',
    labelNames: ['sequence'],
    registers: counted ? [registry] : [],
    collect() {
      this.reset();
      for (const [sequence, n] of issuedBySequence) this.inc({ sequence }, n);
    },
  });
  const errors = new Counter({
    name: 'ordo_errors_total',
    help: 'Errors answered, by code',
    labelNames: ['code'],
    registers: counted ? [registry] : [],
  });
  const which = { counted, read };
  sequenceMetrics(ordo, registry, which);
  outboxMetrics(ordo, registry, which);
  throttleMetrics(ordo, registry, which);
  return {
    registry,
    /** A request answered: its route pattern ('unmatched' without one), method, status and seconds taken. */
    request: (route: string, method: string, status: number, seconds: number) =>
      requests.record(route, method, status, seconds),
    issued(sequence: string, n: number): void {
      issuedBySequence.set(sequence, (issuedBySequence.get(sequence) ?? 0) + n);
    },
    errors,
  };
}

/** Which of a subject's metrics a registry holds (see MetricParts). */
interface Which {
  counted: boolean;
  read: boolean;
}

/** One route, method and status: its requests and their latency. */
interface RequestSlot {
  labels: { route: string; method: string; status: string };
  count: number;
  sum: number;
  /** Requests per bucket, not cumulative; the last one is +Inf. */
  buckets: number[];
}

/**
 * HTTP requests by route, method and status, and their latency: counted in plain slots as each
 * request ends, and read into Prometheus samples at each scrape. prom-client's inc() and
 * observe() check and hash their labels at every call, which cost a request that takes a
 * batched value more than any other step of ordo's own.
 */
class RequestCounts {
  /** By route, then method, then status: the route and method strings are the same objects at every request, so each lookup is a cached hash. */
  private readonly slots = new Map<string, Map<string, Map<number, RequestSlot>>>();

  constructor(registers: Registry[]) {
    const all = () => this.all();
    new Counter({
      name: 'ordo_http_requests_total',
      help: 'HTTP requests by route, method and status',
      labelNames: ['route', 'method', 'status'],
      registers,
      collect() {
        this.reset();
        for (const s of all()) this.inc(s.labels, s.count);
      },
    });
    // A histogram read from the slots: prom-client's registry takes any metric whose get()
    // answers its samples (its types name only its own classes).
    const name = 'ordo_http_request_duration_seconds';
    const help = 'HTTP request latency by route, method and status';
    const latency = {
      name,
      help,
      type: 'histogram',
      aggregator: 'sum',
      get: async () => ({
        name,
        help,
        type: 'histogram',
        aggregator: 'sum',
        values: histogramSamples(name, all()),
      }),
      reset: () => undefined,
    };
    for (const registry of registers) registry.registerMetric(latency as unknown as Histogram);
  }

  record(route: string, method: string, status: number, seconds: number): void {
    let byMethod = this.slots.get(route);
    if (byMethod === undefined) this.slots.set(route, (byMethod = new Map()));
    let byStatus = byMethod.get(method);
    if (byStatus === undefined) byMethod.set(method, (byStatus = new Map()));
    let slot = byStatus.get(status);
    if (slot === undefined) {
      slot = {
        labels: { route, method, status: String(status) },
        count: 0,
        sum: 0,
        buckets: new Array<number>(LATENCY_BUCKETS.length + 1).fill(0),
      };
      byStatus.set(status, slot);
    }
    slot.count++;
    slot.sum += seconds;
    let i = 0;
    while (i < LATENCY_BUCKETS.length && seconds > LATENCY_BUCKETS[i]!) i++;
    slot.buckets[i]!++;
  }

  private *all(): Iterable<RequestSlot> {
    for (const byMethod of this.slots.values())
      for (const byStatus of byMethod.values()) yield* byStatus.values();
  }
}

/** The samples of a histogram, as prom-client's own histograms give them. */
function histogramSamples(name: string, slots: Iterable<RequestSlot>) {
  const values: { labels: Record<string, string | number>; value: number; metricName: string }[] = [];
  for (const s of slots) {
    let cumulative = 0;
    for (let i = 0; i <= LATENCY_BUCKETS.length; i++) {
      cumulative += s.buckets[i]!;
      values.push({
        labels: { ...s.labels, le: i < LATENCY_BUCKETS.length ? LATENCY_BUCKETS[i]! : '+Inf' },
        value: cumulative,
        metricName: `${name}_bucket`,
      });
    }
    values.push({ labels: s.labels, value: s.sum, metricName: `${name}_sum` });
    values.push({ labels: s.labels, value: s.count, metricName: `${name}_count` });
  }
  return values;
}

/**
 * One read of the database per scrape, shared by every metric that needs it (a scrape collects
 * all its metrics at once; the next scrape reads again).
 */
function perScrape<T>(read: () => Promise<T>): () => Promise<T> {
  let pending: Promise<T> | undefined;
  return () => {
    pending ??= read().finally(() => setTimeout(() => (pending = undefined), 0));
    return pending;
  };
}

/**
 * A gauge by one label, from rows read at each scrape: each label's rows' values combined
 * (summed unless told otherwise); labels with no row have no sample, or 0 when in `zeros`.
 */
function rowGauge<R>(
  registry: Registry,
  g: {
    name: string;
    help: string;
    label: string;
    rows: () => Promise<readonly R[]>;
    labelOf: (row: R) => string;
    value: (row: R) => number;
    combine?: (a: number, b: number) => number;
    zeros?: () => Promise<string[]>;
  },
): void {
  const combine = g.combine ?? ((a: number, b: number) => a + b);
  new Gauge({
    name: g.name,
    help: g.help,
    labelNames: [g.label],
    registers: [registry],
    async collect() {
      this.reset();
      const values = new Map<string, number>();
      for (const zero of (await g.zeros?.()) ?? []) values.set(zero, 0);
      for (const row of await g.rows()) {
        const label = g.labelOf(row);
        const seen = values.get(label);
        values.set(label, seen === undefined ? g.value(row) : combine(seen, g.value(row)));
      }
      for (const [label, value] of values) this.set({ [g.label]: label }, value);
    },
  });
}

function sequenceMetrics(ordo: Ordo, registry: Registry, which: Which): void {
  if (which.counted) {
    new Counter({
      name: 'ordo_range_reservations_total',
      help: 'Ranges of batched sequences reserved by this node, by sequence',
      labelNames: ['sequence'],
      registers: [registry],
      collect() {
        this.reset();
        for (const [sequence, n] of ordo.sequences.reservations) this.inc({ sequence }, n);
      },
    });
    const reservationLatency = new Histogram({
      name: 'ordo_range_reservation_duration_seconds',
      help: 'How long reserving a range of a batched sequence took on this node (the statement), by sequence',
      labelNames: ['sequence'],
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1],
      registers: [registry],
    });
    ordo.sequences.onReservation((sequence, ms) => reservationLatency.observe({ sequence }, ms / 1000));
  }
  if (!which.read) return;
  // Gapless counters locked by open transactions (the in-transaction mode), read at each scrape.
  const holders = perScrape(() => ordo.sequences.holders());
  const bySequence = { label: 'sequence', rows: holders, labelOf: (h: CounterHolder) => h.sequence };
  rowGauge(registry, {
    name: 'ordo_gapless_counters_held',
    help: 'Gapless counters locked by an open transaction, by sequence',
    ...bySequence,
    value: () => 1,
  });
  rowGauge(registry, {
    name: 'ordo_gapless_lock_waiters',
    help: 'Transactions waiting for a gapless counter another transaction holds, by sequence',
    ...bySequence,
    value: (h) => h.waiting,
  });
  rowGauge(registry, {
    name: 'ordo_gapless_longest_hold_seconds',
    help: 'How long the oldest transaction holding a gapless counter has been open, by sequence',
    ...bySequence,
    value: (h) => (h.openForMs ?? 0) / 1000,
    combine: Math.max,
  });
}

/**
 * Throttles: what this server decided and ended (its own counters, as every process counts its
 * own), and the running permits of every process, read from the database at each scrape.
 */
function throttleMetrics(ordo: Ordo, registry: Registry, which: Which): void {
  if (which.counted) {
    new Counter({
      name: 'ordo_throttle_granted_total',
      help: 'Starts granted through this server, by throttle',
      labelNames: ['throttle'],
      registers: [registry],
      collect() {
        this.reset();
        for (const [throttle, c] of ordo.throttles.counters) this.inc({ throttle }, c.granted);
      },
    });
    new Counter({
      name: 'ordo_throttle_refused_total',
      help: 'Starts refused through this server, by throttle and reason',
      labelNames: ['throttle', 'reason'],
      registers: [registry],
      collect() {
        this.reset();
        for (const [throttle, c] of ordo.throttles.counters)
          for (const [reason, n] of Object.entries(c.refused)) this.inc({ throttle, reason }, n);
      },
    });
    new Counter({
      name: 'ordo_throttle_ended_total',
      help: 'Permits ended through this server, by throttle and outcome (completed, failed; refunded is the part of failed given back)',
      labelNames: ['throttle', 'outcome'],
      registers: [registry],
      collect() {
        this.reset();
        for (const [throttle, c] of ordo.throttles.counters) {
          this.inc({ throttle, outcome: 'completed' }, c.completed);
          this.inc({ throttle, outcome: 'failed' }, c.failed);
          this.inc({ throttle, outcome: 'refunded' }, c.refunded);
        }
      },
    });
  }
  if (!which.read) return;
  rowGauge(registry, {
    name: 'ordo_throttle_running_permits',
    help: 'Live permits of every process, by throttle',
    label: 'throttle',
    rows: () => ordo.throttles.running(),
    labelOf: (p) => p.name,
    value: () => 1,
    // A throttle with nothing running says 0 rather than nothing.
    zeros: async () => (await ordo.throttles.list()).map((t) => t.name),
  });
}

export type Metrics = ReturnType<typeof createMetrics>;

/**
 * The outbox as the database sees it, read at each scrape (so every consumer counts, in any
 * process or language): per subscription and partition. Appends are counted by this server.
 */
function outboxMetrics(ordo: Ordo, registry: Registry, which: Which): void {
  if (which.counted) {
    new Counter({
      name: 'ordo_outbox_appended_total',
      help: 'Messages appended through this server, by topic',
      labelNames: ['topic'],
      registers: [registry],
      collect() {
        this.reset();
        for (const [topic, n] of ordo.outbox.appended) this.inc({ topic }, n);
      },
    });
  }
  if (!which.read) return;
  const lags: () => Promise<SubscriptionLag[]> = perScrape(() => ordo.outbox.subscriptions());
  /** A metric per subscription and partition, read from the database at each scrape. */
  const perPartition = (
    kind: 'counter' | 'gauge',
    name: string,
    help: string,
    value: (p: SubscriptionLag['partitions'][number]) => number | null,
  ) => {
    const collect = async function (this: Counter | Gauge) {
      this.reset();
      for (const s of await lags())
        for (const p of s.partitions) {
          const v = value(p);
          const labels = { subscription: s.name, partition: String(p.partition) };
          if (v === null) continue;
          if (this instanceof Counter) this.inc(labels, v);
          else this.set(labels, v);
        }
    };
    const config = { name, help, labelNames: ['subscription', 'partition'], registers: [registry], collect };
    return kind === 'counter' ? new Counter(config) : new Gauge(config);
  };
  perPartition(
    'counter',
    'ordo_outbox_delivered_total',
    'Messages delivered and acknowledged',
    (p) => p.delivered,
  );
  perPartition(
    'counter',
    'ordo_outbox_redelivered_total',
    'Messages handed out again (a failure, a lapsed lease, a crash before the ack)',
    (p) => p.redelivered,
  );
  perPartition(
    'gauge',
    'ordo_outbox_lag_messages',
    'Committed messages not yet delivered',
    (p) => p.messagesBehind,
  );
  perPartition(
    'gauge',
    'ordo_outbox_oldest_age_seconds',
    'Age of the oldest message not yet delivered',
    (p) => (p.oldestAgeMs === null ? null : p.oldestAgeMs / 1000),
  );
  new Counter({
    name: 'ordo_outbox_dead_lettered_total',
    help: 'Messages parked in dead letters, by subscription',
    labelNames: ['subscription'],
    registers: [registry],
    async collect() {
      this.reset();
      for (const s of await lags()) this.inc({ subscription: s.name }, s.deadLettered);
    },
  });
  // Relays are subscriptions (their lag and deliveries are above): this adds where each one
  // publishes and how it goes, one series per state with 1 on the current one.
  const relays = perScrape(() => ordo.outbox.relays());
  new Gauge({
    name: 'ordo_relay_state',
    help: 'A relay: 1 on its state (running, failing or stopped), 0 on the others, with its broker',
    labelNames: ['relay', 'broker', 'state'],
    registers: [registry],
    async collect() {
      this.reset();
      for (const r of await relays())
        for (const state of ['running', 'failing', 'stopped'] as const)
          this.set({ relay: r.name, broker: r.broker, state }, r.state === state ? 1 : 0);
    },
  });
  new Gauge({
    name: 'ordo_outbox_open_appenders',
    help: "Open transactions that appended to a subscription's topic (their messages wait for them)",
    labelNames: ['subscription'],
    registers: [registry],
    async collect() {
      this.reset();
      for (const s of await lags()) this.set({ subscription: s.name }, s.waiting);
    },
  });
}
