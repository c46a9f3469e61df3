import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { OrdoError, toOrdoError } from '../src/errors.js';
import {
  Coalescer,
  type Issued,
  type Request,
  type Take,
  type TakeMany,
} from '../src/sequences/coalescer.js';

type Outcome<T> = { ok: true; value: T } | { ok: false; error: unknown };

/** One statement the coalescer sent: take (one request) or takeMany (several). */
interface Statement {
  kind: 'one' | 'batch';
  requests: Request[];
  outcome?: Outcome<Issued[][]>;
}

interface Gate {
  statement: Statement;
  open(): void;
  fail(error: unknown): void;
}

interface FakeOptions {
  /** Every statement waits until the test opens (or fails) it: the test decides what is in flight. */
  gated?: boolean;
  /** Highest value per sequence name; past it, sequence_exhausted. */
  limits?: Record<string, number>;
  /** Sequence names that do not exist: sequence_not_found. */
  unknown?: string[];
  /** When set, every takeMany throws this (after its gate, if gated). */
  batchError?: unknown;
}

/**
 * An in-memory gapless counter per (name, scope, at), with the contract of the SQL behind
 * take and takeMany: a statement takes exactly `count` consecutive values per request, all
 * or nothing (one failing request fails the whole statement), and values are decided when the
 * statement runs, that is when its gate opens.
 */
class FakeDb {
  readonly statements: Statement[] = [];
  readonly gates: Gate[] = [];
  /** Statements started and not finished, now and at most. */
  open = 0;
  maxOpen = 0;
  private readonly last = new Map<string, number>();

  constructor(private readonly options: FakeOptions = {}) {}

  readonly take: Take = async (request) => (await this.run('one', [request]))[0]!;
  readonly takeMany = (requests: Request[]) => this.run('batch', requests);

  private async run(kind: Statement['kind'], requests: Request[]): Promise<Issued[][]> {
    const statement: Statement = { kind, requests: requests.map((r) => ({ ...r })) };
    this.statements.push(statement);
    this.open++;
    this.maxOpen = Math.max(this.maxOpen, this.open);
    try {
      if (this.options.gated) {
        await new Promise<void>((open, fail) => this.gates.push({ statement, open, fail }));
      }
      if (kind === 'batch' && this.options.batchError !== undefined) throw this.options.batchError;
      const value = this.execute(requests);
      statement.outcome = { ok: true, value };
      return value;
    } catch (error) {
      statement.outcome = { ok: false, error };
      throw error;
    } finally {
      this.open--;
    }
  }

  private execute(requests: Request[]): Issued[][] {
    const next = new Map(this.last);
    const answers = requests.map((r) => {
      if (this.options.unknown?.includes(r.name)) {
        throw new OrdoError('sequence_not_found', `The sequence '${r.name}' does not exist`);
      }
      const key = `${r.name}|${r.scope}|${r.at}`;
      const last = next.get(key) ?? 0;
      const max = this.options.limits?.[r.name] ?? Number.MAX_SAFE_INTEGER;
      if (last + r.count > max) {
        throw new OrdoError('sequence_exhausted', `The sequence '${r.name}' is exhausted at ${max}`);
      }
      next.set(key, last + r.count);
      return Array.from({ length: r.count }, (_, i): Issued => {
        const value = last + i + 1;
        return { value, text: `${r.name}-${value}`, period: r.at?.slice(0, 10) ?? null, scope: r.scope };
      });
    });
    for (const [key, value] of next) this.last.set(key, value);
    return answers;
  }

  /** The statements so far, compactly: 'one a×3', 'batch a×2 b/acme×1 c@2026-01-01×1'. */
  log(): string[] {
    return this.statements.map(line);
  }

  /** Opens the gate at `index` (default: the oldest still closed) and returns its statement. */
  openAt(index = 0): Statement {
    const [gate] = this.gates.splice(index, 1);
    if (!gate) throw new Error(`no statement is waiting at ${index}`);
    gate.open();
    return gate.statement;
  }

  /** Opens the oldest gate whose statement reads `wanted`, as in log(). */
  openWhere(wanted: string): Statement {
    const index = this.gates.findIndex((g) => line(g.statement) === wanted);
    if (index < 0) throw new Error(`no statement '${wanted}' is waiting`);
    return this.openAt(index);
  }

  failNext(error: unknown): Statement {
    const gate = this.gates.shift();
    if (!gate) throw new Error('no statement is waiting');
    gate.fail(error);
    return gate.statement;
  }

  /** Opens every statement, oldest first, including those started meanwhile, until none waits. */
  async drain(): Promise<void> {
    await settle();
    while (this.gates.length > 0) {
      this.openAt(0);
      await settle();
    }
  }
}

function line(s: Statement): string {
  return `${s.kind} ${s.requests.map(label).join(' ')}`;
}

function label(r: Request): string {
  return `${r.name}${r.scope ? `/${r.scope}` : ''}${r.at ? `@${r.at.slice(0, 10)}` : ''}×${r.count}`;
}

/** Lets every pending promise callback run. */
/** An error as the server answers a failed statement (which it then rolled back), as ordo reports it. */
const serverError = (sqlstate: string, message: string) =>
  toOrdoError(Object.assign(new Error(message), { severity: 'ERROR', code: sqlstate }));
