import type { FastifySchemaValidationError } from 'fastify/types/schema.js';

/** An Ajv error as Ajv gives it with `verbose: true`: the offending value and its schema. */
interface VerboseError extends FastifySchemaValidationError {
  data?: unknown;
  parentSchema?: { properties?: Record<string, unknown> };
}

/**
 * What a 400 says when a request does not match its schema, in the library's words: which
 * property, what is allowed, what was sent. Ajv's own messages leave out the useful part
 * ("must NOT have additional properties": which one?).
 */
export function validationMessage(errors: FastifySchemaValidationError[], dataVar: string): string {
  const e = errors[0] as VerboseError | undefined;
  if (!e) return `${dataVar} is not valid`;
  const where = `${dataVar}${e.instancePath.replaceAll('/', '.')}`;
  const params = e.params as Record<string, unknown>;
  const got = 'data' in e ? ` (got ${shown(e.data)})` : '';
  switch (e.keyword) {
    case 'additionalProperties': {
      const known = Object.keys(e.parentSchema?.properties ?? {});
      const list = known.length ? `; known properties: ${known.join(', ')}` : '';
      return `${where} has no property '${String(params.additionalProperty)}'${list}`;
    }
    case 'required':
      return `${where} needs the property '${String(params.missingProperty)}'`;
    case 'enum':
      return `${where} must be one of ${(params.allowedValues as unknown[]).map(shown).join(', ')}${got}`;
    case 'type':
      return `${where} must be ${[params.type].flat().join(' or ')}${got}`;
    default:
      return `${where} ${e.message ?? 'is not valid'}${got}`;
  }
}

/** A value as JSON, cut short: a 400 must not echo a whole body. */
function shown(value: unknown): string {
  const text = JSON.stringify(value) ?? String(value);
  return text.length > 60 ? `${text.slice(0, 57)}...` : text;
}
