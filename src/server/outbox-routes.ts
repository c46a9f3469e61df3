import type { FastifyInstance } from 'fastify';
import {
  MAX_APPEND,
  MAX_ATTEMPTS,
  MAX_BATCH,
  MAX_PARTITIONS,
  MAX_RECEIPT_LENGTH,
  MAX_DURATION_TEXT,
  MAX_ERROR_LENGTH,
  MAX_TEXT,
  type MessageInput,
  type NackOptions,
  OUTBOX_NAME_PATTERN,
  type Ordo,
  type ReceiveOptions,
} from '../index.js';
import { ERROR, RELAY_FIELDS } from './schemas.js';

const OUTBOX_NAME = { type: 'string', pattern: OUTBOX_NAME_PATTERN } as const;
const TEXT = { type: ['string', 'null'], maxLength: MAX_TEXT } as const;
const MESSAGE = {
  type: 'object',
  additionalProperties: false,
  required: ['type', 'data'],
  properties: {
    type: { type: 'string', minLength: 1, maxLength: MAX_TEXT },
    data: { description: 'any JSON value' },
    key: TEXT,
    messageId: { ...TEXT, minLength: 1 },
    headers: { type: 'object', additionalProperties: true },
  },
} as const;
const DATE = { type: ['string', 'null'], format: 'date-time' } as const;
const REDELIVERED = {
  type: 'integer',
  description: 'messages handed out again (a failure, a lapsed lease)',
} as const;
const PARTITION_LAG = {
  type: 'object',
  properties: {
    partition: { type: 'integer' },
    owner: { type: ['string', 'null'] },
    leaseUntil: DATE,
    position: { type: 'integer' },
    messagesBehind: { type: 'integer' },
    oldestAgeMs: { type: ['integer', 'null'] },
    attempts: { type: 'integer' },
    lastError: { type: ['string', 'null'] },
    delivered: { type: 'integer' },
    redelivered: REDELIVERED,
    checkpointedAt: DATE,
  },
} as const;
const LAG = {
  type: 'object',
  properties: {
    name: { type: 'string' },
    topic: { type: 'string' },
    owner: { type: ['string', 'null'] },
    leaseUntil: DATE,
    messagesBehind: { type: 'integer' },
    oldestAgeMs: { type: ['integer', 'null'] },
    waiting: { type: 'integer', description: 'open transactions that appended to the topic' },
    blockedBy: {
      type: ['object', 'null'],
      properties: {
        pid: { type: ['integer', 'null'] },
        preparedGid: { type: ['string', 'null'] },
        xidAge: { type: 'integer' },
        openForMs: { type: ['integer', 'null'] },
        state: { type: ['string', 'null'] },
        applicationName: { type: ['string', 'null'] },
      },
    },
    attempts: { type: 'integer' },
    lastError: { type: ['string', 'null'] },
    delivered: { type: 'integer' },
    redelivered: REDELIVERED,
    deadLettered: { type: 'integer', description: 'messages parked in dead letters' },
    checkpointedAt: DATE,
    partitions: { type: 'array', items: PARTITION_LAG },
  },
} as const;
const RELAY = { type: 'object', properties: { ...LAG.properties, ...RELAY_FIELDS } } as const;
const DURATION = {
  anyOf: [
    { type: 'string', minLength: 1, maxLength: MAX_DURATION_TEXT },
    { type: 'integer', minimum: 0, description: 'milliseconds' },
  ],
} as const;
const RECEIPT = { type: 'string', minLength: 1, maxLength: MAX_RECEIPT_LENGTH } as const;
const MAX_ATTEMPTS_SCHEMA = { type: 'integer', minimum: 1, maximum: MAX_ATTEMPTS } as const;
const RECEIVED_MESSAGE = {
  type: 'object',
  properties: {
    position: { type: 'integer' },
    transactionId: { type: 'string' },
    topic: { type: 'string' },
    type: { type: 'string' },
    key: { type: ['string', 'null'] },
    messageId: { type: ['string', 'null'] },
    data: {},
    headers: { type: 'object', additionalProperties: true },
    createdAt: { type: 'string', format: 'date-time' },
  },
} as const;
const NAME_PARAMS = { type: 'object', properties: { name: OUTBOX_NAME } } as const;

