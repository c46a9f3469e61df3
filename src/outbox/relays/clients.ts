import { invalid } from '../../validate.js';

/**
 * A broker's client library, an optional peer dependency that only its users install: loaded
 * when a relay to that broker starts, and when it is missing, the relay is refused with the
 * `npm install` to run.
 */
export async function loadClient<T>(pkg: string, broker: string, install: string): Promise<T> {
  try {
    return (await import(pkg)) as T;
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    if (err.code === 'ERR_MODULE_NOT_FOUND' || err.code === 'MODULE_NOT_FOUND') {
      throw invalid(
        `a relay to ${broker} needs the package ${pkg}, which is not installed: npm install ${install}`,
      );
    }
    throw e;
  }
}
