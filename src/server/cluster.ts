import cluster, { type Worker } from 'node:cluster';
import { AggregatorRegistry, type Registry } from 'prom-client';
import { OrdoError } from '../index.js';

/**
 * /metrics of `ordo serve --workers N`: a scrape reaches one worker, which asks the primary for
 * the whole; the primary asks every worker for its own samples (what it counted: requests,
 * values issued, ranges reserved, throttle decisions), adds what it reads from the database
 * once for all of them, and answers the sum.
 */

/** Worker → primary: the whole, please; primary → worker: the whole, as Prometheus text. */
const SCRAPE = 'ordo:scrape';
/** Primary → worker: your samples, please; worker → primary: its samples, as prom-client's JSON. */
const SAMPLES = 'ordo:samples';

/** How long a scrape waits for the primary, and the primary for a worker's samples. */
const ANSWER_MS = 5_000;

interface Message {
  type?: string;
  id?: number;
  text?: string;
  samples?: unknown;
  error?: string;
}

/** Requests awaiting their answer by id, each failing after ANSWER_MS. */
class Pending<T> {
  private next = 0;
  private readonly waiting = new Map<
    number,
    { resolve: (v: T) => void; reject: (e: Error) => void; timer: NodeJS.Timeout }
  >();

  /** Sends a request with a fresh id (`send`), and resolves with its answer. */
  ask(send: (id: number) => void, late: () => Error): Promise<T> {
    const id = this.next++;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiting.delete(id);
        reject(late());
      }, ANSWER_MS);
      this.waiting.set(id, { resolve, reject, timer });
      send(id);
    });
  }

  answer(id: number | undefined, value: T | undefined, error: string | undefined): void {
    const w = id === undefined ? undefined : this.waiting.get(id);
    if (!w) return;
    this.waiting.delete(id!);
    clearTimeout(w.timer);
    if (error !== undefined || value === undefined) w.reject(new OrdoError('timeout', error ?? 'no answer'));
    else w.resolve(value);
  }
}

/**
 * In a worker: answers the primary's requests for this worker's samples, and returns the scrape
 * of /metrics, which asks the primary for the whole.
 */
export function workerScrape(registry: Registry): () => Promise<string> {
  const scrapes = new Pending<string>();
  process.on('message', (m: Message) => {
    if (m?.type === SCRAPE) scrapes.answer(m.id, m.text, m.error);
    else if (m?.type === SAMPLES) {
      registry.getMetricsAsJSON().then(
        (samples) => process.send?.({ type: SAMPLES, id: m.id, samples }),
        (e: Error) => process.send?.({ type: SAMPLES, id: m.id, error: e.message }),
      );
    }
  });
  return () =>
    scrapes.ask(
      (id) => process.send?.({ type: SCRAPE, id }),
      () =>
        new OrdoError(
          'timeout',
          `the primary of ordo serve did not answer for metrics within ${ANSWER_MS} ms`,
        ),
    );
}

/**
 * In the primary: answers each worker's scrape with the samples of every worker summed (the
 * aggregation of prom-client's cluster support), and those of `own`, read here once.
 */
export function answerScrapes(own: Registry): void {
  const samples = new Pending<unknown>();
  const ask = (worker: Worker) =>
    samples.ask(
      (id) => worker.send({ type: SAMPLES, id }),
      () =>
        new OrdoError(
          'timeout',
          `worker ${worker.process.pid} did not answer for metrics within ${ANSWER_MS} ms`,
        ),
    );
  cluster.on('message', (worker: Worker, m: Message) => {
    if (m?.type === SAMPLES) samples.answer(m.id, m.samples, m.error);
    else if (m?.type === SCRAPE) {
      const workers = Object.values(cluster.workers ?? {}).filter((w): w is Worker => !!w?.isConnected());
      Promise.all([own.getMetricsAsJSON(), ...workers.map(ask)])
        .then((all) =>
          AggregatorRegistry.aggregate(all as Parameters<typeof AggregatorRegistry.aggregate>[0]).metrics(),
        )
        .then(
          (text) => worker.isConnected() && worker.send({ type: SCRAPE, id: m.id, text }),
          (e: Error) => worker.isConnected() && worker.send({ type: SCRAPE, id: m.id, error: e.message }),
        );
    }
  });
}
