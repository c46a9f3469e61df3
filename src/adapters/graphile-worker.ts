import { OrdoError } from '../errors.js';
import type { Ordo } from '../ordo.js';
import { identifier } from '../validate.js';
import { type JobContext, JobPermits, type ThrottledOptions } from './job-permit.js';
import { optionalPackage } from '../optional-package.js';

export type { FromJob, JobContext, JobLimit, ThrottledOptions } from './job-permit.js';

/** What the adapter needs of a graphile-worker job (helpers.job). */
export interface GraphileJob {
  id: string;
  locked_by: string | null;
}

/** What the adapter needs of a task's helpers (0.16 or 0.17). */
export interface GraphileHelpers<J extends GraphileJob> {
  job: J;
  withPgClient<T>(
    callback: (client: { query(text: string, values?: unknown[]): Promise<unknown> }) => Promise<T>,
  ): Promise<T>;
  abortSignal?: AbortSignal;
}

export interface GraphileThrottledOptions<J> extends ThrottledOptions<J> {
  /** The schema graphile-worker was given (default 'graphile_worker'). */
  schema?: string;
}

/** The task as the user writes it: graphile-worker's payload and helpers, then the permit's context. */
export type GraphileProcessor<H> = (payload: unknown, helpers: H, context: JobContext) => unknown;

/** A graphile-worker task: `taskList: { name: task }`. */
export type ThrottledTask<H> = (payload: unknown, helpers: H) => Promise<void>;

const ADAPTER = 'ordo/graphile-worker';

/**
 * The hand-back of a refused job, in one statement, while this worker pool still holds its lock:
 * unlocked (its named queue too) to run after the refusal's wait on the database clock. What it
 * keeps and why (docs/queues.md, graphile-worker):
 *
 * - no attempt: the fetch counted one, given back as graphile-worker's own returnJobs() gives
 *   back the jobs of a worker that shuts down (attempts − 1);
 * - its payload, key, priority, queue, flags and last error;
 * - nothing lost or doubled: once the task returns, graphile-worker completes the job by
 *   deleting its id, whoever holds it then, so the job comes back under a new id, which that
 *   completion cannot reach even after another worker has taken it again.
 */
const handBack = (schema: string) => `
  WITH job AS (
    UPDATE ${schema}._private_jobs
       SET id = DEFAULT,
           run_at = now() + $3 * interval '1 millisecond',
           attempts = greatest(0, attempts - 1),
           locked_by = NULL,
           locked_at = NULL
     WHERE id = $1 AND locked_by = $2
    RETURNING job_queue_id
  ), queue AS (
    UPDATE ${schema}._private_job_queues AS q
       SET locked_by = NULL, locked_at = NULL
      FROM job
     WHERE q.id = job.job_queue_id AND q.locked_by = $2
  )
  SELECT count(*)::int AS n FROM job`;

/**
 * A graphile-worker task (0.16, 0.17) that runs `processor` under a permit of the throttles
 * named: granted, the job runs with its lease renewed and its outcome ends the permit (a throw
 * fails it, and graphile-worker retries the job as it would); refused, the job goes back to the
 * jobs table for `retryAfterMs` without using up an attempt. Checks the options and that the
 * throttles exist before it resolves.
 */
export async function throttled<J extends GraphileJob, H extends GraphileHelpers<J> = GraphileHelpers<J>>(
  ordo: Ordo,
  options: GraphileThrottledOptions<J>,
  processor: GraphileProcessor<H>,
): Promise<ThrottledTask<H>> {
  await optionalPackage(() => import('graphile-worker'), 'graphile-worker', ADAPTER);
  const permits = await JobPermits.create<J>(ADAPTER, ordo, options, processor, ['schema']);
  const schema = `"${identifier('schema', options.schema ?? 'graphile_worker')}"`;
  const statement = handBack(schema);

  return async function throttledTask(payload: unknown, helpers: H): Promise<void> {
    const { job } = helpers;
    const r = await permits.around(job, helpers.abortSignal, (context) =>
      processor(payload, helpers, context),
    );
    if (r.ran) return;
    const back = (await helpers.withPgClient((client) =>
      client.query(statement, [job.id, job.locked_by, r.retryAfterMs]),
    )) as { rows: { n: number }[] };
    if (back.rows[0]?.n !== 1)
      throw new OrdoError(
        'invalid_argument',
        `${ADAPTER}: the job ${job.id} was refused by its throttle (${r.reason}) but this worker no longer holds it, so it was not handed back`,
      );
  };
}
