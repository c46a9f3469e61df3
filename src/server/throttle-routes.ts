import type { FastifyInstance, FastifyReply } from 'fastify';
import {
  type AcquireResult,
  durationOption,
  MAX_DURATION_MS,
  MAX_DURATION_TEXT,
  MAX_ERROR_LENGTH,
  MAX_ITEMS,
  MAX_LIMIT,
  MAX_TEXT,
  type Ordo,
  OrdoError,
  type PermitEnd,
  REFUSAL_REASONS,
} from '../index.js';
import { ERROR, IF_EXISTS_QUERY, NAME } from './schemas.js';

/** The longest an HTTP caller waits in line (a long poll): proxies cut longer requests. */
export const MAX_HTTP_WAIT_MS = 60_000;

const PERMIT_ID = {
  type: 'string',
  pattern: '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$',
} as const;
const KEY = { type: 'string', maxLength: MAX_TEXT, description: "limits apply per key; default ''" } as const;
const HOLDER = { type: 'string', minLength: 1, maxLength: MAX_TEXT } as const;
const COST = {
  type: 'integer',
  minimum: 1,
  maximum: MAX_LIMIT,
  description: 'units taken (default 1)',
} as const;
const DURATION = {
  anyOf: [
    { type: 'integer', minimum: 1, maximum: MAX_DURATION_MS, description: 'milliseconds' },
    { type: 'string', maxLength: MAX_DURATION_TEXT, description: "such as '2s', '1m' or '500ms'" },
  ],
} as const;
const DATE = { type: 'string', format: 'date-time' } as const;
const NULLABLE_DATE = { type: ['string', 'null'], format: 'date-time' } as const;
const WAIT = {
  anyOf: [
    { type: 'integer', minimum: 0, maximum: MAX_HTTP_WAIT_MS, description: 'milliseconds' },
    {
      type: 'string',
      maxLength: MAX_DURATION_TEXT,
      description: "such as '10s': wait in line this long at most (a long poll)",
    },
  ],
} as const;
const POLICY = { type: 'string', enum: REFUSAL_REASONS } as const;
const NULLABLE_INT = { type: ['integer', 'null'] } as const;
const LIMITS = {
  type: 'object',
  properties: { everyMs: NULLABLE_INT, limit: NULLABLE_INT, perMs: NULLABLE_INT, concurrency: NULLABLE_INT },
} as const;

const DEFINITION = {
  type: 'object',
  properties: {
    name: { type: 'string' },
    everyMs: { type: ['integer', 'null'] },
    limit: { type: ['integer', 'null'] },
    perMs: { type: ['integer', 'null'] },
    concurrency: { type: ['integer', 'null'] },
    permits: { type: 'boolean' },
    leaseMs: { type: ['integer', 'null'] },
    refundOnFailure: { type: 'boolean' },
    pausedUntil: { anyOf: [DATE, { type: 'null' }] },
    createdAt: DATE,
    updatedAt: DATE,
  },
} as const;
const DEFINE_BODY = {
  type: ['object', 'null'],
  additionalProperties: false,
  properties: {
    every: DURATION,
    limit: { type: 'integer', minimum: 1, maximum: MAX_LIMIT },
    per: DURATION,
    concurrency: { type: 'integer', minimum: 1, maximum: MAX_LIMIT },
    lease: DURATION,
    permits: {
      type: 'boolean',
      description:
        'false: a grant is a start only, with no permit stored (no lease, outcome or refund); default true',
    },
    refundOnFailure: { type: 'boolean' },
    ifNotExists: { type: 'boolean' },
    overwrite: { type: 'boolean' },
  },
} as const;
const RUNNING = {
  type: 'object',
  properties: {
    id: { type: 'string' },
    name: { type: 'string' },
    key: { type: 'string' },
    holder: { type: 'string' },
    acquiredAt: DATE,
    expiresAt: DATE,
  },
} as const;
const PERMIT = {
  type: 'object',
  properties: {
    granted: { type: 'boolean' },
    ...RUNNING.properties,
    expiresAt: {
      ...NULLABLE_DATE,
      description: 'null: a start of a throttle without permits, nothing to end',
    },
    items: {
      type: 'array',
      items: {
        type: 'object',
        properties: { name: { type: 'string' }, key: { type: 'string' }, cost: { type: 'integer' } },
      },
    },
  },
} as const;
const REFUSED = {
  type: 'object',
  description: 'Refused: retry after retryAfterMs (also in the Retry-After header, in whole seconds)',
  properties: {
    code: { type: 'string', enum: ['throttled'] },
    message: { type: 'string' },
    retryAfterMs: { type: 'integer' },
    reason: POLICY,
    limit: {
      type: ['object', 'null'],
      properties: { name: { type: 'string' }, key: { type: 'string' } },
    },
  },
  required: ['code', 'message', 'retryAfterMs', 'reason'],
} as const;
const ENDED = {
  type: 'object',
  properties: {
    id: { type: 'string' },
    name: { type: 'string' },
    key: { type: 'string' },
    outcome: { type: 'string', enum: ['completed', 'failed'] },
    endedAt: DATE,
    refunded: { type: 'boolean' },
  },
} as const;
const STATE = {
  type: 'object',
  properties: {
    name: { type: 'string' },
    key: { type: 'string' },
    lastStartAt: NULLABLE_DATE,
    starts: { type: 'integer' },
    lastEndAt: NULLABLE_DATE,
    lastOutcome: { type: ['string', 'null'], enum: ['completed', 'failed', 'expired', null] },
    lastError: { type: ['string', 'null'] },
    lastPermitId: { type: ['string', 'null'] },
    running: { type: 'array', items: RUNNING },
    ownLimits: LIMITS,
    pausedUntil: NULLABLE_DATE,
    waiting: { type: 'integer' },
    observedAt: DATE,
  },
} as const;
const ITEM = {
  type: 'object',
  additionalProperties: false,
  required: ['name'],
  properties: { name: NAME, key: KEY, cost: COST },
} as const;
const KEY_LIMITS_BODY = {
  type: 'object',
  additionalProperties: false,
  required: ['key'],
  properties: {
    key: KEY,
    every: { anyOf: [...DURATION.anyOf, { type: 'null' }] },
    limit: { type: ['integer', 'null'], minimum: 1, maximum: MAX_LIMIT },
    per: { anyOf: [...DURATION.anyOf, { type: 'null' }] },
    concurrency: { type: ['integer', 'null'], minimum: 1, maximum: MAX_LIMIT },
  },
} as const;

