import { Counter, Histogram, Registry } from 'prom-client';
import type { Ordo } from '../ordo.js';

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
  return { registry, requests, latency, issued, errors };
}
