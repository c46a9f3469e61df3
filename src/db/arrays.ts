import pg from 'pg';

/** text[]'s type id, which pg's TypeId does not list. */
const TEXT_ARRAY = 1009 as Parameters<typeof pg.types.getTypeParser>[0];
/** pg's parser of text[] (as text), whatever parsers a client has of its own. */
const parseTextArray = pg.types.getTypeParser(TEXT_ARRAY, 'text') as (text: string) => (string | null)[];

/**
 * The elements of an array column, as text, null for NULL. A driver that parses arrays gives
 * them parsed; one that does not (a raw SQL client) gives the array's text, read here as pg
 * reads a text[]. postgres.js, where ordo cannot see column types (under Kysely), parses a
 * NULL element as the text 'NULL': `nullable` reads that as null, for an element that cannot
 * be the text 'NULL' (a number, a date).
 */
export function arrayElements(value: unknown): (string | null)[] {
  return typeof value === 'string' ? parseTextArray(value) : (value as unknown[]).map(asText);
}

/** An element that is never the text 'NULL' (see arrayElements). */
export function nullable(element: string | null): string | null {
  return element === 'NULL' ? null : element;
}

function asText(element: unknown): string | null {
  return element === null || element === undefined ? null : String(element);
}
