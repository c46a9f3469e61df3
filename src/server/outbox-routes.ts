import type { FastifyInstance } from 'fastify';
import type { Ordo } from '../ordo.js';
import { MAX_APPEND, type MessageInput } from '../outbox/messages.js';
import { ERROR } from './schemas.js';

const OUTBOX_NAME = { type: 'string', pattern: '^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,199}$' } as const;
const TEXT = { type: ['string', 'null'], maxLength: 200 } as const;
const MESSAGE = {
  type: 'object',
  additionalProperties: false,
  required: ['type', 'data'],
  properties: {
    type: { type: 'string', minLength: 1, maxLength: 200 },
    data: { description: 'any JSON value' },
    key: TEXT,
    messageId: { ...TEXT, minLength: 1 },
    headers: { type: 'object', additionalProperties: true },
  },
} as const;
const DATE = { type: ['string', 'null'], format: 'date-time' } as const;
const LAG = {
  type: 'object',
  properties: {
    name: { type: 'string' },
    topic: { type: 'string' },
    owner: { type: ['string', 'null'] },
    leaseUntil: DATE,
    cursor: {
      type: 'object',
      properties: { transactionId: { type: 'string' }, position: { type: 'integer' } },
    },
    messagesBehind: { type: 'integer' },
    oldestAgeMs: { type: ['integer', 'null'] },
    waiting: { type: 'integer', description: 'committed messages held back by an older open transaction' },
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
    checkpointedAt: DATE,
  },
} as const;

/** The outbox over HTTP: append to a topic, and read how far each subscription is behind. */
export function outboxRoutes(app: FastifyInstance, ordo: Ordo): void {
  const errors = { 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 503: ERROR };

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
}
