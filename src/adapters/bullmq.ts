import type { Ordo } from '../ordo.js';
import { invalid } from '../validate.js';
import { type JobContext, JobPermits, type ThrottledOptions } from './job-permit.js';
import { optionalPackage } from '../optional-package.js';

export type { FromJob, JobContext, JobLimit, ThrottledOptions } from './job-permit.js';

/** What the adapter needs of a BullMQ job (5 or 6). */
export interface BullJob {
  id?: string | undefined;
  moveToDelayed(timestamp: number, token?: string): Promise<void>;
}

/** The processor's context: the permit's signal and permit, and the job's lock token. */
export interface BullContext extends JobContext {
  token: string | undefined;
}

export type BullProcessor<J, R> = (job: J, context: BullContext) => R | Promise<R>;

/** A BullMQ processor: `new Worker(queue, processor, options)`. */
export type ThrottledBullProcessor<J, R> = (job: J, token?: string, signal?: AbortSignal) => Promise<R>;

const ADAPTER = 'ordo/bullmq';

/**
 * A BullMQ processor that runs `processor` only under a permit of the throttles named: granted,
 * the job runs with its lease renewed and its outcome ends the permit (a throw fails it, and
 * BullMQ retries the job as it would); refused, the job is moved back to the delayed set for
 * `retryAfterMs` with `job.moveToDelayed()` and BullMQ's DelayedError, which uses no attempt.
 * Checks the options and that the throttles exist before it resolves.
 */
export async function throttled<J extends BullJob, R>(
  ordo: Ordo,
  options: ThrottledOptions<J>,
  processor: BullProcessor<J, R>,
): Promise<ThrottledBullProcessor<J, R>> {
  const { DelayedError } = await optionalPackage(() => import('bullmq'), 'bullmq', ADAPTER);
  const permits = await JobPermits.create<J>(ADAPTER, ordo, options, processor);
  // Three parameters: BullMQ passes its own signal (a lost lock, a cancelled job) to a
  // processor that declares a third.
  return async function throttledProcessor(job: J, token?: string, signal?: AbortSignal): Promise<R> {
    const r = await permits.around(job, signal, (context) => processor(job, { ...context, token }));
    if (r.ran) return r.value;
    if (token === undefined)
      throw invalid(`${ADAPTER}: job ${job.id} came without its lock token, so it cannot be delayed`);
    await job.moveToDelayed(Date.now() + r.retryAfterMs, token);
    throw new DelayedError();
  };
}