const errors = { 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 409: ERROR, 503: ERROR };
const byName = { type: 'object', properties: { name: NAME } } as const;
const byId = { type: 'object', properties: { id: PERMIT_ID } } as const;

/**
 * The throttle routes: definitions (PUT / GET / DELETE /v1/throttles/:name), decisions
 * (POST /v1/throttles/:name/acquire: 200 with a permit, or 429 with Retry-After), and the
 * ends of permits (POST /v1/permits/:id/complete | fail | extend).
 */
export function throttleRoutes(app: FastifyInstance, ordo: Ordo): void {
  app.get(
    '/v1/throttles',
    {
      config: { scope: 'read' },
      schema: {
        summary: 'Every throttle',
        response: { ...errors, 200: { type: 'array', items: DEFINITION } },
      },
    },
    async () => ordo.throttles.list(),
  );

  app.get<{ Params: { name: string } }>(
    '/v1/throttles/:name',
    {
      config: { scope: 'read' },
      schema: { params: byName, response: { ...errors, 200: DEFINITION } },
    },
    async (request) => {
      const definition = await ordo.throttles.get(request.params.name);
      if (!definition)
        throw new OrdoError('throttle_not_found', `The throttle '${request.params.name}' does not exist`);
      return definition;
    },
  );

  app.put<{ Params: { name: string }; Body: Record<string, unknown> | null }>(
    '/v1/throttles/:name',
    {
      config: { scope: 'admin' },
      schema: {
        summary: 'Define a throttle (the options of ordo.throttles.define)',
        params: byName,
        body: DEFINE_BODY,
        response: { ...errors, 200: DEFINITION },
      },
    },
    async (request) => ordo.throttles.define({ ...(request.body ?? {}), name: request.params.name }),
  );

  app.delete<{ Params: { name: string }; Querystring: { ifExists?: string } }>(
    '/v1/throttles/:name',
    {
      config: { scope: 'admin' },
      schema: {
        params: byName,
        querystring: IF_EXISTS_QUERY,
        response: { ...errors, 200: { type: 'object', properties: { removed: { type: 'boolean' } } } },
      },
    },
    async (request) => ({
      removed: await ordo.throttles.remove(request.params.name, {
        ifExists: request.query.ifExists === 'true',
      }),
    }),
  );

  app.get<{ Params: { name: string }; Querystring: { key?: string } }>(
    '/v1/throttles/:name/state',
    {
      config: { scope: 'read' },
      schema: {
        summary: "A key's last start, last end and outcome, and its running permits",
        params: byName,
        querystring: { type: 'object', additionalProperties: false, properties: { key: KEY } },
        response: { ...errors, 200: STATE },
      },
    },
    async (request) => ordo.throttles.state(request.params.name, request.query.key ?? ''),
  );

  app.get<{ Params: { name: string }; Querystring: { limit?: string } }>(
    '/v1/throttles/:name/keys',
    {
      config: { scope: 'read' },
      schema: {
        summary: 'The keys of a throttle with their state, the most recently active first',
        params: byName,
        querystring: {
          type: 'object',
          additionalProperties: false,
          // Text, as a query string arrives (the server coerces nothing): digits here, the
          // range (1 to 10,000) where the library checks it.
          properties: { limit: { type: 'string', pattern: '^[0-9]{1,5}$' } },
        },
        response: { ...errors, 200: { type: 'array', items: STATE } },
      },
    },
    async (request) =>
      ordo.throttles.keys(request.params.name, {
        ...(request.query.limit === undefined ? {} : { limit: Number(request.query.limit) }),
      }),
  );

  app.put<{ Params: { name: string }; Body: { key: string } & Record<string, unknown> }>(
    '/v1/throttles/:name/key-limits',
    {
      config: { scope: 'admin' },
      schema: {
        summary: "Give a key its own limits (null or absent: the throttle's)",
        params: byName,
        body: KEY_LIMITS_BODY,
        response: { ...errors, 200: LIMITS },
      },
    },
    async (request) => {
      const { key, ...limits } = request.body;
      return ordo.throttles.setKeyLimits(request.params.name, key, limits);
    },
  );

  app.delete<{ Params: { name: string }; Querystring: { key: string } }>(
    '/v1/throttles/:name/key-limits',
    {
      config: { scope: 'admin' },
      schema: {
        summary: "The key has the throttle's limits again",
        params: byName,
        querystring: {
          type: 'object',
          additionalProperties: false,
          required: ['key'],
          properties: { key: KEY },
        },
        response: { ...errors, 200: LIMITS },
      },
    },
    async (request) => ordo.throttles.removeKeyLimits(request.params.name, request.query.key),
  );

  app.post<{ Params: { name: string }; Body: { key?: string; until: string | number } }>(
    '/v1/throttles/:name/pause',
    {
      config: { scope: 'admin' },
      schema: {
        summary: 'Hold the throttle, or one key, until a time or for a duration (acquires: 429 paused)',
        params: byName,
        body: {
          type: 'object',
          additionalProperties: false,
          required: ['until'],
          properties: {
            key: KEY,
            until: {
              anyOf: [
                {
                  type: 'integer',
                  minimum: 1,
                  maximum: MAX_DURATION_MS,
                  description: 'milliseconds from now',
                },
                {
                  type: 'string',
                  maxLength: MAX_DURATION_TEXT,
                  description: "an ISO 8601 time, or a duration such as '30s'",
                },
              ],
            },
          },
        },
        response: { ...errors, 200: { type: 'object', properties: { paused: { type: 'boolean' } } } },
      },
    },
    async (request) => {
      const { key, until } = request.body;
      await ordo.throttles.pause(request.params.name, { ...(key === undefined ? {} : { key }), until });
      return { paused: true };
    },
  );

  app.post<{ Params: { name: string }; Body: { key?: string } | null }>(
    '/v1/throttles/:name/resume',
    {
      config: { scope: 'admin' },
      schema: {
        summary: 'End a pause of the throttle, or of one key',
        params: byName,
        body: { type: ['object', 'null'], additionalProperties: false, properties: { key: KEY } },
        response: { ...errors, 200: { type: 'object', properties: { paused: { type: 'boolean' } } } },
      },
    },
    async (request) => {
      const key = request.body?.key;
      await ordo.throttles.resume(request.params.name, key === undefined ? {} : { key });
      return { paused: false };
    },
  );

  app.post<{
    Params: { name: string };
    Body: { key?: string; holder?: string; cost?: number; wait?: string | number } | null;
  }>(
    '/v1/throttles/:name/acquire',
    {
      config: { scope: 'next' },
      schema: {
        summary: 'One decision: 200 with a permit, or 429 with Retry-After; with wait, a long poll in line',
        params: byName,
        body: {
          type: ['object', 'null'],
          additionalProperties: false,
          properties: { key: KEY, holder: HOLDER, cost: COST, wait: WAIT },
        },
        response: { ...errors, 200: PERMIT, 429: REFUSED },
      },
    },
    async (request, reply) => {
      const { key, holder, cost, wait } = request.body ?? {};
      return answer(
        reply,
        await waitingFor(reply, wait, (options) =>
          ordo.throttles.acquire(request.params.name, {
            ...options,
            ...(key === undefined ? {} : { key }),
            ...(holder === undefined ? {} : { holder }),
            ...(cost === undefined ? {} : { cost }),
          }),
        ),
        `The throttle '${request.params.name}'`,
      );
    },
  );

  app.post<{
    Body: {
      items: { name: string; key?: string; cost?: number }[];
      holder?: string;
      wait?: string | number;
    };
  }>(
    '/v1/acquire',
    {
      config: { scope: 'next' },
      schema: {
        summary: 'Several limits at once: one permit if every item grants, else 429 naming the limit',
        body: {
          type: 'object',
          additionalProperties: false,
          required: ['items'],
          properties: {
            items: { type: 'array', minItems: 1, maxItems: MAX_ITEMS, items: ITEM },
            holder: HOLDER,
            wait: WAIT,
          },
        },
        response: { ...errors, 200: PERMIT, 429: REFUSED },
      },
    },
    async (request, reply) => {
      const { items, holder, wait } = request.body;
      return answer(
        reply,
        await waitingFor(reply, wait, (options) =>
          ordo.throttles.acquireAll(items, { ...options, ...(holder === undefined ? {} : { holder }) }),
        ),
        'The line',
      );
    },
  );

  app.post<{ Params: { id: string } }>(
    '/v1/permits/:id/complete',
    {
      config: { scope: 'next' },
      schema: { summary: 'End a permit as completed', params: byId, response: { ...errors, 200: ENDED } },
    },
    async (request): Promise<PermitEnd> => ordo.throttles.complete(request.params.id),
  );

  app.post<{
    Params: { id: string };
    Body: { error?: string; refund?: boolean; retryAfter?: string | number } | null;
  }>(
    '/v1/permits/:id/fail',
    {
      config: { scope: 'next' },
      schema: {
        summary:
          "End a permit as failed; with refund, a retry may start at once; with retryAfter, its keys are held (a downstream 429's Retry-After)",
        params: byId,
        body: {
          type: ['object', 'null'],
          additionalProperties: false,
          properties: {
            error: { type: 'string', maxLength: MAX_ERROR_LENGTH },
            refund: { type: 'boolean' },
            retryAfter: DURATION,
          },
        },
        response: { ...errors, 200: ENDED },
      },
    },
    async (request): Promise<PermitEnd> => {
      const { error, refund, retryAfter } = request.body ?? {};
      return ordo.throttles.fail(request.params.id, {
        ...(error === undefined ? {} : { error }),
        ...(refund === undefined ? {} : { refund }),
        ...(retryAfter === undefined ? {} : { retryAfter }),
      });
    },
  );

  app.post<{ Params: { id: string } }>(
    '/v1/permits/:id/extend',
    {
      config: { scope: 'next' },
      schema: {
        summary: "Renew a permit's lease",
        params: byId,
        response: {
          ...errors,
          200: { type: 'object', properties: { id: { type: 'string' }, expiresAt: DATE } },
        },
      },
    },
    async (request) => ({
      id: request.params.id.toLowerCase(),
      expiresAt: await ordo.throttles.extend(request.params.id),
    }),
  );
}

