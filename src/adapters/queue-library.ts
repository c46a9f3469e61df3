import { OrdoError } from '../errors.js';

/**
 * A queue library, an optional peer dependency that only its users install: loaded when its
 * adapter's throttled() is called (never when the adapter is imported, so that require() of
 * the adapter works), and when it is missing, refused with the `npm install` to run.
 */
export async function queueLibrary<T>(load: () => Promise<T>, pkg: string, adapter: string): Promise<T> {
  try {
    return await load();
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    // The package itself missing, not one of its own dependencies (which its error names).
    const missing = err?.code === 'ERR_MODULE_NOT_FOUND' || err?.code === 'MODULE_NOT_FOUND';
    if (missing && String(err.message).includes(`'${pkg}'`)) {
      throw new OrdoError(
        'invalid_argument',
        `${adapter} throttles ${pkg}'s workers, and ${pkg} is not installed: npm install ${pkg}`,
        { cause: e },
      );
    }
    throw e;
  }
}