const LOCK_TIMEOUT = serverError('55P03', 'canceling statement due to lock timeout');

const settle = () => new Promise<void>((resolve) => setImmediate(resolve));

/** Records how each promise settled, and in what order. */
function track<T>(promises: Promise<T>[]) {
  const order: number[] = [];
  const outcomes: (Outcome<T> | undefined)[] = promises.map(() => undefined);
  promises.forEach((p, i) => {
    p.then(
      (value) => {
        outcomes[i] = { ok: true, value };
        order.push(i);
      },
      (error: unknown) => {
        outcomes[i] = { ok: false, error };
        order.push(i);
      },
    );
  });
  return { order, outcomes };
}

/** Each outcome as its value(s), its error code, or undefined while pending. */
function brief(outcomes: (Outcome<Issued | Issued[]> | undefined)[]): unknown[] {
  return outcomes.map((o) => {
    if (o === undefined) return undefined;
    if (!o.ok) return (o.error as OrdoError).code ?? 'error';
    return Array.isArray(o.value) ? values(o.value) : o.value.value;
  });
}

const values = (issued: Issued[]) => issued.map((i) => i.value);

/** A caller that wants one value (submit's default count), answered with exactly one. */
function one(c: Coalescer, name: string, scope = '', at: string | null = null): Promise<Issued> {
  return c.submit(name, scope, at).then((issued) => {
    if (issued.length !== 1) throw new Error(`one value wanted, ${issued.length} given`);
    return issued[0]!;
  });
}

/** n callers of one value each, in this order. */
const callers = (c: Coalescer, name: string, n = 1, scope = '', at: string | null = null) =>
  Array.from({ length: n }, () => one(c, name, scope, at));

