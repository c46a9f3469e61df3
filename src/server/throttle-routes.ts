import type { FastifyInstance } from 'fastify';
import type { Ordo } from '../ordo.js';
import { MAX_DURATION_MS, MAX_LIMIT } from '../throttles/definitions.js';
import { MAX_ERROR_LENGTH, type PermitEnd } from '../throttles/permit.js';
import { throttleNotFound } from '../throttles/throttles.js';
import { ERROR, IF_EXISTS_QUERY, NAME } from './schemas.js';

const PERMIT_ID = {
  type: 'string',
  pattern: '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$',
} as const;
const KEY = { type: 'string', maxLength: 200, description: "limits apply per key; default ''" } as const;
const DURATION = {
  anyOf: [
    { type: 'integer', minimum: 1, maximum: MAX_DURATION_MS, description: 'milliseconds' },
    { type: 'string', maxLength: 64, description: "such as '2s', '1m' or '500ms'" },
  ],
} as const;
const DATE = { type: 'string', format: 'date-time' } as const;
const NULLABLE_DATE = { type: ['string', 'null'], format: 'date-time' } as const;
const POLICY = { type: 'string', enum: ['every', 'rate', 'concurrency'] } as const;

const DEFINITION = {
  type: 'object',
  properties: {
    name: { type: 'string' },
    everyMs: { type: ['integer', 'null'] },
    limit: { type: ['integer', 'null'] },
    perMs: { type: ['integer', 'null'] },
    concurrency: { type: ['integer', 'null'] },
    leaseMs: { type: 'integer' },
    refundOnFailure: { type: 'boolean' },
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
  properties: { granted: { type: 'boolean' }, ...RUNNING.properties },
} as const;
const REFUSED = {
  type: 'object',
  description: 'Refused: retry after retryAfterMs (also in the Retry-After header, in whole seconds)',
  properties: {
    code: { type: 'string', enum: ['throttled'] },
    message: { type: 'string' },
    retryAfterMs: { type: 'integer' },
    reason: POLICY,
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
    observedAt: DATE,
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
      if (!definition) throw throttleNotFound(request.params.name);
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

  app.post<{ Params: { name: string }; Body: { key?: string; holder?: string } | null }>(
    '/v1/throttles/:name/acquire',
    {
      config: { scope: 'next' },
      schema: {
        summary: 'One decision: 200 with a permit, or 429 with Retry-After',
        params: byName,
        body: {
          type: ['object', 'null'],
          additionalProperties: false,
          properties: { key: KEY, holder: { type: 'string', minLength: 1, maxLength: 200 } },
        },
        response: { ...errors, 200: PERMIT, 429: REFUSED },
      },
    },
    async (request, reply) => {
      const { key, holder } = request.body ?? {};
      const got = await ordo.throttles.acquire(request.params.name, {
        ...(key === undefined ? {} : { key }),
        ...(holder === undefined ? {} : { holder }),
      });
      if (got.granted) return got.toJSON();
      reply.status(429).header('retry-after', String(Math.ceil(got.retryAfterMs / 1000)));
      return {
        code: 'throttled',
        message: `The throttle '${request.params.name}' refused a start (${got.reason}): retry in ${got.retryAfterMs} ms`,
        retryAfterMs: got.retryAfterMs,
        reason: got.reason,
      };
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

  app.post<{ Params: { id: string }; Body: { error?: string; refund?: boolean } | null }>(
    '/v1/permits/:id/fail',
    {
      config: { scope: 'next' },
      schema: {
        summary: 'End a permit as failed; with refund, a retry may start at once',
        params: byId,
        body: {
          type: ['object', 'null'],
          additionalProperties: false,
          properties: {
            error: { type: 'string', maxLength: MAX_ERROR_LENGTH },
            refund: { type: 'boolean' },
          },
        },
        response: { ...errors, 200: ENDED },
      },
    },
    async (request): Promise<PermitEnd> => {
      const { error, refund } = request.body ?? {};
      return ordo.throttles.fail(request.params.id, {
        ...(error === undefined ? {} : { error }),
        ...(refund === undefined ? {} : { refund }),
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
