import type { FastifyInstance } from 'fastify';
import {
  MAX_COUNT,
  MAX_FORMAT_LENGTH,
  MAX_IDEMPOTENCY_KEY_LENGTH,
  MAX_SEQUENCE_BATCH,
  MAX_TEXT,
  MAX_TIME_ZONE_LENGTH,
  MAX_TIMEOUT_MS,
  MAX_VALUE,
  type NextOptions,
  type Ordo,
  sequenceNotFound,
} from '../index.js';
import type { Metrics } from './metrics.js';
import { ERROR, IF_EXISTS_QUERY, NAME } from './schemas.js';

// Bodies are checked here for their shape only (types, known properties, enums): the library
// checks every value (ranges, lengths, formats) once, and its message is the 400's. Limits
// appear below as descriptions, read from the same constants the library checks against.
const INTEGER = { type: 'integer', description: `from ${-MAX_VALUE} to ${MAX_VALUE}` } as const;
const DEFINITION = {
  type: 'object',
  properties: {
    name: { type: 'string' },
    kind: { type: 'string', enum: ['gapless', 'batched'] },
    start: { type: 'integer' },
    batch: { type: ['integer', 'null'] },
    timeoutMs: { type: ['integer', 'null'] },
    increment: { type: 'integer' },
    minValue: { type: 'integer' },
    maxValue: { type: 'integer' },
    cycle: { type: 'boolean' },
    reset: { type: 'string' },
    timeZone: { type: 'string' },
    yearStart: { type: 'integer' },
    format: { type: ['string', 'null'] },
    epoch: { type: 'integer' },
    createdAt: { type: 'string', format: 'date-time' },
    updatedAt: { type: 'string', format: 'date-time' },
  },
} as const;
const DEFINE_BODY = {
  type: 'object',
  additionalProperties: false,
  properties: {
    kind: { type: 'string', enum: ['gapless', 'batched'] },
    start: INTEGER,
    increment: { type: 'integer', description: `from 1 to ${MAX_VALUE}` },
    minValue: INTEGER,
    maxValue: INTEGER,
    cycle: { type: 'boolean' },
    reset: { type: 'string', enum: ['never', 'day', 'week', 'month', 'year'] },
    yearStart: { type: 'integer', description: 'the month a fiscal year starts, 1 to 12' },
    timeZone: { type: 'string', description: `an IANA name, at most ${MAX_TIME_ZONE_LENGTH} characters` },
    format: { type: ['string', 'null'], description: `at most ${MAX_FORMAT_LENGTH} characters` },
    batch: { type: 'integer', description: `from 1 to ${MAX_SEQUENCE_BATCH}` },
    timeout: {
      type: ['integer', 'string', 'null'],
      description: `milliseconds (at most ${MAX_TIMEOUT_MS}) or a duration such as '5s'`,
    },
    ifNotExists: { type: 'boolean' },
    overwrite: { type: 'boolean' },
  },
} as const;
const HOLDER = {
  type: 'object',
  properties: {
    sequence: { type: 'string' },
    scope: { type: 'string' },
    period: { type: ['string', 'null'] },
    pid: { type: ['integer', 'null'] },
    preparedGid: { type: ['string', 'null'] },
    openForMs: { type: ['number', 'null'] },
    state: { type: ['string', 'null'] },
    applicationName: { type: ['string', 'null'] },
    waiting: { type: 'integer' },
  },
} as const;
const NEXT_BODY = {
  type: ['object', 'null'],
  additionalProperties: false,
  properties: {
    scope: { type: 'string', description: `at most ${MAX_TEXT} characters` },
    count: { type: 'integer', description: `from 1 to ${MAX_COUNT}` },
    at: { type: 'string', description: 'ISO 8601 timestamp with an offset' },
  },
} as const;
const NEXT_REPLY = {
  type: 'object',
  properties: {
    value: { type: 'integer' },
    values: { type: 'array', items: { type: 'integer' } },
    text: { type: 'string' },
    texts: { type: 'array', items: { type: 'string' } },
    period: { type: ['string', 'null'] },
  },
} as const;
const NAME_PARAMS = { type: 'object', properties: { name: NAME } } as const;

