import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { Ordo, SubscriptionLag } from '../index.js';

/** Prometheus metrics of one server, in a registry of its own (never the global one). */
export function createMetrics(ordo: Ordo) {
  const registry = new Registry();
  const requests = new Counter({
    name: 'ordo_http_requests_total',
    help: 'HTTP requests by route, method and status',
    labelNames: ['route', 'method', 'status'],
    registers: [registry],
  });
  const latency = new Histogram({
    name: 'ordo_http_request_duration_seconds',
    help: 'HTTP request latency by route, method and status',
    labelNames: ['route', 'method', 'status'],
    buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
    registers: [registry],
  });
  const issued = new Counter({
    name: 'ordo_values_issued_total',
    help: 'Sequence values issued through this server, by sequence',
    labelNames: ['sequence'],
    registers: [registry],
  });
  const errors = new Counter({
    name: 'ordo_errors_total',
    help: 'Errors answered, by code',
    labelNames: ['code'],
    registers: [registry],
  });
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
  outboxMetrics(ordo, registry);
  return { registry, requests, latency, issued, errors };
}

export type Metrics = ReturnType<typeof createMetrics>;

/**
 * The outbox as the database sees it, read at each scrape (so every consumer counts, in any
 * process or language): per subscription and partition. Appends are counted by this server.
 */
function outboxMetrics(ordo: Ordo, registry: Registry): void {
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
  // One read of every subscription per scrape, shared by the metrics below.
  let scrape: Promise<SubscriptionLag[]> | undefined;
  const lags = () => {
    scrape ??= ordo.outbox.subscriptions().finally(() => setTimeout(() => (scrape = undefined), 0));
    return scrape;
  };
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
