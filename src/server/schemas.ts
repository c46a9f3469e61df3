import { IDENTIFIER_PATTERN } from '../index.js';

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