/** Sequences over HTTP: define, read, remove, and take numbers. */
export function sequenceRoutes(app: FastifyInstance, ordo: Ordo, metrics: Metrics): void {
  const errors = { 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 409: ERROR, 503: ERROR };

  app.get(
    '/v1/sequences',
    {
      config: { scope: 'read' },
      schema: { response: { ...errors, 200: { type: 'array', items: DEFINITION } } },
    },
    async () => ordo.sequences.list(),
  );

  app.get<{ Params: { name: string } }>(
    '/v1/sequences/:name',
    { config: { scope: 'read' }, schema: { params: NAME_PARAMS, response: { ...errors, 200: DEFINITION } } },
    async (request) => {
      const definition = await ordo.sequences.get(request.params.name);
      if (!definition) throw sequenceNotFound(request.params.name);
      return definition;
    },
  );

  app.get<{ Params: { name: string } }>(
    '/v1/sequences/:name/holders',
    {
      config: { scope: 'read' },
      schema: {
        summary: 'The open transactions holding counters of a sequence, and how many wait behind each',
        params: NAME_PARAMS,
        response: { ...errors, 200: { type: 'array', items: HOLDER } },
      },
    },
    async (request) => ordo.sequences.holders(request.params.name),
  );

  app.put<{ Params: { name: string }; Body: Record<string, unknown> }>(
    '/v1/sequences/:name',
    {
      config: { scope: 'admin' },
      schema: {
        summary: 'Define a sequence (the options of ordo.sequences.define)',
        params: NAME_PARAMS,
        body: DEFINE_BODY,
        response: { ...errors, 200: DEFINITION },
      },
    },
    async (request) => ordo.sequences.define({ ...(request.body ?? {}), name: request.params.name }),
  );

  app.delete<{ Params: { name: string }; Querystring: { ifExists?: string } }>(
    '/v1/sequences/:name',
    {
      config: { scope: 'admin' },
      schema: {
        params: NAME_PARAMS,
        querystring: IF_EXISTS_QUERY,
        response: { ...errors, 200: { type: 'object', properties: { removed: { type: 'boolean' } } } },
      },
    },
    async (request) => ({
      removed: await ordo.sequences.remove(request.params.name, {
        ifExists: request.query.ifExists === 'true',
      }),
    }),
  );

  app.post<{
    Params: { name: string };
    Body: { scope?: string; count?: number; at?: string } | undefined;
    Headers: { 'idempotency-key'?: string };
  }>(
    '/v1/sequences/:name/next',
    {
      config: { scope: 'next' },
      schema: {
        summary: 'Take the next value(s) of a sequence',
        description:
          'With an Idempotency-Key header (gapless sequences), the same key with the same scope and count within a day answers the same values: retry a 503 or a lost answer with it and no number is lost.',
        params: NAME_PARAMS,
        headers: {
          type: 'object',
          properties: {
            'idempotency-key': { type: 'string', minLength: 1, maxLength: MAX_IDEMPOTENCY_KEY_LENGTH },
          },
        },
        body: NEXT_BODY,
        response: { ...errors, 200: NEXT_REPLY },
      },
    },
    async (request) => {
      const body = request.body;
      const name = request.params.name;
      const key = request.headers['idempotency-key'];
      const opts: NextOptions = {};
      if (body?.scope !== undefined) opts.scope = body.scope;
      if (body?.at !== undefined) opts.at = body.at;
      if (key !== undefined) opts.idempotencyKey = key;
      if (body?.count === undefined) {
        const one = await ordo.sequences.next(name, opts);
        metrics.issued(name, 1);
        return {
          value: one.value,
          values: [one.value],
          text: one.text,
          texts: [one.text],
          period: one.period,
        };
      }
      const issued = await ordo.sequences.nextMany(name, body.count, opts);
      metrics.issued(name, issued.length);
      return {
        value: issued[0]!.value,
        values: issued.map((i) => i.value),
        text: issued[0]!.text,
        texts: issued.map((i) => i.text),
        period: issued[0]!.period,
      };
    },
  );
}
