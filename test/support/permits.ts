import { expect } from 'vitest';
import type { AcquireResult, Permit } from '../../src/throttles/permit.js';

/** The permit of a granted acquire; fails the test, showing the refusal, otherwise. */
export function granted(r: AcquireResult): Permit {
  expect(r.granted, JSON.stringify(r)).toBe(true);
  return r as Permit;
}
