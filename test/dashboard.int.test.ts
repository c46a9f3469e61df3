// The live dashboard of `ordo serve`, in a real Chromium (Debian's `chromium`, driven by
// playwright-core through executablePath: no browser is ever downloaded). The page refuses to
// show anything without a read token, says when a token is wrong, then shows what an
// application's day looks like: invoice numbers per tenant with a counter held by an open
// transaction, an orders topic whose billing subscription waits for an open transaction (naming
// it), relays of the orders to Redis and of receipts to a webhook that does not answer, a payment
// API throttle with running permits. It follows values live, reads without
// colour, fits a phone, renders hostile names as text, asks nothing of any other origin and logs
// no unexpected error. Its screenshot goes to .scratch/dashboard/ on every run and to
// docs/dashboard.png (the README's) only with ORDO_UPDATE_SCREENSHOT=1.
import { accessSync, constants, mkdirSync, readFileSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import type { FastifyInstance } from 'fastify';
import pg from 'pg';
import { type Browser, chromium, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo, type Permit, type Relay, type Subscription } from '../src/index.js';
import { freePort } from '../src/db/embedded.js';
import { buildServer, parseTokens } from '../src/server/app.js';
import { type OwnPostgres, ownPostgres } from './support/own-postgres.js';

// The browser's globals, read only inside page.evaluate() (this project compiles for Node).
declare const document: any;
declare const sessionStorage: any;
declare const localStorage: any;
declare const getComputedStyle: any;
declare const matchMedia: any;

/** Debian's package; another path for a machine that has Chromium elsewhere. */
const CHROMIUM = process.env.ORDO_TEST_CHROMIUM ?? '/usr/bin/chromium';
/** Scratch files (ignored by git); docs/dashboard.png is rewritten only when asked. */
const SCRATCH = fileURLToPath(new URL('../.scratch/dashboard/', import.meta.url));
const UPDATE_SCREENSHOT = process.env.ORDO_UPDATE_SCREENSHOT === '1';
const SCREENSHOT = UPDATE_SCREENSHOT
  ? fileURLToPath(new URL('../docs/dashboard.png', import.meta.url))
  : `${SCRATCH}dashboard.png`;
const DESKTOP = { width: 1280, height: 900 };
const PHONE = { width: 375, height: 800 };
const READER = 'reader-token-0123456789';
const ISSUER = 'issuer-token-0123456789';
const ADMIN = 'admin-token-0123456789xx';
/** A name that would run script if it were ever parsed as HTML. */
const XSS = '<img src=x onerror=alert(1)>';
/** Generous: other suites load the same two cores. */
const WAIT = { timeout: 45_000 };

let server: OwnPostgres;
let ordo: Ordo;
let app: FastifyInstance;
let origin: string;
let browser: Browser;
let page: Page;
const clients: pg.Client[] = [];
let holder: { client: pg.Client; pid: number };
let appender: { client: pg.Client; pid: number };
let permit: Permit;
let billing: Subscription;
const relays: Relay[] = [];
/** Where the receipts relay posts: a port nothing listens on. */
let deadHook: string;
/** What billing's consumer was handed, by message id. */
const billed: string[] = [];
/** The message the open transaction appended: billing's only undelivered one. */
const IMPORTED = 'order-1043';
/** A steady workload while the page is open, so that rates and sparklines have something. */
let workload: Promise<void> | undefined;
let working = true;

/** What the browser did: every request, console message, page error and dialog. */
const seen = {
  requests: [] as { url: string; authorization: string | undefined }[],
  console: [] as { type: string; text: string; url: string | undefined }[],
  pageErrors: [] as string[],
  dialogs: [] as string[],
  failed: [] as string[],
};

/** Fails at once, saying what to install, when the browser is missing. */
function checkChromium(): void {
  try {
    accessSync(CHROMIUM, constants.X_OK);
  } catch {
    throw new Error(
      `No Chromium at ${CHROMIUM}: the dashboard test drives Debian's package, installed with ` +
        '`apt-get install chromium` (or set ORDO_TEST_CHROMIUM to the path of another Chromium)',
    );
  }
}

/** A PNG's size from its header, after checking that it is one. */
function pngSize(file: string): { width: number; height: number; bytes: number } {
  const png = readFileSync(file);
  expect(png.subarray(0, 8).toString('hex'), file).toBe('89504e470d0a1a0a');
  expect(png.toString('latin1', 12, 16), file).toBe('IHDR');
  return { width: png.readUInt32BE(16), height: png.readUInt32BE(20), bytes: png.length };
}

/** The whole page as a PNG at `file`, checked: a fresh, non-empty image as wide as the viewport. */
async function screenshot(file: string, width: number): Promise<void> {
  rmSync(file, { force: true });
  const tall = () => page.evaluate(() => document.documentElement.scrollHeight as number);
  const before = await tall();
  await page.screenshot({ path: file, fullPage: true });
  const after = await tall();
  const size = pngSize(file);
  expect(size.width, file).toBe(width);
  expect(size.height, file).toBeGreaterThanOrEqual(Math.min(before, after));
  expect(size.height, file).toBeLessThanOrEqual(Math.max(before, after));
  expect(size.bytes, file).toBeGreaterThan(20_000);
}

/** A connection of its own, named as an application names it, with a transaction left open. */
async function openTransaction(applicationName: string): Promise<{ client: pg.Client; pid: number }> {
  const client = new pg.Client({ connectionString: server.url, application_name: applicationName });
  client.on('error', () => undefined);
  await client.connect();
  clients.push(client);
  const pid = (await client.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
  await client.query('BEGIN');
  return { client, pid };
}

beforeAll(async () => {
  checkChromium();
  mkdirSync(SCRATCH, { recursive: true });
  // A PostgreSQL of its own: the outbox's view of open transactions is cluster-wide.
  server = await ownPostgres();
  ordo = await createOrdo({ databaseUrl: server.url });
  app = await buildServer(ordo, {
    tokens: parseTokens(`${READER}:read,${ISSUER}:next,${ADMIN}:admin+next+read`),
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  origin = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;

  // Sequences: invoice numbers per tenant, one tenant's counter held by an open transaction (a
  // billing run); order ids in ranges this node holds. The hostile names come after the
  // screenshot, in their own test.
  await ordo.sequences.define({
    name: 'invoice',
    reset: 'year',
    timeZone: 'Europe/Paris',
    format: 'INV-{YYYY}-{n:6}',
  });
  await ordo.sequences.define({ name: 'orderId', kind: 'batched', batch: 100, start: 1000 });
  for (const [tenant, count] of [
    ['acme', 41],
    ['globex', 16],
    ['initech', 7],
    ['umbrella', 1],
  ] as const)
    await ordo.sequences.nextMany('invoice', count, { scope: tenant });
  await ordo.sequences.nextMany('orderId', 5);
  holder = await openTransaction('invoice-batch');
  await ordo.sequences.next('invoice', { scope: 'globex', tx: holder.client });

  // Outbox: the mailer parked two emails and is caught up since (on a topic nothing holds);
  // on orders, billing's consumer has every committed order and waits only for the one an
  // import appended in a transaction it keeps open, while shipping has no consumer and is behind.
  await ordo.outbox.createSubscription({ name: 'mailer', topic: 'emails' });
  for (const [to, error] of [
    ['customer-1042', 'SMTP 421 4.7.0 try again later'],
    ['customer-2177', '550 5.1.1 mailbox unavailable'],
  ] as const) {
    const data = { to, template: 'invoice-issued' };
    await ordo.outbox.append('emails', { type: 'EmailQueued', data, key: to });
    const received = await ordo.outbox.receive('mailer', { max: 1 });
    expect(received.messages.map((m) => m.data)).toEqual([data]);
    expect(await ordo.outbox.nack('mailer', received.receipt!, { error, maxAttempts: 1 })).toEqual({
      outcome: 'parked',
      attempts: 1,
    });
  }
  await ordo.outbox.createSubscription({ name: 'shipping', topic: 'orders' });
  billing = await ordo.outbox.subscribe({
    name: 'billing',
    topic: 'orders',
    handler: async (messages) => {
      for (const m of messages) billed.push(m.messageId ?? `#${m.position}`);
    },
  });
  for (let n = 1040; n < 1043; n++)
    await ordo.outbox.append('orders', {
      type: 'OrderPlaced',
      key: `order-${n}`,
      messageId: `order-${n}`,
      data: { order: `order-${n}`, tenant: 'acme' },
    });
  appender = await openTransaction('order-import');
  await ordo.outbox.append(
    'orders',
    { type: 'OrderPlaced', key: IMPORTED, messageId: IMPORTED, data: { order: IMPORTED, tenant: 'globex' } },
    { tx: appender.client },
  );

  // Relays: the orders to a Redis stream (the machine's Redis), the receipts to a webhook whose
  // receiver is away, so that relay is failing and says why.
  relays.push(
    await ordo.outbox.relay({
      name: 'orders-to-redis',
      topic: 'orders',
      to: { redis: { url: 'redis://127.0.0.1:6379', stream: `ordo-dashboard-${process.pid}-${Date.now()}` } },
    }),
  );
  deadHook = `http://127.0.0.1:${await freePort()}/hooks/receipts`;
  relays.push(
    await ordo.outbox.relay({
      name: 'receipts-to-hooks',
      topic: 'receipts',
      to: { webhook: { url: deadHook, secret: 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw' } },
    }),
  );
  await ordo.outbox.append('receipts', {
    type: 'ReceiptIssued',
    key: 'order-1040',
    data: { order: 'order-1040' },
  });

  // Throttles: the payment API, two calls at a time per tenant, with permits running and a
  // refusal; reports once an hour, one completed and one failed.
  await ordo.throttles.define({ name: 'payment_api', concurrency: 2, limit: 20, per: '1s', lease: '5m' });
  await ordo.throttles.define({ name: 'reports', every: '1h', refundOnFailure: false });
  const calls: Permit[] = [];
  for (const [key, worker] of [
    ['acme', 'worker-1'],
    ['acme', 'worker-2'],
    ['globex', 'worker-3'],
  ] as const) {
    const granted = await ordo.throttles.acquire('payment_api', { key, holder: worker });
    if (!granted.granted) throw new Error(`the payment call of ${key} by ${worker} must be granted`);
    calls.push(granted);
  }
  permit = calls[0]!;
  expect((await ordo.throttles.acquire('payment_api', { key: 'acme', holder: 'worker-4' })).granted).toBe(
    false,
  );
  const done = await ordo.throttles.acquire('reports', { key: 'monthly' });
  const failing = await ordo.throttles.acquire('reports', { key: 'weekly' });
  if (!done.granted || !failing.granted) throw new Error('both reports must be granted');
  await done.complete();
  await failing.fail(new Error('the export server said 503'));

  workload = (async () => {
    for (let i = 0; working; i++) {
      await ordo.sequences.next('invoice', { scope: 'acme' });
      await ordo.nextval('orderId');
      await ordo.outbox.append('orders', {
        type: 'OrderPaid',
        key: `order-${2000 + i}`,
        messageId: `paid-${2000 + i}`,
        data: { order: `order-${2000 + i}` },
      });
      const call = await ordo.throttles.acquire('payment_api', { key: 'initech', holder: 'checkout' });
      if (call.granted) await call.complete();
      await ordo.throttles.acquire('reports', { key: 'monthly' }); // refused: every 1h
      // Pacing of the background workload, not a wait for anything.
      await new Promise((r) => setTimeout(r, 150));
    }
  })();

  browser = await chromium.launch({ executablePath: CHROMIUM, timeout: 60_000 });
  page = await browser.newPage({ viewport: DESKTOP });
  page.on('request', (r) => seen.requests.push({ url: r.url(), authorization: r.headers().authorization }));
  page.on('requestfailed', (r) => seen.failed.push(`${r.url()}: ${r.failure()?.errorText}`));
  page.on('console', (m) => seen.console.push({ type: m.type(), text: m.text(), url: m.location().url }));
  page.on('pageerror', (e) => seen.pageErrors.push(String(e)));
  page.on('dialog', (d) => {
    seen.dialogs.push(d.message());
    void d.dismiss();
  });
}, 180_000);

afterAll(async () => {
  working = false;
  await workload?.catch(() => undefined);
  await browser?.close();
  await billing?.stop().catch(() => undefined);
  await Promise.all(relays.map((r) => r.stop().catch(() => undefined)));
  await Promise.all(clients.map((c) => c.end().catch(() => undefined)));
  await app?.close();
  await ordo?.close();
  await server?.stop();
});

const card = (kind: 'sequence' | 'subscription' | 'throttle', name: string) =>
  page.locator(`[data-${kind}="${name}"]`);
/** Text of the cells in a card's table row that holds `text` in its first cell. */
const rowOf = (scope: ReturnType<typeof card>, caption: string, first: string) =>
  scope
    .locator('table', { has: page.locator('caption', { hasText: caption }) })
    .locator('tbody tr')
    .filter({ has: page.locator('td:first-child', { hasText: first }) });

describe('the data behind the page', () => {
  it('the page is open and holds no data; its files come with a strict CSP; the data needs the read scope', async () => {
    const html = await fetch(`${origin}/`);
    expect(html.status).toBe(200);
    expect(html.headers.get('content-type')).toBe('text/html; charset=utf-8');
    const csp = html.headers.get('content-security-policy')!;
    expect(csp).toContain("default-src 'self'");
    expect(csp).toContain("script-src 'self'");
    expect(csp).toContain("form-action 'none'");
    expect(csp).not.toContain('unsafe');
    expect(html.headers.get('x-content-type-options')).toBe('nosniff');
    const text = await html.text();
    expect(text).not.toContain('invoice');
    expect(text).not.toMatch(/<script>|<style>| on\w+=/);
    for (const file of ['dashboard.js', 'dashboard.css', 'dashboard.svg']) {
      const r = await fetch(`${origin}/${file}`);
      expect(r.status, file).toBe(200);
      expect(r.headers.get('content-security-policy'), file).toBe(csp);
    }

    const data = (token?: string) =>
      fetch(`${origin}/v1/dashboard`, { headers: token ? { authorization: `Bearer ${token}` } : {} });
    expect((await data()).status).toBe(401);
    expect((await data(`${READER}x`)).status).toBe(401);
    expect(await (await data(ISSUER)).json()).toMatchObject({ code: 'forbidden' });
    const ok = await data(READER);
    expect(ok.status).toBe(200);
    expect(ok.headers.get('cache-control')).toBe('no-store');
    expect(((await ok.json()) as any).sequences.map((s: { name: string }) => s.name)).toEqual([
      'invoice',
      'orderId',
    ]);

    // The open import holds back its own order only: billing's consumer has every committed
    // one (lag 0) but not that one; shipping, with no consumer, is behind whatever is open;
    // nothing holds the mailer's topic.
    const subscription = async (name: string) =>
      ((await (await data(READER)).json()) as any).subscriptions.find(
        (s: { name: string }) => s.name === name,
      );
    await expect.poll(async () => (await subscription('billing')).messagesBehind, WAIT).toBe(0);
    const lagging = await subscription('billing');
    expect(lagging.blockedBy).toMatchObject({ pid: appender.pid, applicationName: 'order-import' });
    expect(billed).toEqual(expect.arrayContaining(['order-1040', 'order-1041', 'order-1042']));
    expect(billed).not.toContain(IMPORTED);
    const shipping = await subscription('shipping');
    expect(shipping.messagesBehind).toBeGreaterThanOrEqual(3);
    expect(shipping.blockedBy).toMatchObject({ pid: appender.pid });
    expect((await subscription('mailer')).blockedBy).toBeNull();
  });

  it("deadLetters(name, { order: 'newest' }): the latest parked first, as the dashboard lists them", async () => {
    const oldest = await ordo.outbox.deadLetters('mailer');
    expect(oldest.map((d) => [d.key, d.error, d.attempts])).toEqual([
      ['customer-1042', 'SMTP 421 4.7.0 try again later', 1],
      ['customer-2177', '550 5.1.1 mailbox unavailable', 1],
    ]);
    const newest = await ordo.outbox.deadLetters('mailer', { order: 'newest', limit: 1 });
    expect(newest.map((d) => d.key)).toEqual(['customer-2177']);
    await expect(ordo.outbox.deadLetters('mailer', { order: 'latest' as never })).rejects.toMatchObject({
      code: 'invalid_argument',
    });
  });
});

/** A card's state words, as written (the style upper-cases them on screen). */
const tagsOf = (name: string, kind: 'sequence' | 'subscription' | 'throttle') =>
  card(kind, name).locator('h3 .tag').allTextContents();

describe('the dashboard in Chromium', () => {
  it('without a token it shows no data and asks for one', async () => {
    await page.goto(`${origin}/`);
    await page.locator('#login').waitFor({ state: 'visible', ...WAIT });
    await expect
      .poll(() => page.locator('#notice').textContent())
      .toMatch(/needs a token with the read scope/);
    expect(await page.locator('#panels').isHidden()).toBe(true);
    expect(await page.locator('.card').count()).toBe(0);
    expect(await page.locator('#token').getAttribute('type')).toBe('password');
    // It did not even ask for the data.
    expect(seen.requests.filter((r) => r.url.includes('/v1/'))).toEqual([]);
  });

  it('a wrong token, or one without the read scope, is refused and the page says so', async () => {
    await page.locator('#token').fill(`${READER}-wrong`);
    await page.locator('#login button[type=submit]').click();
    await page.locator('#notice', { hasText: 'not accepted (401' }).waitFor(WAIT);
    await page.locator('#login').waitFor({ state: 'visible', ...WAIT });
    expect(await page.locator('.card').count()).toBe(0);
    expect(await page.evaluate(() => sessionStorage.length)).toBe(0);

    await page.locator('#token').fill(ISSUER);
    await page.locator('#login button[type=submit]').click();
    await page.locator('#notice', { hasText: 'lacks the read scope (403' }).waitFor(WAIT);
    expect(await page.locator('.card').count()).toBe(0);
    expect(await page.evaluate(() => sessionStorage.length)).toBe(0);
  });

  it('with the read token: sequences, the held counter, the subscription waiting for an open transaction, the running permits', async () => {
    await page.locator('#token').fill(READER);
    await page.locator('#login button[type=submit]').click();
    const invoice = card('sequence', 'invoice');
    await invoice.waitFor(WAIT);
    expect(await page.locator('#login').isHidden()).toBe(true);
    expect(await page.locator('#notice').isHidden()).toBe(true);

    // The token: in this tab's session storage, in the Authorization header, in no URL.
    expect(await page.evaluate(() => sessionStorage.getItem('ordo.dashboard.token'))).toBe(READER);
    expect(await page.evaluate(() => localStorage.length)).toBe(0);
    expect(await page.locator('#token').inputValue()).toBe('');
    expect(page.url()).toBe(`${origin}/`);
    const reads = seen.requests.filter((r) => r.url === `${origin}/v1/dashboard`);
    expect(reads.at(-1)!.authorization).toBe(`Bearer ${READER}`);
    for (const r of seen.requests) expect(r.url).not.toContain(READER);

    // Sequences: kind, definition, the current value per tenant, the open transaction holding one.
    const invoiceText = await invoice.innerText();
    expect(invoiceText).toContain('GAPLESS'); // a tag, upper-cased by the style
    expect(invoiceText).toContain('resets yearly in Europe/Paris');
    expect(invoiceText).toContain('format INV-{YYYY}-{n:6}');
    const year = String(new Date().getFullYear());
    const initech = rowOf(invoice, 'Current value per scope', 'initech').locator('td');
    expect(await initech.nth(1).innerText()).toBe(`${year}-01-01`);
    expect(await initech.nth(2).innerText()).toBe('7');
    const held = await rowOf(invoice, 'held by an open transaction', 'globex').innerText();
    expect(held).toContain(`pid ${holder.pid}`);
    expect(held).toContain('\u201cinvoice-batch\u201d');
    expect(held).toContain('idle in transaction');
    // (The workload's own calls hold acme's counter for an instant now and then.)
    await expect
      .poll(() => tagsOf('invoice', 'sequence'), WAIT)
      .toEqual(['gapless', 'held by 1 open transaction']);

    const orderId = card('sequence', 'orderId');
    const range = await rowOf(orderId, 'Ranges held by each node', ordo.nodeId.slice(0, 8))
      .first()
      .innerText();
    expect(range).toContain('(this server)');
    expect(range).toMatch(/\d+ of 100 \(\d+%\)/);

    // Outbox: billing has every committed order, so it waits for the open import alone, which
    // the card names. (The workload's orders make its lag 1 for a moment now and then.)
    const billingCard = card('subscription', 'billing');
    await expect
      .poll(() => tagsOf('billing', 'subscription'), WAIT)
      .toEqual(['waiting for an open transaction']);
    const blocker = await billingCard.locator('[data-blocker="holding"]').innerText();
    expect(blocker).toContain(`pid ${appender.pid}`);
    expect(blocker).toContain('\u201corder-import\u201d');
    expect(blocker).toMatch(/open for [\d.]+ (s|min)/);
    expect(blocker).toContain('Every committed message is delivered');
    // Shipping is behind for want of a consumer: the same open transaction is shown, neutrally.
    const shipping = card('subscription', 'shipping');
    expect(await tagsOf('shipping', 'subscription')).toEqual(['behind']);
    const beside = await shipping.locator('[data-blocker="open"]').innerText();
    expect(beside).toContain(`pid ${appender.pid}`);
    expect(beside).toMatch(/the [\d,]+ behind are committed and wait for the consumer, not for it/);
    // The mailer is caught up, on a topic nothing holds: no tag of waiting, no blocker.
    const mailer = card('subscription', 'mailer');
    expect(await tagsOf('mailer', 'subscription')).toEqual(['up to date', '2 dead']);
    expect(await mailer.locator('[data-blocker]').count()).toBe(0);
    await mailer.locator('summary').click();
    const letters = await mailer.locator('ol.letters li').allInnerTexts();
    expect(letters).toHaveLength(2);
    expect(letters[0]).toContain('key \u201ccustomer-2177\u201d');
    expect(letters[0]).toContain('Error: 550 5.1.1 mailbox unavailable');
    expect(letters[1]).toContain('Error: SMTP 421 4.7.0 try again later');

    // Relays: each says where it publishes; the one whose webhook is away is failing, and why.
    const toRedis = card('subscription', 'orders-to-redis');
    await expect.poll(() => tagsOf('orders-to-redis', 'subscription'), WAIT).toContain('relay to redis');
    expect(await toRedis.locator('p.def').first().innerText()).toMatch(
      /^topic orders · redis redis:\/\/127\.0\.0\.1:6379\/? stream ordo-dashboard-/,
    );
    await expect
      .poll(() => tagsOf('receipts-to-hooks', 'subscription'), WAIT)
      .toEqual(['behind', 'relay to webhook', 'failing']);
    const hooks = card('subscription', 'receipts-to-hooks');
    expect(await hooks.locator('p.def').first().innerText()).toContain(`webhook POST ${deadHook}`);
    await expect
      .poll(() => hooks.locator('dl.facts').innerText(), WAIT)
      .toMatch(/Broker\s+.*ECONNREFUSED.* ago/s);

    // Throttles: the running permits with their keys and holders; the refusal; how permits ended.
    const payments = card('throttle', 'payment_api');
    for (const worker of ['worker-1', 'worker-2']) {
      const running = await rowOf(payments, 'Running permits', 'acme')
        .filter({ hasText: worker })
        .innerText();
      expect(running).toMatch(/[45] min/);
    }
    expect(await rowOf(payments, 'Running permits', 'globex').innerText()).toContain('worker-3');
    expect((await tagsOf('payment_api', 'throttle'))[0]).toMatch(/^\d+ running$/);
    expect(await rowOf(payments, 'Refusals by reason', 'concurrency').innerText()).toMatch(
      /concurrency.*\s1\s/s,
    );
    const reports = card('throttle', 'reports');
    const weekly = await rowOf(reports, 'Recent outcomes', 'weekly').innerText();
    expect(weekly).toContain('failed');
    expect(weekly).toContain('the export server said 503');
    expect(await rowOf(reports, 'Recent outcomes', 'monthly').innerText()).toContain('completed');
  });

  it('values change live: numbers taken, rates appearing', async () => {
    const invoice = card('sequence', 'invoice');
    const umbrella = () =>
      rowOf(invoice, 'Current value per scope', 'umbrella').locator('td').nth(2).innerText();
    expect(await umbrella()).toBe('1');
    await ordo.sequences.nextMany('invoice', 2, { scope: 'umbrella' });
    await expect.poll(umbrella, WAIT).toBe('3');

    // The workload runs: a rate per second shows up beside the sequence's total.
    await expect
      .poll(() => invoice.locator('dl.facts dd strong').first().innerText(), WAIT)
      .toMatch(/^[\d.,]+\/s$/);
    await expect
      .poll(() => card('subscription', 'billing').locator('dl.facts dd strong').first().innerText(), WAIT)
      .toMatch(/^[\d.,]+\/s$/);
  });

  it('reads without colour: with forced colours, every state is a word on screen', async () => {
    await page.emulateMedia({ forcedColors: 'active' });
    try {
      expect(await page.evaluate(() => matchMedia('(forced-colors: active)').matches)).toBe(true);
      // The colours are the system's now, the same for every tone: only the words tell states apart.
      const colours = await page.evaluate(() => [
        ...new Set([...document.querySelectorAll('.tag')].map((t: any) => getComputedStyle(t).color)),
      ]);
      expect(colours).toHaveLength(1);
      const words = async (kind: 'sequence' | 'subscription' | 'throttle', name: string) =>
        (await card(kind, name).locator('h3 .tag').allInnerTexts()).join(' | ').toLowerCase();
      expect(await words('sequence', 'invoice')).toMatch(/held by \d+ open transactions?/);
      await expect
        .poll(() => words('subscription', 'billing'), WAIT)
        .toContain('waiting for an open transaction');
      expect(await words('subscription', 'shipping')).toContain('behind');
      expect(await words('subscription', 'mailer')).toContain('up to date');
      expect(await words('throttle', 'payment_api')).toMatch(/\d+ running/);
      expect(await words('throttle', 'reports')).toMatch(/refusing|idle/);
      const reports = card('throttle', 'reports');
      expect(await rowOf(reports, 'Recent outcomes', 'weekly').locator('td').nth(1).innerText()).toBe(
        'failed',
      );
      expect(await rowOf(reports, 'Recent outcomes', 'monthly').locator('td').nth(1).innerText()).toBe(
        'completed',
      );
      // The border of the open transaction's box stays, in the system's colour.
      const border = await card('subscription', 'billing')
        .locator('[data-blocker]')
        .evaluate((e: any) => getComputedStyle(e).borderLeftStyle);
      expect(border).toBe('solid');
      await page.screenshot({ path: `${SCRATCH}forced-colours.png`, fullPage: true });
    } finally {
      await page.emulateMedia({ forcedColors: 'none' });
    }
  });

  it(`screenshots: the desktop page to ${UPDATE_SCREENSHOT ? 'docs/dashboard.png' : '.scratch/dashboard/'}, the phone's to .scratch/dashboard/`, async () => {
    // A few points on the sparklines first (one per 3 s of the workload; six for the README's
    // picture, three otherwise, to spend 9 s less). Then a moment when
    // the page shows the steady state, not the workload's instants (a counter or a permit of
    // its own, billing 1 behind until its consumer takes the latest order).
    await page.waitForFunction(
      (points) =>
        (document.querySelector('[data-sequence="invoice"] svg.spark path')?.getAttribute('d') ?? '').split(
          'L',
        ).length >= points,
      UPDATE_SCREENSHOT ? 6 : 3,
      WAIT,
    );
    const steady = () =>
      page.waitForFunction(
        () => {
          const tags = (selector: string) =>
            [...document.querySelectorAll(`${selector} h3 .tag`)].map((t: any) => t.textContent).join('|');
          return (
            tags('[data-sequence="invoice"]') === 'gapless|held by 1 open transaction' &&
            tags('[data-subscription="billing"]') === 'waiting for an open transaction' &&
            tags('[data-throttle="payment_api"]') === '3 running'
          );
        },
        undefined,
        { ...WAIT, polling: 50 },
      );
    await steady();
    await screenshot(SCREENSHOT, DESKTOP.width);
    await page.setViewportSize(PHONE);
    try {
      await steady();
      await screenshot(`${SCRATCH}phone.png`, PHONE.width);
    } finally {
      await page.setViewportSize(DESKTOP);
    }
  });

  it('hostile names are text: a tenant, a dead letter and a permit key made of markup', async () => {
    await ordo.sequences.next('invoice', { scope: XSS });
    await ordo.outbox.createSubscription({ name: 'hostile', topic: 'hostile' });
    await ordo.outbox.append('hostile', { type: 'Imported', data: { name: XSS }, key: XSS });
    const received = await ordo.outbox.receive('hostile', { max: 1 });
    await ordo.outbox.nack('hostile', received.receipt!, { error: XSS, maxAttempts: 1 });
    const hostile = await ordo.throttles.acquire('payment_api', { key: XSS, holder: XSS });
    if (!hostile.granted) throw new Error('the hostile key must be granted a permit');
    try {
      await rowOf(card('sequence', 'invoice'), 'Current value per scope', XSS).waitFor(WAIT);
      await rowOf(card('throttle', 'payment_api'), 'Running permits', XSS).waitFor(WAIT);
      const letters = card('subscription', 'hostile');
      await letters.locator('summary').click();
      const letter = await letters.locator('ol.letters li').innerText();
      expect(letter).toContain(`key \u201c${XSS}\u201d`);
      expect(letter).toContain(`Error: ${XSS}`);
      expect(letter).toContain(JSON.stringify({ name: XSS }));
      // Nothing of theirs became an element, nothing ran.
      expect(await page.locator(`td:text-is("${XSS}")`).count()).toBeGreaterThanOrEqual(3);
      expect(await page.evaluate(() => document.querySelectorAll('img, [onerror]').length)).toBe(0);
      expect(seen.dialogs).toEqual([]);
    } finally {
      await hostile.complete();
      await ordo.outbox.removeSubscription('hostile');
    }
    await card('subscription', 'hostile').waitFor({ state: 'detached', ...WAIT });
  });

  it('fits a 375-pixel phone screen without sideways scrolling, long names included', async () => {
    // The longest names each kind allows, none with a space to wrap at.
    const longSubscription = `reporting.${'x'.repeat(190)}`;
    await ordo.outbox.createSubscription({ name: longSubscription, topic: 'orders' });
    await ordo.sequences.next('invoice', { scope: 's'.repeat(200) });
    const long = await ordo.throttles.acquire('payment_api', {
      key: 'k'.repeat(200),
      holder: 'h'.repeat(200),
    });
    expect(long.granted).toBe(true);
    await page.setViewportSize(PHONE);
    try {
      await card('subscription', longSubscription).waitFor(WAIT);
      await rowOf(card('throttle', 'payment_api'), 'Running permits', 'k'.repeat(200)).waitFor(WAIT);
      const widths = await page.evaluate(() => ({
        viewport: document.documentElement.clientWidth,
        page: document.documentElement.scrollWidth,
        body: document.body.scrollWidth,
        widest: Math.max(
          ...[...document.querySelectorAll('body *')].map((e: any) => e.getBoundingClientRect().right),
        ),
      }));
      expect(widths.viewport).toBe(PHONE.width);
      expect(widths.page).toBeLessThanOrEqual(PHONE.width);
      expect(widths.body).toBeLessThanOrEqual(PHONE.width);
      expect(widths.widest).toBeLessThanOrEqual(PHONE.width);
    } finally {
      await page.setViewportSize(DESKTOP);
      if (long.granted) await long.complete();
      await ordo.outbox.removeSubscription(longSubscription);
    }
  });

  it('ends are followed live: a permit completed, the open transactions committed, the held order delivered', async () => {
    await permit.complete();
    await rowOf(card('throttle', 'payment_api'), 'Running permits', 'acme')
      .filter({ hasText: 'worker-1' })
      .waitFor({ state: 'detached', ...WAIT });
    expect(billed).not.toContain(IMPORTED);
    await appender.client.query('COMMIT');
    await card('subscription', 'billing')
      .locator('[data-blocker]')
      .waitFor({ state: 'detached', ...WAIT });
    await expect.poll(() => billed.includes(IMPORTED), WAIT).toBe(true);
    expect(await card('subscription', 'shipping').locator('[data-blocker]').count()).toBe(0);
    await holder.client.query('COMMIT');
    await card('sequence', 'invoice').getByText('No counter is held by an open transaction.').waitFor(WAIT);
  });

  it('asked nothing of any other origin, and logged no error but the refused tokens', async () => {
    for (const r of seen.requests) expect(r.url.startsWith(`${origin}/`), r.url).toBe(true);
    expect(seen.failed).toEqual([]);
    expect(seen.pageErrors).toEqual([]);
    expect(seen.dialogs).toEqual([]);
    // Allowed: Chromium's own line for each refused token (a 401, then a 403) on the data's URL.
    // Any other error fails; Chromium's notices of other kinds (warnings, info) are its own.
    const expected = (m: (typeof seen.console)[number]) =>
      m.url === `${origin}/v1/dashboard` &&
      /^Failed to load resource: the server responded with a status of (401|403) /.test(m.text);
    expect(seen.console.filter((m) => m.type === 'error' && !expected(m))).toEqual([]);
  });
});