/** The outbox over HTTP: append to a topic, and read how far each subscription is behind. */
export function outboxRoutes(app: FastifyInstance, ordo: Ordo): void {
  const errors = { 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 409: ERROR, 503: ERROR };

  app.post<{ Params: { topic: string }; Body: MessageInput | { messages: MessageInput[] } }>(
    '/v1/topics/:topic/messages',
    {
      config: { scope: 'next' },
      schema: {
        summary:
          'Append one message, or { messages: [...] } in one transaction; a repeated messageId is stored once',
        params: { type: 'object', properties: { topic: OUTBOX_NAME } },
        // if/then/else rather than anyOf: a refusal then names the fault in the shape that was meant.
        body: {
          if: { type: 'object', required: ['messages'] },
          then: {
            type: 'object',
            additionalProperties: false,
            required: ['messages'],
            properties: { messages: { type: 'array', minItems: 1, maxItems: MAX_APPEND, items: MESSAGE } },
          },
          else: MESSAGE,
        },
        response: {
          ...errors,
          200: {
            type: 'object',
            properties: {
              messages: {
                type: 'array',
                items: {
                  type: 'object',
                  properties: {
                    messageId: { type: ['string', 'null'] },
                    position: { type: ['integer', 'null'] },
                    transactionId: { type: ['string', 'null'] },
                    duplicate: { type: 'boolean' },
                  },
                },
              },
            },
          },
        },
      },
    },
    async (request) => {
      const body = request.body;
      const messages = 'messages' in body ? body.messages : body;
      return { messages: await ordo.outbox.append(request.params.topic, messages) };
    },
  );

  app.get(
    '/v1/subscriptions',
    { config: { scope: 'read' }, schema: { response: { ...errors, 200: { type: 'array', items: LAG } } } },
    async () => ordo.outbox.subscriptions(),
  );

  app.get(
    '/v1/relays',
    {
      config: { scope: 'read' },
      schema: {
        summary: 'Every relay of the database, wherever it runs: broker, state, lag and last error',
        response: { ...errors, 200: { type: 'array', items: RELAY } },
      },
    },
    async () => ordo.outbox.relays(),
  );

  app.get<{ Params: { name: string } }>(
    '/v1/subscriptions/:name',
    {
      config: { scope: 'read' },
      schema: {
        summary: 'How far a subscription is behind, and the open transaction holding it back',
        params: { type: 'object', properties: { name: OUTBOX_NAME } },
        response: { ...errors, 200: LAG },
      },
    },
    async (request) => ordo.outbox.lag(request.params.name),
  );

  app.put<{
    Params: { name: string };
    Body: { topic: string; from?: 'beginning' | 'now'; partitions?: number };
  }>(
    '/v1/subscriptions/:name',
    {
      config: { scope: 'admin' },
      schema: {
        summary: 'Create a subscription (a consumer over HTTP needs one); the same again is a no-op',
        params: NAME_PARAMS,
        body: {
          type: 'object',
          additionalProperties: false,
          required: ['topic'],
          properties: {
            topic: OUTBOX_NAME,
            from: { type: 'string', enum: ['beginning', 'now'] },
            partitions: { type: 'integer', minimum: 1, maximum: MAX_PARTITIONS },
          },
        },
        response: { ...errors, 200: LAG },
      },
    },
    async (request) => {
      await ordo.outbox.createSubscription({ name: request.params.name, ...request.body });
      return ordo.outbox.lag(request.params.name);
    },
  );

  app.post<{ Params: { name: string }; Body: { to: string } }>(
    '/v1/subscriptions/:name/seek',
    {
      config: { scope: 'admin' },
      schema: {
        summary: "Move a subscription: 'beginning' (replay), 'now', or an ISO 8601 time; 409 while consumed",
        params: NAME_PARAMS,
        body: {
          type: 'object',
          additionalProperties: false,
          required: ['to'],
          properties: {
            to: {
              anyOf: [
                { type: 'string', enum: ['beginning', 'now'] },
                { type: 'string', format: 'date-time' },
              ],
            },
          },
        },
        response: { ...errors, 200: LAG },
      },
    },
    async (request) => {
      const { to } = request.body;
      await ordo.outbox.seek(request.params.name, {
        to: to === 'beginning' || to === 'now' ? to : new Date(to),
      });
      return ordo.outbox.lag(request.params.name);
    },
  );

  app.post<{ Params: { name: string }; Body: ReceiveOptions }>(
    '/v1/subscriptions/:name/receive',
    {
      config: { scope: 'next' },
      schema: {
        summary:
          'A batch of the next messages, leased to the caller for visibilityTimeout: ack it with its receipt, or nack it; a lease that lapses counts as a failed attempt (parked after maxAttempts)',
        params: NAME_PARAMS,
        body: {
          type: 'object',
          additionalProperties: false,
          properties: {
            max: { type: 'integer', minimum: 1, maximum: MAX_BATCH },
            visibilityTimeout: DURATION,
            maxAttempts: MAX_ATTEMPTS_SCHEMA,
          },
        },
        response: {
          ...errors,
          200: {
            type: 'object',
            properties: {
              messages: { type: 'array', items: RECEIVED_MESSAGE },
              receipt: { type: ['string', 'null'] },
              attempt: { type: 'integer' },
            },
          },
        },
      },
    },
    async (request) => ordo.outbox.receive(request.params.name, request.body ?? {}),
  );

  app.post<{ Params: { name: string }; Body: { receipt: string } }>(
    '/v1/subscriptions/:name/ack',
    {
      config: { scope: 'next' },
      schema: {
        summary: 'Move the subscription past a received batch; 409 receipt_expired once its lease lapsed',
        params: NAME_PARAMS,
        body: {
          type: 'object',
          additionalProperties: false,
          required: ['receipt'],
          properties: { receipt: RECEIPT },
        },
        response: { ...errors, 200: { type: 'object', properties: { handled: { type: 'integer' } } } },
      },
    },
    async (request) => ordo.outbox.ack(request.params.name, request.body.receipt),
  );

  app.post<{ Params: { name: string }; Body: NackOptions & { receipt: string } }>(
    '/v1/subscriptions/:name/nack',
    {
      config: { scope: 'next' },
      schema: {
        summary:
          'Hand a received batch back: delivered again after retryAfter (or a back-off); parked in dead letters after maxAttempts',
        params: NAME_PARAMS,
        body: {
          type: 'object',
          additionalProperties: false,
          required: ['receipt'],
          properties: {
            receipt: RECEIPT,
            error: { type: 'string', minLength: 1, maxLength: MAX_ERROR_LENGTH },
            retryAfter: DURATION,
            maxAttempts: MAX_ATTEMPTS_SCHEMA,
          },
        },
        response: {
          ...errors,
          200: {
            type: 'object',
            properties: {
              outcome: { type: 'string', enum: ['split', 'retry', 'parked'] },
              attempts: { type: 'integer' },
            },
          },
        },
      },
    },
    async (request) => {
      const { receipt, ...options } = request.body;
      return ordo.outbox.nack(request.params.name, receipt, options);
    },
  );
}
