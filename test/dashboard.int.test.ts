// The live dashboard of `ordo serve`, in a real Chromium (Debian's `chromium`, driven by
// playwright-core through executablePath: no browser is ever downloaded). The page refuses to
// show anything without a read token, says when a token is wrong, then shows a sequence with a
// counter held by an open transaction, a subscription held back by another (naming it), a
// throttle with a running permit, follows values live, fits a phone, renders hostile names as
// text, asks nothing of any other origin, logs no error, and leaves docs/dashboard.png.
import { mkdirSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import type { FastifyInstance } from 'fastify';
import pg from 'pg';
import { type Browser, chromium, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrdo, type Ordo, type Permit, type Subscription } from '../src/index.js';
import { buildServer, parseTokens } from '../src/server/app.js';
import { type OwnPostgres, ownPostgres } from './support/own-postgres.js';

// The browser's globals, read only inside page.evaluate() (this project compiles for Node).
declare const document: any;
declare const sessionStorage: any;
declare const localStorage: any;

/** Debian's package; another path for a machine that has Chromium elsewhere. */
const CHROMIUM = process.env.ORDO_TEST_CHROMIUM ?? '/usr/bin/chromium';
const SCREENSHOT = fileURLToPath(new URL('../docs/dashboard.png', import.meta.url));
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
let audit: Subscription;
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
  // A PostgreSQL of its own: the outbox's view of open transactions is cluster-wide.
  server = await ownPostgres();
  ordo = await createOrdo({ databaseUrl: server.url });
  app = await buildServer(ordo, {
    tokens: parseTokens(`${READER}:read,${ISSUER}:next,${ADMIN}:admin+next+read`),
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  origin = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;

  // Sequences: a gapless one with scopes (one of them hostile) and one held by an open
  // transaction; a batched one whose ranges this node holds.
  await ordo.sequences.define({
    name: 'invoice',
    reset: 'year',
    timeZone: 'Europe/Paris',
    format: 'INV-{YYYY}-{n:6}',
  });
  await ordo.sequences.define({ name: 'orderId', kind: 'batched', batch: 100, start: 1000 });
  await ordo.sequences.nextMany('invoice', 3, { scope: 'acme' });
  await ordo.sequences.next('invoice', { scope: XSS });
  await ordo.sequences.next('invoice', { scope: 'live' });
  await ordo.sequences.next('invoice', { scope: 'globex' });
  await ordo.sequences.nextMany('orderId', 5);
  holder = await openTransaction('invoice-batch');
  await ordo.sequences.next('invoice', { scope: 'globex', tx: holder.client });

  // Outbox: dead letters on one subscription (a hostile key and error), another held back by
  // a transaction that appended and stays open, a third consumed all along.
  await ordo.outbox.createSubscription({ name: 'mailer', topic: 'emails' });
  for (const [n, key, error] of [
    [1, 'first', 'smtp timeout'],
    [2, XSS, XSS],
  ] as const) {
    await ordo.outbox.append('emails', { type: 'EmailQueued', data: { n }, key });
    const received = await ordo.outbox.receive('mailer', { max: 1 });
    expect(received.messages.map((m) => m.data)).toEqual([{ n }]);
    expect(await ordo.outbox.nack('mailer', received.receipt!, { error, maxAttempts: 1 })).toEqual({
      outcome: 'parked',
      attempts: 1,
    });
  }
  await ordo.outbox.createSubscription({ name: 'billing', topic: 'orders' });
  audit = await ordo.outbox.subscribe({ name: 'audit', topic: 'orders', handler: async () => undefined });
  await ordo.outbox.append('orders', { type: 'OrderPlaced', data: { id: 1 } });
  appender = await openTransaction('order-import');
  await ordo.outbox.append('orders', { type: 'OrderPlaced', data: { id: 2 } }, { tx: appender.client });

  // Throttles: a running permit (hostile key), a refusal, and ends of both kinds.
  await ordo.throttles.define({ name: 'exports', concurrency: 1, lease: '10m' });
  await ordo.throttles.define({ name: 'reports', every: '1h', refundOnFailure: false });
  const granted = await ordo.throttles.acquire('exports', { key: XSS, holder: 'worker-7' });
  if (!granted.granted) throw new Error('the first permit must be granted');
  permit = granted;
  expect((await ordo.throttles.acquire('exports', { key: XSS, holder: 'worker-8' })).granted).toBe(false);
  const done = await ordo.throttles.acquire('reports', { key: 'monthly' });
  const failing = await ordo.throttles.acquire('reports', { key: 'weekly' });
  if (!done.granted || !failing.granted) throw new Error('both reports must be granted');
  await done.complete();
  await failing.fail(new Error('the export server said 503'));

  workload = (async () => {
    for (let i = 0; working; i++) {
      await ordo.sequences.next('invoice', { scope: 'acme' });
      await ordo.nextval('orderId');
      await ordo.outbox.append('orders', { type: 'OrderPaid', data: { i } });
      await ordo.throttles.acquire('reports', { key: 'monthly' }); // refused: every 1h
      // Pacing of the background workload, not a wait for anything.
      await new Promise((r) => setTimeout(r, 150));
    }
  })();

  browser = await chromium.launch({ executablePath: CHROMIUM, timeout: 60_000 });
  page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
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
  await audit?.stop().catch(() => undefined);
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
    const snapshot = (await ok.json()) as any;
    expect(snapshot.sequences.map((s: { name: string }) => s.name)).toEqual(['invoice', 'orderId']);
    const billing = snapshot.subscriptions.find((s: { name: string }) => s.name === 'billing');
    expect(billing.blockedBy).toMatchObject({ pid: appender.pid, applicationName: 'order-import' });
  });

  it("deadLetters(name, { order: 'newest' }): the latest parked first, as the dashboard lists them", async () => {
    const oldest = await ordo.outbox.deadLetters('mailer');
    expect(oldest.map((d) => [d.key, d.error, d.attempts])).toEqual([
      ['first', 'smtp timeout', 1],
      [XSS, XSS, 1],
    ]);
    const newest = await ordo.outbox.deadLetters('mailer', { order: 'newest', limit: 1 });
    expect(newest.map((d) => d.key)).toEqual([XSS]);
    await expect(ordo.outbox.deadLetters('mailer', { order: 'latest' as never })).rejects.toMatchObject({
      code: 'invalid_argument',
    });
  });
});

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

  it('with the read token: sequences, the held counter, the blocked subscription, the running permit', async () => {
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

    // Sequences: kind, definition, the current value per scope, the open transaction holding one.
    const invoiceText = await invoice.innerText();
    expect(invoiceText).toContain('GAPLESS'); // a tag, upper-cased by the style
    expect(invoiceText).toContain('resets yearly in Europe/Paris');
    expect(invoiceText).toContain('format INV-{YYYY}-{n:6}');
    const year = String(new Date().getFullYear());
    expect(await rowOf(invoice, 'Current value per scope', XSS).innerText()).toContain(`${year}-01-01`);
    const held = await rowOf(invoice, 'held by an open transaction', 'globex').innerText();
    expect(held).toContain(`pid ${holder.pid}`);
    expect(held).toContain('\u201cinvoice-batch\u201d');
    expect(held).toContain('idle in transaction');
    expect(invoiceText).toMatch(/held by 1 open transaction/i);

    const orderId = card('sequence', 'orderId');
    const range = await rowOf(orderId, 'Ranges held by each node', ordo.nodeId.slice(0, 8))
      .first()
      .innerText();
    expect(range).toContain('(this server)');
    expect(range).toMatch(/\d+ of 100 \(\d+%\)/);

    // Outbox: the subscription held back names the open transaction; dead letters are readable.
    const billing = card('subscription', 'billing');
    await billing.locator('[data-blocker]').waitFor(WAIT);
    const blocker = await billing.locator('[data-blocker]').innerText();
    expect(blocker).toContain(`pid ${appender.pid}`);
    expect(blocker).toContain('\u201corder-import\u201d');
    expect(blocker).toMatch(/open for [\d.]+ (s|min)/);
    expect(await billing.innerText()).toMatch(/waiting for an open transaction/i);
    const mailer = card('subscription', 'mailer');
    await mailer.locator('summary').click();
    const letters = await mailer.locator('ol.letters li').allInnerTexts();
    expect(letters).toHaveLength(2);
    expect(letters[0]).toContain(`key \u201c${XSS}\u201d`);
    expect(letters[0]).toContain(`Error: ${XSS}`);
    expect(letters[1]).toContain('Error: smtp timeout');

    // Throttles: the running permit with its key and holder; the refusal; how permits ended.
    const exports = card('throttle', 'exports');
    const running = await rowOf(exports, 'Running permits', XSS).innerText();
    expect(running).toContain('worker-7');
    expect(running).toMatch(/10 min|9 min/);
    expect(await exports.innerText()).toMatch(/1 running/i);
    expect(await rowOf(exports, 'Refusals by reason', 'concurrency').innerText()).toMatch(
      /concurrency.*\s1\s/s,
    );
    const reports = card('throttle', 'reports');
    expect(await rowOf(reports, 'Recent outcomes', 'weekly').innerText()).toContain(
      'the export server said 503',
    );
    expect(await rowOf(reports, 'Recent outcomes', 'monthly').innerText()).toContain('completed');

    // Hostile names are text: nothing of theirs became an element, nothing ran.
    expect(await page.locator(`td:text-is("${XSS}")`).count()).toBeGreaterThanOrEqual(2);
    expect(await page.evaluate(() => document.querySelectorAll('img, [onerror]').length)).toBe(0);
    expect(seen.dialogs).toEqual([]);
  });

  it('values change live: numbers taken, rates appearing', async () => {
    const invoice = card('sequence', 'invoice');
    const live = () => rowOf(invoice, 'Current value per scope', 'live').locator('td').nth(2).innerText();
    expect(await live()).toBe('1');
    await ordo.sequences.nextMany('invoice', 2, { scope: 'live' });
    await expect.poll(live, WAIT).toBe('3');

    // The workload runs: a rate per second shows up beside the sequence's total.
    await expect
      .poll(() => invoice.locator('dl.facts dd strong').first().innerText(), WAIT)
      .toMatch(/^[\d.,]+\/s$/);
    await expect
      .poll(() => card('subscription', 'audit').locator('dl.facts dd strong').first().innerText(), WAIT)
      .toMatch(/^[\d.,]+\/s$/);
  });

  it('writes docs/dashboard.png (desktop width, whole page)', async () => {
    // A few points on the sparklines first (one per 3 s of the workload).
    await page.waitForFunction(
      () =>
        (document.querySelector('[data-sequence="invoice"] svg.spark path')?.getAttribute('d') ?? '').split(
          'L',
        ).length > 5,
      undefined,
      WAIT,
    );
    mkdirSync(fileURLToPath(new URL('../docs/', import.meta.url)), { recursive: true });
    await page.screenshot({ path: SCREENSHOT, fullPage: true });
  });

  it('fits a 375-pixel phone screen without sideways scrolling, long names included', async () => {
    // The longest names each kind allows, none with a space to wrap at.
    const longSubscription = `reporting.${'x'.repeat(190)}`;
    await ordo.outbox.createSubscription({ name: longSubscription, topic: 'orders' });
    await ordo.sequences.next('invoice', { scope: 's'.repeat(200) });
    const long = await ordo.throttles.acquire('exports', { key: 'k'.repeat(200), holder: 'h'.repeat(200) });
    expect(long.granted).toBe(true);
    await page.setViewportSize({ width: 375, height: 800 });
    await card('subscription', longSubscription).waitFor(WAIT);
    await rowOf(card('throttle', 'exports'), 'Running permits', 'k'.repeat(200)).waitFor(WAIT);
    const widths = await page.evaluate(() => ({
      viewport: document.documentElement.clientWidth,
      page: document.documentElement.scrollWidth,
      body: document.body.scrollWidth,
      widest: Math.max(
        ...[...document.querySelectorAll('body *')].map((e: any) => e.getBoundingClientRect().right),
      ),
    }));
    expect(widths.viewport).toBe(375);
    expect(widths.page).toBeLessThanOrEqual(375);
    expect(widths.body).toBeLessThanOrEqual(375);
    expect(widths.widest).toBeLessThanOrEqual(375);
    await page.setViewportSize({ width: 1280, height: 900 });
    if (long.granted) await long.complete();
  });

  it('ends are followed live: a permit completed, the blocking transactions committed', async () => {
    await permit.complete();
    await rowOf(card('throttle', 'exports'), 'Running permits', XSS).waitFor({ state: 'detached', ...WAIT });
    await appender.client.query('COMMIT');
    await card('subscription', 'billing')
      .locator('[data-blocker]')
      .waitFor({ state: 'detached', ...WAIT });
    await holder.client.query('COMMIT');
    await card('sequence', 'invoice').getByText('No counter is held by an open transaction.').waitFor(WAIT);
  });

  it('asked nothing of any other origin, and logged no error', async () => {
    for (const r of seen.requests) expect(r.url.startsWith(`${origin}/`), r.url).toBe(true);
    expect(seen.failed).toEqual([]);
    expect(seen.pageErrors).toEqual([]);
    expect(seen.dialogs).toEqual([]);
    // The only errors: Chromium's own line for each refused token (a 401, then a 403).
    const errors = seen.console.filter((m) => m.type === 'error' || m.type === 'warning');
    expect(errors).toEqual([
      {
        type: 'error',
        text: expect.stringMatching(/status of 401/),
        url: `${origin}/v1/dashboard`,
      },
      {
        type: 'error',
        text: expect.stringMatching(/status of 403/),
        url: `${origin}/v1/dashboard`,
      },
    ]);
  });
});