/**
 * Runs an acquire, waiting in line when asked. A caller that goes away while it waits leaves
 * the line; a permit granted to it meanwhile is given back (failed with refund), since nobody
 * will ever end it.
 */
async function waitingFor(
  reply: FastifyReply,
  wait: string | number | undefined,
  acquire: (options: { wait?: string | number; signal?: AbortSignal }) => Promise<AcquireResult>,
): Promise<AcquireResult> {
  if (wait === undefined) return acquire({});
  // The schema caps a number of milliseconds; a text ('10m') is read here, against the same cap.
  const waitMs = durationOption('wait over HTTP', wait, 0, MAX_HTTP_WAIT_MS);
  const gone = new AbortController();
  const onClose = () => {
    if (!reply.raw.writableFinished) gone.abort();
  };
  reply.raw.on('close', onClose);
  try {
    const got = await acquire({ wait: waitMs, signal: gone.signal });
    if (got.granted && gone.signal.aborted) {
      await got.fail('the HTTP caller went away while waiting', { refund: true }).catch(() => undefined);
    }
    return got;
  } finally {
    reply.raw.off('close', onClose);
  }
}

/** 200 with the permit, or 429 with Retry-After (whole seconds) and why. */
function answer(reply: FastifyReply, got: AcquireResult, what: string) {
  if (got.granted) return got.toJSON();
  reply.status(429).header('retry-after', String(Math.ceil(got.retryAfterMs / 1000)));
  const who = got.limit ? `The throttle '${got.limit.name}' (key '${got.limit.key}')` : what;
  return {
    code: 'throttled',
    message: `${who} refused a start (${got.reason}): retry in ${got.retryAfterMs} ms`,
    retryAfterMs: got.retryAfterMs,
    reason: got.reason,
    limit: got.limit,
  };
}
