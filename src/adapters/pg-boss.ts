import { OrdoError } from '../errors.js';
import type { Ordo } from '../ordo.js';
import { describe, identifier, invalid } from '../validate.js';
import { type JobContext, JobPermits, type ThrottledOptions } from './job-permit.js';
import { optionalPackage } from '../optional-package.js';

export type { FromJob, JobContext, JobLimit, ThrottledOptions } from './job-permit.js';

/** What the adapter needs of a pg-boss job. */
export interface PgBossJob {
  id: string;
  name: string;
}

/** What the adapter needs of the PgBoss instance whose workers it serves (started). */
export interface PgBossLike {
  getDb(): { executeSql(text: string, values: any[]): Promise<{ rows: any[] }> };
  complete(name: string, id: string, data?: object): Promise<unknown>;
  fail(name: string, id: string, data?: object): Promise<unknown>;
}

export interface PgBossThrottledOptions<J> extends ThrottledOptions<J> {
  /** The PgBoss instance whose `work()` runs the handler: refused jobs go back through its database. */
  boss: PgBossLike;
  /** The schema PgBoss was given (default 'pgboss'). */
  schema?: string;
}

export type PgBossProcessor<J, R> = (job: J, context: JobContext) => R | Promise<R>;

/** A pg-boss handler: `boss.work(queue, options, handler)`. */
export type ThrottledPgBossHandler<J, R> = (jobs: J[]) => Promise<R | undefined>;

const ADAPTER = 'ordo/pg-boss';

/**
 * The hand-back of a refused job, in one statement, while pg-boss still has it active: back to
 * the state it was fetched from ('created', or 'retry' once it has failed), to start after the
 * refusal's wait on the database clock. What it keeps and why (docs/queues.md, pg-boss):
 *
 * - no attempt: the fetch counted a retry only because `started_on` was set; clearing it means
 *   the next fetch counts none, so the refused fetch and the next one count once together;
 * - its place: pg-boss fetches by priority, then created_on, both kept;
 * - nothing lost or doubled: pg-boss completes a job by its id alone once the handler returns,
 *   so the job comes back under a new id, which that completion (or a failure's) cannot reach
 *   even after another worker has fetched it again.
 */
const handBack = (schema: string) => `
  UPDATE ${schema}.job
     SET id = gen_random_uuid(),
         state = (CASE WHEN retry_count = 0 THEN 'created' ELSE 'retry' END)::${schema}.job_state,
         start_after = now() + $3 * interval '1 millisecond',
         started_on = NULL,
         keep_until = greatest(keep_until, now() + $3 * interval '1 millisecond')
   WHERE name = $1 AND id = $2 AND state = 'active'
  RETURNING id`;

/** Marks a job handed back to its queue, for a batch to leave it alone. */
const HANDED_BACK = Symbol('handed back');

/**
 * A pg-boss handler (pg-boss 10) that runs `processor` for each job of a batch under a permit
 * of the throttles named: granted, the job runs with its lease renewed and its outcome ends the
 * permit (a throw fails it, and pg-boss retries the job as it would); refused, the job goes back
 * to its queue for `retryAfterMs` without using up a retry. Checks the options, the schema and
 * that the throttles exist before it resolves.
 */
export async function throttled<J extends PgBossJob, R>(
  ordo: Ordo,
  options: PgBossThrottledOptions<J>,
  processor: PgBossProcessor<J, R>,
): Promise<ThrottledPgBossHandler<J, R>> {
  await optionalPackage(() => import('pg-boss'), 'pg-boss', ADAPTER);
  const permits = await JobPermits.create<J>(ADAPTER, ordo, options, processor, ['boss', 'schema']);
  const { boss } = options;
  if (typeof boss?.getDb !== 'function' || typeof boss.complete !== 'function')
    throw invalid(
      `${ADAPTER}: boss must be the PgBoss instance whose work() runs the handler (got ${describe(boss)})`,
    );
  const schema = identifier('schema', options.schema ?? 'pgboss');
  const statement = handBack(schema);
  const db = boss.getDb();
  const { rows } = await db.executeSql('SELECT to_regclass($1) IS NOT NULL AS found', [`${schema}.job`]);
  if (rows[0]?.found !== true)
    throw invalid(
      `${ADAPTER}: the schema '${schema}' has no pg-boss jobs table: give the schema PgBoss was created with, once it has started`,
    );

  const one = async (job: J): Promise<R | typeof HANDED_BACK> => {
    const r = await permits.around(job, undefined, (context) => processor(job, context));
    if (r.ran) return r.value;
    const back = await db.executeSql(statement, [job.name, job.id, r.retryAfterMs]);
    if (back.rows.length === 0)
      throw new OrdoError(
        'invalid_argument',
        `${ADAPTER}: the job ${job.id} of '${job.name}' was refused by its throttle (${r.reason}) but is no longer active, so it was not handed back`,
      );
    return HANDED_BACK;
  };

  return async function throttledHandler(jobs: J[]): Promise<R | undefined> {
    // One job (pg-boss's batchSize 1, its default): its outcome is the handler's.
    if (jobs.length === 1) {
      const value = await one(jobs[0]!);
      return value === HANDED_BACK ? undefined : value;
    }
    // A batch: each job ends on its own, as pg-boss would end it alone; the batch's own completion
    // then finds none of them active.
    await Promise.all(
      jobs.map(async (job) => {
        try {
          const value = await one(job);
          if (value !== HANDED_BACK) await boss.complete(job.name, job.id, outputOf(value));
        } catch (error) {
          await boss.fail(job.name, job.id, error as object);
        }
      }),
    );
    return undefined;
  };
}

/** A job's output as pg-boss stores it: an object as it is, anything else as { value }. */
function outputOf(value: unknown): object | undefined {
  if (value === undefined || value === null) return undefined;
  return typeof value === 'object' && !Array.isArray(value) ? value : { value };
}
