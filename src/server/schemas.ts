/** JSON schemas shared by the route modules. */

/** Every error answer: `{ code, message }`, the code being one of ERROR_CODES. */
export const ERROR = {
  type: 'object',
  properties: { code: { type: 'string' }, message: { type: 'string' } },
  required: ['code', 'message'],
} as const;
