import { IDENTIFIER_PATTERN, RELAY_BROKERS, RELAY_STATES } from '../index.js';

/** JSON schemas shared by the route modules. */

/** Every error answer: `{ code, message }`, the code being one of ERROR_CODES. */
export const ERROR = {
  type: 'object',
  properties: { code: { type: 'string' }, message: { type: 'string' } },
  required: ['code', 'message'],
} as const;

/** Names of sequences and throttles: identifiers, as the library checks them. */
export const NAME = { type: 'string', pattern: IDENTIFIER_PATTERN } as const;

/** `DELETE …?ifExists=true`: no error when there was nothing to remove. */
export const IF_EXISTS_QUERY = {
  type: 'object',
  additionalProperties: false,
  properties: { ifExists: { type: 'string', enum: ['true', 'false'] } },
} as const;

/** What a relay adds to its subscription's lag: where it publishes and how it fares. */
export const RELAY_FIELDS = {
  broker: { type: 'string', enum: RELAY_BROKERS },
  target: { type: 'string', description: 'where it publishes, without secrets' },
  state: {
    type: 'string',
    enum: RELAY_STATES,
    description:
      'running: a process holds a partition and nothing failed since the last checkpoint; failing: something did; stopped: no process holds one',
  },
  startedAt: { type: 'string', format: 'date-time' },
  lastRelayError: { type: ['string', 'null'], description: 'the last failure its process met' },
  lastRelayErrorAt: { type: ['string', 'null'], format: 'date-time' },
} as const;
