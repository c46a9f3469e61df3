// pg ships no types for its serialiser; ordo uses it so that every driver sends what pg sends.
declare module 'pg/lib/utils.js' {
  const utils: {
    /** A parameter as node-postgres sends it: text (arrays as array literals, objects as JSON), a Buffer, or null. */
    prepareValue(value: unknown): string | Buffer | null;
  };
  export default utils;
}
