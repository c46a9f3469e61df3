import { OrdoError } from './errors.js';

/**
 * A package only some applications install, an optional peer dependency (a broker's client for
 * a relay, a queue library for its adapter): loaded when first needed, never when ordo is
 * imported, and when it is missing, refused with the `npm install` to run. `load` is the
 * package's own `import()`, written where the package is used.
 */
export async function optionalPackage<T>(
  load: () => Promise<T>,
  pkg: string,
  /** Who needs it, to start the message: "a relay to NATS", "ordo/bullmq". */
  needs: string,
  install = pkg,
): Promise<T> {
  try {
    return await load();
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    // The package itself missing, not one of its own dependencies (which its error names).
    const missing = err?.code === 'ERR_MODULE_NOT_FOUND' || err?.code === 'MODULE_NOT_FOUND';
    if (missing && String(err.message).includes(`'${pkg}'`)) {
      throw new OrdoError(
        'invalid_argument',
        `${needs} needs ${pkg}, which is not installed: npm install ${install}`,
        {
          cause: e,
        },
      );
    }
    throw e;
  }
}