describe('Coalescer', () => {
  describe('dispatch', () => {
    it('sends a lone call alone, through take', async () => {
      const db = new FakeDb();
      const c = new Coalescer(db.take, db.takeMany);
      const issued = await c.submit('inv', 'acme', null);
      expect(issued).toEqual([{ value: 1, text: 'inv-1', period: null, scope: 'acme' }]);
      expect(db.statements).toEqual([
        {
          kind: 'one',
          requests: [{ name: 'inv', scope: 'acme', at: null, count: 1 }],
          outcome: { ok: true, value: [issued] },
        },
      ]);
    });

    it('dispatches in a microtask: nothing inside submit(), everything from the same tick after it', async () => {
      const db = new FakeDb();
      const c = new Coalescer(db.take, db.takeMany);
      const calls = [one(c, 'inv', '', null)];
      expect(db.statements).toHaveLength(0);
      calls.push(one(c, 'inv', '', null));
      expect(db.statements).toHaveLength(0);
      await Promise.resolve();
      expect(db.log()).toEqual(['one inv×2']);
      expect(values(await Promise.all(calls))).toEqual([1, 2]);
    });

    it('sends the calls of one key made in the same tick as one take of count n, in arrival order', async () => {
      const db = new FakeDb();
      const c = new Coalescer(db.take, db.takeMany);
      const calls = callers(c, 'inv', 6, 'acme', '2026-03-01T10:00:00.000Z');
      const { order } = track(calls);
      const issued = await Promise.all(calls);
      expect(db.statements.map((s) => [s.kind, s.requests])).toEqual([
        ['one', [{ name: 'inv', scope: 'acme', at: '2026-03-01T10:00:00.000Z', count: 6 }]],
      ]);
      expect(values(issued)).toEqual([1, 2, 3, 4, 5, 6]);
      expect(issued.map((i) => i.text)).toEqual(['inv-1', 'inv-2', 'inv-3', 'inv-4', 'inv-5', 'inv-6']);
      expect(order).toEqual([0, 1, 2, 3, 4, 5]);
    });

    it('sends the calls of several keys made in the same tick as one takeMany: result i answers request i', async () => {
      const db = new FakeDb();
      const c = new Coalescer(db.take, db.takeMany);
      const at = '2026-01-01T00:00:00.000Z';
      const calls = [
        one(c, 'a', '', null),
        one(c, 'b', '', null),
        one(c, 'a', '', null),
        one(c, 'a', 'x', null), // another scope: another key
        one(c, 'a', '', at), // another at: another key
        one(c, 'b', '', null),
        one(c, 'c', '', null),
        one(c, 'a', '', null),
      ];
      const issued = await Promise.all(calls);
      // Grouped by (name, scope, at), in order of each key's first caller.
      expect(db.log()).toEqual(['batch a×3 b×2 a/x×1 a@2026-01-01×1 c×1']);
      expect(db.statements[0]!.requests[3]).toEqual({ name: 'a', scope: '', at, count: 1 });
      expect(values(issued)).toEqual([1, 1, 2, 1, 1, 2, 1, 3]);
      expect(issued.map((i) => `${i.text}/${i.scope}/${i.period}`)).toEqual([
        'a-1//null',
        'b-1//null',
        'a-2//null',
        'a-1/x/null',
        'a-1//2026-01-01',
        'b-2//null',
        'c-1//null',
        'a-3//null',
      ]);
    });

    it('sends a call made after a dispatch in a statement of its own', async () => {
      const db = new FakeDb();
      const c = new Coalescer(db.take, db.takeMany);
      const first = one(c, 'inv', '', null);
      await Promise.resolve();
      const second = one(c, 'inv', '', null);
      expect(values(await Promise.all([first, second]))).toEqual([1, 2]);
      await c.idle();
      expect((await one(c, 'inv', '', null)).value).toBe(3);
      expect(db.log()).toEqual(['one inv×1', 'one inv×1', 'one inv×1']);
    });
  });

  describe('maxInFlight', () => {
    it('1: while a statement is held open, later callers queue, then go out together', async () => {
      const db = new FakeDb({ gated: true });
      const c = new Coalescer(db.take, db.takeMany, 1);
      const first = one(c, 'a', '', null);
      await settle();
      expect(db.log()).toEqual(['one a×1']);

      // Callers from three more ticks, two keys.
      const queued = [one(c, 'a', '', null), one(c, 'b', '', null)];
      await settle();
      queued.push(one(c, 'a', '', null));
      await Promise.resolve();
      queued.push(one(c, 'b', '', null));
      await settle();
      expect(db.log()).toEqual(['one a×1']);

      db.openAt();
      expect((await first).value).toBe(1);
      await settle();
      expect(db.log()).toEqual(['one a×1', 'batch a×2 b×2']);
      db.openAt();
      expect(values(await Promise.all(queued))).toEqual([2, 1, 3, 2]);
      expect(db.statements).toHaveLength(2);
      expect(db.maxOpen).toBe(1);
    });

    it('2: two statements may be open at once, not three', async () => {
      const db = new FakeDb({ gated: true });
      const c = new Coalescer(db.take, db.takeMany, 2);
      const first = one(c, 'a', '', null);
      await settle();
      const second = one(c, 'a', '', null);
      await settle();
      expect(db.log()).toEqual(['one a×1', 'one a×1']);
      expect(db.gates).toHaveLength(2);

      const third = [one(c, 'a', '', null), one(c, 'b', '', null)];
      await settle();
      const fourth = one(c, 'b', '', null);
      await settle();
      expect(db.statements).toHaveLength(2);

      db.openAt(); // a slot frees: everyone queued meanwhile goes out in one statement
      await settle();
      expect(db.log()).toEqual(['one a×1', 'one a×1', 'batch a×1 b×2']);
      expect(db.gates).toHaveLength(2);
      await db.drain();
      expect(values(await Promise.all([first, second, ...third, fourth]))).toEqual([1, 2, 3, 1, 2]);
      expect(db.maxOpen).toBe(2);
    });

    it('is 2 by default', async () => {
      const db = new FakeDb({ gated: true });
      const c = new Coalescer(db.take, db.takeMany);
      const calls: Promise<Issued>[] = [];
      for (let tick = 0; tick < 4; tick++) {
        calls.push(one(c, 'a', '', null));
        await settle();
      }
      expect(db.log()).toEqual(['one a×1', 'one a×1']);
      await db.drain();
      expect(values(await Promise.all(calls))).toEqual([1, 2, 3, 4]);
      expect(db.log()).toEqual(['one a×1', 'one a×1', 'one a×2']);
      expect(db.maxOpen).toBe(2);
    });
  });

  describe('order and gaplessness', () => {
    const KEYS: [string, string, string | null][] = [
      ['inv', '', null],
      ['inv', 'acme', null],
      ['inv', '', '2026-01-01T00:00:00.000Z'],
      ['po', '', null],
      ['po', 'acme', null],
      ['rx', '', null],
      ['rx', 'globex', '2026-02-01T00:00:00.000Z'],
    ];
    const CALLERS = 500;
    const MOST_WANTED = 4;

    const scenario = fc.record({
      /** The key of each caller, in arrival order. */
      keys: fc.array(fc.integer({ min: 0, max: KEYS.length - 1 }), {
        minLength: CALLERS,
        maxLength: CALLERS,
      }),
      /** How many values each caller wants: mostly one. */
      counts: fc.array(
        fc.oneof(
          { arbitrary: fc.constant(1), weight: 3 },
          { arbitrary: fc.integer({ min: 2, max: MOST_WANTED }), weight: 1 },
        ),
        { minLength: CALLERS, maxLength: CALLERS },
      ),
      /** arrive: the next n callers arrive in this tick; release: a statement runs; then a tick or a turn. */
      steps: fc.array(
        fc.record({ kind: fc.constantFrom('arrive', 'release', 'microtask', 'settle'), n: fc.nat(40) }),
        { maxLength: 150 },
      ),
      /** Which open statement runs next, when not the oldest. */
      picks: fc.array(fc.nat(), { minLength: 1, maxLength: 30 }),
      maxInFlight: fc.integer({ min: 1, max: 3 }),
      maxBatch: fc.oneof(fc.integer({ min: 1, max: 60 }), fc.constant(10_000)),
    });
    type Scenario = typeof scenario extends fc.Arbitrary<infer S> ? S : never;

    /** Plays a scenario; statements run oldest first, or in an order the scenario picks. */
    async function play(s: Scenario, oldestFirst: boolean) {
      const db = new FakeDb({ gated: true });
      const c = new Coalescer(db.take, db.takeMany, s.maxInFlight, s.maxBatch);
      const answers: (Issued[] | undefined)[] = [];
      const errors: unknown[] = [];
      let arrived = 0;
      const arrive = (n: number) => {
        for (let i = 0; i < n && arrived < CALLERS; i++, arrived++) {
          const index = arrived;
          const [name, scope, at] = KEYS[s.keys[index]!]!;
          c.submit(name, scope, at, s.counts[index]!).then(
            (issued) => {
              answers[index] = issued;
            },
            (error: unknown) => errors.push(error),
          );
        }
      };
      let pick = 0;
      const release = () => {
        if (db.gates.length === 0) return;
        db.openAt(oldestFirst ? 0 : s.picks[pick++ % s.picks.length]! % db.gates.length);
      };
      for (const step of s.steps) {
        if (step.kind === 'arrive') arrive(step.n + 1);
        else if (step.kind === 'release') release();
        else if (step.kind === 'microtask') await Promise.resolve();
        else await settle();
      }
      arrive(CALLERS);
      let answeredAtIdle: number | undefined;
      void c.idle().then(() => {
        answeredAtIdle = answers.filter((a) => a !== undefined).length + errors.length;
      });
      for (let round = 0; answeredAtIdle === undefined; round++) {
        if (round > 5 * CALLERS) throw new Error('idle() never resolved');
        release();
        await settle();
      }
      return { db, answers, errors, answeredAtIdle };
    }

    /** Checks what holds in any order, and returns each key's values in its callers' arrival order. */
    function check(s: Scenario, result: Awaited<ReturnType<typeof play>>): number[][] {
      const { db, answers, errors, answeredAtIdle } = result;
      expect(errors).toEqual([]);
      expect(answeredAtIdle).toBe(CALLERS);
      expect(db.maxOpen).toBeLessThanOrEqual(s.maxInFlight);
      expect(db.statements.length).toBeLessThanOrEqual(CALLERS);
      // Statements take exactly what they hand out: never more values than were wanted.
      const sum = (requests: Request[]) => requests.reduce((n, r) => n + r.count, 0);
      expect(sum(db.statements.flatMap((st) => st.requests))).toBe(s.counts.reduce((n, k) => n + k, 0));
      for (const st of db.statements) {
        expect(st.kind).toBe(st.requests.length === 1 ? 'one' : 'batch');
        expect(new Set(st.requests.map((r) => label({ ...r, count: 0 }))).size).toBe(st.requests.length);
        // At most maxBatch values, unless a single caller wants more by itself.
        if (sum(st.requests) > s.maxBatch) {
          expect(st.requests).toHaveLength(1);
          expect(sum(st.requests)).toBeLessThanOrEqual(MOST_WANTED);
        }
      }
      // Every caller got as many values as it wanted, consecutive, of its own key.
      answers.forEach((issued, i) => {
        const [name, scope, at] = KEYS[s.keys[i]!]!;
        expect(issued).toHaveLength(s.counts[i]!);
        const first = issued![0]!.value;
        issued!.forEach((one, j) => {
          expect(one).toEqual({
            value: first + j,
            text: `${name}-${first + j}`,
            scope,
            period: at?.slice(0, 10) ?? null,
          });
        });
      });
      return KEYS.map((_, k) => answers.flatMap((a, i) => (s.keys[i] === k ? values(a!) : [])));
    }

    /** A failing run shrinks for at most 30 s, so the counterexample shows before the test times out. */
    const PROPERTY_OPTIONS = {
      numRuns: 60,
      plugins: [fc.interruptAfterTimeLimit(30_000, { failOnInterrupt: true })],
    };
    const oneToN = (n: number) => Array.from({ length: n }, (_, i) => i + 1);

    it('statements run in the order sent: every key answers 1..n to its callers in arrival order', async () => {
      await fc.assert(
        fc.asyncProperty(scenario, async (s) => {
          for (const got of check(s, await play(s, true))) expect(got).toEqual(oneToN(got.length));
        }),
        PROPERTY_OPTIONS,
      );
    });

    it('statements run in any order: every key hands out exactly 1..n, none skipped or repeated', async () => {
      await fc.assert(
        fc.asyncProperty(scenario, async (s) => {
          for (const got of check(s, await play(s, false))) {
            expect([...got].sort((x, y) => x - y)).toEqual(oneToN(got.length));
          }
        }),
        PROPERTY_OPTIONS,
      );
    });
  });

  describe('maxBatch', () => {
    it('splits a long queue, splitting a group if it must; the remainder goes out first next time', async () => {
      const db = new FakeDb({ gated: true });
      const c = new Coalescer(db.take, db.takeMany, 1, 4);
      const first = one(c, 'x', '', null);
      await settle();
      const queued = [...callers(c, 'c', 2), ...callers(c, 'a', 5), ...callers(c, 'b', 1)];
      await db.drain();
      expect(db.log()).toEqual(['one x×1', 'batch c×2 a×2', 'batch a×3 b×1']);
      expect((await first).value).toBe(1);
      expect(values(await Promise.all(queued))).toEqual([1, 2, 1, 2, 3, 4, 5, 1]);
    });

    it('splits one big group into statements of at most maxBatch', async () => {
      const db = new FakeDb({ gated: true });
      const c = new Coalescer(db.take, db.takeMany, 1, 3);
      const calls = callers(c, 'a', 8);
      const { order } = track(calls);
      await db.drain();
      expect(db.log()).toEqual(['one a×3', 'one a×3', 'one a×2']);
      expect(values(await Promise.all(calls))).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
      expect(order).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    });

    it('with room in flight, sends the remainder at once, and the rest when a slot frees', async () => {
      const db = new FakeDb({ gated: true });
      const c = new Coalescer(db.take, db.takeMany, 2, 3);
      const calls = callers(c, 'a', 7);
      await settle();
      expect(db.log()).toEqual(['one a×3', 'one a×3']);
      db.openAt();
      await settle();
      expect(db.log()).toEqual(['one a×3', 'one a×3', 'one a×1']);
      await db.drain();
      expect(values(await Promise.all(calls))).toEqual([1, 2, 3, 4, 5, 6, 7]);
      expect(db.maxOpen).toBe(2);
    });
  });

  describe('callers wanting several values', () => {
    it('gives each caller its own consecutive slice; the callers of a tick share one statement', async () => {
      const db = new FakeDb();
      const c = new Coalescer(db.take, db.takeMany);
      const first = track<Issued | Issued[]>([
        c.submit('a', '', null, 3),
        one(c, 'a'),
        c.submit('a', '', null, 2),
        c.submit('b', '', null, 2),
      ]);
      await c.idle();
      expect(db.log()).toEqual(['batch a×6 b×2']);
      expect(brief(first.outcomes)).toEqual([[1, 2, 3], 4, [5, 6], [1, 2]]);

      const second = track([c.submit('a', '', null, 2), c.submit('a', '', null)]);
      await c.idle();
      expect(db.log()).toEqual(['batch a×6 b×2', 'one a×3']);
      expect(brief(second.outcomes)).toEqual([[7, 8], [9]]);
    });

    it('maxBatch counts values and never splits a caller; one wanting more than maxBatch goes out alone', async () => {
      const db = new FakeDb({ gated: true });
      const c = new Coalescer(db.take, db.takeMany, 1, 4);
      const first = one(c, 'x');
      await settle();
      const { outcomes } = track([
        c.submit('a', '', null, 3),
        c.submit('a', '', null, 2),
        c.submit('b', '', null, 5),
        c.submit('c', '', null, 1),
      ]);
      await db.drain();
      // Arrival order is kept: c, which would fit beside a×3, waits for b rather than overtake it.
      expect(db.log()).toEqual(['one x×1', 'one a×3', 'one a×2', 'one b×5', 'one c×1']);
      expect((await first).value).toBe(1);
      expect(brief(outcomes)).toEqual([[1, 2, 3], [4, 5], [1, 2, 3, 4, 5], [1]]);
    });

    it('takes at most 10 000 values in a statement by default', async () => {
      const db = new FakeDb();
      const c = new Coalescer(db.take, db.takeMany);
      const calls = [c.submit('a', '', null, 6000), c.submit('a', '', null, 5000), c.submit('b', '', null)];
      const [a1, a2, b] = await Promise.all(calls);
      // The second caller of a does not fit; b, behind it, waits for its turn (arrival order).
      expect(db.log()).toEqual(['one a×6000', 'batch a×5000 b×1']);
      expect([a1!.length, a1![0]!.value, a1!.at(-1)!.value]).toEqual([6000, 1, 6000]);
      expect([a2!.length, a2![0]!.value, a2!.at(-1)!.value]).toEqual([5000, 6001, 11000]);
      expect(values(b!)).toEqual([1]);
    });

    it('when exhausted, serves caller by caller, each its whole count or nothing', async () => {
      const db = new FakeDb({ limits: { x: 4 } });
      const c = new Coalescer(db.take, db.takeMany);
      const { outcomes } = track([
        c.submit('x', '', null, 2),
        c.submit('x', '', null, 3),
        c.submit('x', '', null),
        c.submit('x', '', null),
      ]);
      await c.idle();
      expect(db.log()).toEqual(['one x×7', 'one x×2', 'one x×3', 'one x×1', 'one x×1']);
      // The caller wanting 3 when 2 are left is refused; the ones behind it share those 2.
      expect(brief(outcomes)).toEqual([[1, 2], 'sequence_exhausted', [3], [4]]);
    });

    it('refuses a lone caller wanting more than is left at once, with no retry', async () => {
      const db = new FakeDb({ limits: { x: 2 } });
      const c = new Coalescer(db.take, db.takeMany);
      const error = await c.submit('x', '', null, 3).catch((e: unknown) => e);
      expect((error as OrdoError).code).toBe('sequence_exhausted');
      expect(db.log()).toEqual(['one x×3']);
      expect(values(await c.submit('x', '', null, 2))).toEqual([1, 2]);
    });

    // A waiter of count 0 would add nothing to the queue and never be dispatched: it is refused.
    it('refuses a call of count 0 at once, sending nothing', async () => {
      const db = new FakeDb();
      const c = new Coalescer(db.take, db.takeMany);
      await expect(c.submit('a', '', null, 0)).rejects.toMatchObject({ code: 'invalid_argument' });
      await c.idle();
      expect(db.log()).toEqual([]);
    });

    it('a takeMany answering a request with too few values serves that request’s callers alone, and only them', async () => {
      const db = new FakeDb();
      const short: TakeMany = async (requests) => {
        const answers = await db.takeMany(requests);
        return answers.map((a, i) => (i === 1 ? a.slice(1) : a));
      };
      const c = new Coalescer(db.take, short);
      const results = await Promise.allSettled([
        one(c, 'a', '', null),
        one(c, 'b', '', null),
        one(c, 'b', '', null),
      ]);
      expect(results.map((r) => r.status)).toEqual(['fulfilled', 'fulfilled', 'fulfilled']);
      // The short answer was never sliced: b's callers took their values again, alone (the fake
      // counter had moved on by the two values of the short answer).
      expect(db.log()).toEqual(['batch a×1 b×2', 'one b×1', 'one b×1']);
      expect(results.map((r) => (r as PromiseFulfilledResult<Issued>).value.value)).toEqual([1, 3, 4]);
      await expect(c.idle()).resolves.toBeUndefined();
    });
  });

  describe('takeMany failure', () => {
    it('serves each caller through take on its own: an unknown key is refused, the others answered', async () => {
      const db = new FakeDb({ unknown: ['nope'] });
      const c = new Coalescer(db.take, db.takeMany);
      const calls = [
        one(c, 'a', '', null),
        one(c, 'nope', '', null),
        one(c, 'b', '', null),
        one(c, 'a', '', null),
      ];
      const results = await Promise.allSettled(calls);
      // Keys side by side, the callers of one key one after another.
      expect(db.log()).toEqual(['batch a×2 nope×1 b×1', 'one a×1', 'one nope×1', 'one b×1', 'one a×1']);
      const refusal = db.statements[2]!.outcome;
      expect(refusal?.ok).toBe(false);
      expect(results).toEqual([
        { status: 'fulfilled', value: expect.objectContaining({ text: 'a-1' }) },
        // The error take threw for that group, as it is.
        { status: 'rejected', reason: refusal?.ok === false ? refusal.error : 'no error' },
        { status: 'fulfilled', value: expect.objectContaining({ text: 'b-1' }) },
        { status: 'fulfilled', value: expect.objectContaining({ text: 'a-2' }) },
      ]);
      expect(((results[1] as PromiseRejectedResult).reason as OrdoError).code).toBe('sequence_not_found');
    });

    it.each([
      ['a lock timeout from the server', LOCK_TIMEOUT],
      ['an error the server answered', serverError('40P01', 'deadlock detected')],
      ['a refusal of ordo', new OrdoError('sequence_not_found', 'The sequence was removed')],
    ])('falls back when the statement surely wrote nothing: %s', async (_, thrown) => {
      const db = new FakeDb({ batchError: thrown });
      const c = new Coalescer(db.take, db.takeMany);
      const calls = [...callers(c, 'a', 2), ...callers(c, 'b', 1)];
      expect(values(await Promise.all(calls))).toEqual([1, 2, 1]);
      expect(db.log()).toEqual(['batch a×2 b×1', 'one a×1', 'one b×1', 'one a×1']);
      expect(db.statements[0]!.outcome).toEqual({ ok: false, error: thrown });
    });

    it.each([
      ['a client-side timeout', toOrdoError(new Error('Query read timeout'))],
      ['a lost connection', toOrdoError(new Error('Connection terminated unexpectedly'))],
      ['a plain Error', new TypeError('cannot read properties of undefined')],
      ['a string', 'connection reset'],
    ])(
      'gives every caller the error when the statement may have committed (%s): taking again could take twice',
      async (_, thrown) => {
        const db = new FakeDb({ batchError: thrown });
        const c = new Coalescer(db.take, db.takeMany);
        const calls = [...callers(c, 'a', 2), ...callers(c, 'b', 1)];
        expect(await Promise.allSettled(calls)).toEqual(
          calls.map(() => ({ status: 'rejected', reason: thrown })),
        );
        expect(db.log()).toEqual(['batch a×2 b×1']);
      },
    );

    it('runs the fallback statements of different keys in parallel, outside the slots', async () => {
      const db = new FakeDb({ gated: true, unknown: ['nope'] });
      const c = new Coalescer(db.take, db.takeMany, 1);
      const calls = [one(c, 'a', '', null), one(c, 'nope', '', null), one(c, 'b', '', null)];
      const { outcomes } = track(calls);
      await settle();
      db.openAt(); // the batch fails
      await settle();
      expect(db.log()).toEqual(['batch a×1 nope×1 b×1', 'one a×1', 'one nope×1', 'one b×1']);
      expect(db.gates).toHaveLength(3);
      // The fallback does not hold the one slot: a caller arriving now goes out at once.
      const late = one(c, 'a', '', null);
      await settle();
      expect(db.log().slice(4)).toEqual(['one a×1']);

      db.openWhere('one b×1');
      await settle();
      expect(brief(outcomes)).toEqual([undefined, undefined, 1]);
      db.openWhere('one nope×1');
      await settle();
      expect(brief(outcomes)).toEqual([undefined, 'sequence_not_found', 1]);
      await db.drain();
      // The fallback's a was sent first and opened first; the late caller took the next value.
      expect(brief(outcomes)).toEqual([1, 'sequence_not_found', 1]);
      expect((await late).value).toBe(2);
      expect(db.statements).toHaveLength(5);
    });

    it('falls back one by one for an exhausted group within the fallback', async () => {
      const db = new FakeDb({ limits: { e: 2 } });
      const c = new Coalescer(db.take, db.takeMany);
      const { outcomes } = track([one(c, 'a', '', null), ...callers(c, 'e', 3), one(c, 'a', '', null)]);
      await c.idle();
      expect(db.log()).toEqual(['batch a×2 e×3', 'one a×1', 'one e×1', 'one a×1', 'one e×1', 'one e×1']);
      expect(brief(outcomes)).toEqual([1, 1, 2, 'sequence_exhausted', 2]);
    });
  });

  describe('sequence_exhausted', () => {
    it('for a group of k > 1, serves its callers one by one: what is left goes first come, first served', async () => {
      const db = new FakeDb({ limits: { inv: 4 } });
      const c = new Coalescer(db.take, db.takeMany);
      const results = await Promise.allSettled(callers(c, 'inv', 7));
      expect(results.map((r) => r.status)).toEqual([
        'fulfilled',
        'fulfilled',
        'fulfilled',
        'fulfilled',
        'rejected',
        'rejected',
        'rejected',
      ]);
      expect(results.flatMap((r) => (r.status === 'fulfilled' ? [r.value.value] : []))).toEqual([1, 2, 3, 4]);
      for (const r of results.slice(4)) {
        const reason = (r as PromiseRejectedResult).reason;
        expect(reason).toBeInstanceOf(OrdoError);
        expect((reason as OrdoError).code).toBe('sequence_exhausted');
      }
      expect(db.log()).toEqual(['one inv×7', ...Array.from({ length: 7 }, () => 'one inv×1')]);
    });

    it('with nothing left, refuses every caller, after k + 1 statements', async () => {
      const db = new FakeDb({ limits: { x: 0 } });
      const c = new Coalescer(db.take, db.takeMany);
      const results = await Promise.allSettled(callers(c, 'x', 3));
      for (const r of results) {
        expect(r.status === 'rejected' && (r.reason as OrdoError).code).toBe('sequence_exhausted');
      }
      expect(db.log()).toEqual(['one x×3', 'one x×1', 'one x×1', 'one x×1']);
    });

    it('refuses a group of one at once, with no retry', async () => {
      const db = new FakeDb({ limits: { x: 0 } });
      const c = new Coalescer(db.take, db.takeMany);
      const error = await one(c, 'x', '', null).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(OrdoError);
      expect((error as OrdoError).code).toBe('sequence_exhausted');
      expect(db.log()).toEqual(['one x×1']);
    });

    it.each([
      ['a lock timeout', LOCK_TIMEOUT],
      ['sequence_not_found', new OrdoError('sequence_not_found', 'The sequence was removed')],
      ['an error the server answered', serverError('40P01', 'deadlock detected')],
    ])(
      'a shared statement that failed and wrote nothing (%s) serves its callers alone, in arrival order',
      async (_, error) => {
        const db = new FakeDb({ gated: true });
        const c = new Coalescer(db.take, db.takeMany);
        const calls = callers(c, 'x', 3);
        const { outcomes } = track(calls);
        await settle();
        db.failNext(error);
        await settle();
        expect(outcomes).toEqual([undefined, undefined, undefined]);
        await db.drain();
        expect(brief(outcomes)).toEqual([1, 2, 3]);
        expect(db.log()).toEqual(['one x×3', 'one x×1', 'one x×1', 'one x×1']);
      },
    );

    it('a lone caller’s failure is its answer, with no retry', async () => {
      const db = new FakeDb({ gated: true });
      const c = new Coalescer(db.take, db.takeMany);
      const { outcomes } = track([c.submit('x', '', null, 3)]);
      await settle();
      const error = new OrdoError('timeout', 'canceling statement due to lock timeout');
      db.failNext(error);
      await settle();
      expect(outcomes).toEqual([{ ok: false, error }]);
      expect(db.log()).toEqual(['one x×3']);
    });

    it('in the fallback, each caller gets its own outcome in order; a later caller does not wait for it', async () => {
      const db = new FakeDb({ gated: true, limits: { x: 2 } });
      const c = new Coalescer(db.take, db.takeMany, 1);
      const { outcomes } = track(callers(c, 'x', 3));
      await settle();
      db.openAt(); // 3 asked, 2 left: exhausted
      await settle();
      expect(db.log()).toEqual(['one x×3', 'one x×1']);
      // Outside the slot: a caller arriving now goes out at once, beside the fallback.
      const late = track([one(c, 'x', '', null)]).outcomes;
      await settle();
      expect(db.log()).toEqual(['one x×3', 'one x×1', 'one x×1']);
      db.openWhere('one x×1'); // the fallback's first: value 1
      await settle();
      expect(brief(outcomes)).toEqual([1, undefined, undefined]);
      db.openAt(); // the late caller: value 2
      await settle();
      expect(brief(late)).toEqual([2]);
      db.openAt(); // the fallback's second: exhausted
      await settle();
      db.openAt(); // the third: exhausted
      await settle();
      expect(brief(outcomes)).toEqual([1, 'sequence_exhausted', 'sequence_exhausted']);
      expect(db.log()).toEqual(['one x×3', 'one x×1', 'one x×1', 'one x×1', 'one x×1']);
    });

    it('in the fallback, another error refuses only the caller it hit', async () => {
      const db = new FakeDb({ gated: true, limits: { x: 2 } });
      const c = new Coalescer(db.take, db.takeMany);
      const { outcomes } = track(callers(c, 'x', 3));
      await settle();
      db.openAt(); // exhausted
      await settle();
      db.openAt(); // value 1
      await settle();
      const timeout = new OrdoError('timeout', 'canceling statement due to lock timeout');
      db.failNext(timeout);
      await settle();
      db.openAt(); // value 2: the failed statement took nothing
      await settle();
      expect(outcomes).toEqual([
        { ok: true, value: expect.objectContaining({ value: 1 }) },
        { ok: false, error: timeout },
        { ok: true, value: expect.objectContaining({ value: 2 }) },
      ]);
      expect(db.log()).toEqual(['one x×3', 'one x×1', 'one x×1', 'one x×1']);
    });

    it('treats synchronous throws like rejections: from takeMany, take and the one-by-one fallback', async () => {
      const unavailable = new OrdoError('database_unavailable', 'Cannot use a pool after calling end');
      let singles = 0;
      const take: Take = (request) => {
        if (request.name === 'down') throw unavailable;
        if (request.count > 1) throw new OrdoError('sequence_exhausted', 'exhausted');
        if (singles++ === 0) throw unavailable;
        return Promise.resolve([{ value: singles, text: `x-${singles}`, period: null, scope: '' }]);
      };
      const takeMany = (): Promise<Issued[][]> => {
        throw serverError('40P01', 'deadlock detected');
      };
      const c = new Coalescer(take, takeMany, 1);
      const { outcomes } = track([one(c, 'down', '', null), ...callers(c, 'x', 3)]);
      const idle = c.idle().then(
        () => 'resolved',
        (error: unknown) => error,
      );
      expect(await idle).toBe('resolved');
      expect(brief(outcomes)).toEqual(['database_unavailable', 'database_unavailable', 2, 3]);
      expect(outcomes[1]).toEqual({ ok: false, error: unavailable });
    });
  });

  describe('idle()', () => {
    it('resolves at once when nothing was asked', async () => {
      const db = new FakeDb();
      const c = new Coalescer(db.take, db.takeMany);
      await expect(c.idle()).resolves.toBeUndefined();
      expect(db.statements).toHaveLength(0);
    });

    it('waits for a call made in the same tick, not yet dispatched', async () => {
      const db = new FakeDb({ gated: true });
      const c = new Coalescer(db.take, db.takeMany);
      const { outcomes } = track([one(c, 'a', '', null)]);
      let seen: unknown;
      const idle = c.idle().then(() => {
        seen = brief(outcomes);
      });
      await settle();
      expect(seen).toBeUndefined();
      db.openAt();
      await idle;
      expect(seen).toEqual([1]);
    });

    it('waits until every queued caller is answered, across statements and keys', async () => {
      const db = new FakeDb({ gated: true });
      const c = new Coalescer(db.take, db.takeMany, 1);
      const calls = [one(c, 'a', '', null), one(c, 'b', '', null)];
      await settle();
      calls.push(...callers(c, 'a', 2));
      const { outcomes } = track(calls);
      let seen: unknown;
      const idle = c.idle().then(() => {
        seen = brief(outcomes);
      });
      db.openAt(); // batch a×1 b×1
      await settle();
      expect(seen).toBeUndefined();
      expect(brief(outcomes)).toEqual([1, 1, undefined, undefined]);
      // A caller arriving while idle() waits is waited for too.
      calls.push(one(c, 'b', '', null));
      const later = track([calls[4]!]).outcomes;
      db.openAt(); // a×2
      await settle();
      expect(seen).toBeUndefined();
      db.openAt(); // b×1
      await idle;
      expect(seen).toEqual([1, 1, 2, 3]);
      expect(brief(later)).toEqual([2]);
      expect(db.log()).toEqual(['batch a×1 b×1', 'one a×2', 'one b×1']);
    });

    it('waits for a failed takeMany and every fallback, and resolves although callers were refused', async () => {
      const db = new FakeDb({ gated: true, limits: { e: 1 }, unknown: ['nope'] });
      const c = new Coalescer(db.take, db.takeMany);
      const calls = [one(c, 'a', '', null), ...callers(c, 'e', 2), one(c, 'nope', '', null)];
      const { outcomes } = track(calls);
      let seen: unknown;
      const idle = c.idle().then(() => {
        seen = brief(outcomes);
      });
      for (let step = 0; step < 20 && seen === undefined; step++) {
        await settle();
        if (db.gates.length > 0 && seen === undefined) {
          expect(outcomes.some((o) => o === undefined)).toBe(true);
          db.openAt();
        }
      }
      await expect(idle).resolves.toBeUndefined();
      expect(seen).toEqual([1, 1, 'sequence_exhausted', 'sequence_not_found']);
      expect(db.log()).toEqual(['batch a×1 e×2 nope×1', 'one a×1', 'one e×1', 'one nope×1', 'one e×1']);
    });

    it('never rejects, even when every statement fails', async () => {
      const db = new FakeDb({ gated: true });
      const c = new Coalescer(db.take, db.takeMany);
      const calls = [one(c, 'a', '', null), one(c, 'b', '', null)].map((p) => p.catch((e: unknown) => e));
      const idle = c.idle();
      const boom = serverError('40P01', 'deadlock detected');
      for (let step = 0; step < 5; step++) {
        await settle();
        while (db.gates.length > 0) db.failNext(boom);
      }
      await expect(idle).resolves.toBeUndefined();
      expect(await Promise.all(calls)).toEqual([boom, boom]);
      expect(db.log()).toEqual(['batch a×1 b×1', 'one a×1', 'one b×1']);
    });
  });
});
