import type { FastifyInstance, FastifyReply } from 'fastify';
import { type Ordo, REFUSAL_REASONS } from '../index.js';
import { DASHBOARD_CSS, DASHBOARD_ICON, dashboardHtml } from './dashboard-page.js';
import { DASHBOARD_SCRIPT } from './dashboard-script.js';
import { dashboardReader, HISTORY_POINTS } from './dashboard-snapshot.js';
import { ERROR, RELAY_FIELDS } from './schemas.js';

/**
 * The page may load only its own script, style and icon from this server and talk only to it:
 * no inline script or style (data cannot become code), no other origin, no framing, and no
 * form may submit anywhere (a token typed in must never end up in a URL, even without script).
 */
export const DASHBOARD_CSP = [
  "default-src 'self'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self'",
  "connect-src 'self'",
  "object-src 'none'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join('; ');

const INT = { type: 'integer' } as const;
const NULLABLE_INT = { type: ['integer', 'null'] } as const;
const TEXT = { type: 'string' } as const;
const NULLABLE_TEXT = { type: ['string', 'null'] } as const;
const DATE = { type: 'string', format: 'date-time' } as const;
const NULLABLE_DATE = { type: ['string', 'null'], format: 'date-time' } as const;
const RATE = { type: ['number', 'null'], description: 'per second lately; null until two readings' } as const;
const HISTORY = {
  type: 'array',
  items: { type: ['number', 'null'] },
  description: `${HISTORY_POINTS} rates per second, evenly spaced over windowMs up to now; null where unknown`,
} as const;
const obj = (properties: Record<string, unknown>) =>
  ({ type: 'object', properties, required: Object.keys(properties) }) as const;

const SEQUENCE = obj({
  name: TEXT,
  kind: { type: 'string', enum: ['gapless', 'batched'] },
  start: INT,
  batch: NULLABLE_INT,
  timeoutMs: NULLABLE_INT,
  increment: INT,
  minValue: INT,
  maxValue: INT,
  cycle: { type: 'boolean' },
  reset: TEXT,
  timeZone: TEXT,
  yearStart: INT,
  format: NULLABLE_TEXT,
  taken: {
    ...NULLABLE_INT,
    description: 'gapless: values issued in every scope and period; batched: reserved',
  },
  perSecond: RATE,
  history: HISTORY,
  counters: {
    type: 'array',
    description: 'gapless: the current value per scope and period, the busiest first',
    items: obj({ scope: TEXT, period: NULLABLE_TEXT, value: INT, updatedAt: DATE, perSecond: RATE }),
  },
  moreCounters: INT,
  ranges: {
    type: 'array',
    description: "batched: each node's ranges; used is known for this server's own only",
    items: obj({
      nodeId: TEXT,
      thisNode: { type: 'boolean' },
      first: INT,
      last: INT,
      size: INT,
      used: NULLABLE_INT,
      reservedAt: DATE,
    }),
  },
  holders: {
    type: 'array',
    description: 'counters locked by an open transaction, and by which',
    items: obj({
      scope: TEXT,
      period: NULLABLE_TEXT,
      pid: NULLABLE_INT,
      preparedGid: NULLABLE_TEXT,
      openForMs: { type: ['number', 'null'] },
      state: NULLABLE_TEXT,
      applicationName: NULLABLE_TEXT,
      waiting: INT,
    }),
  },
});

/** What a subscription and each of its partitions have in common. */
const PROGRESS = {
  owner: NULLABLE_TEXT,
  leaseUntil: NULLABLE_DATE,
  messagesBehind: INT,
  oldestAgeMs: NULLABLE_INT,
  attempts: INT,
  lastError: NULLABLE_TEXT,
  delivered: INT,
  redelivered: INT,
  checkpointedAt: NULLABLE_DATE,
  deliveredPerSecond: RATE,
};
const SUBSCRIPTION = obj({
  name: TEXT,
  topic: TEXT,
  ...PROGRESS,
  waiting: { ...INT, description: 'open transactions that appended to the topic' },
  blockedBy: {
    type: ['object', 'null'],
    description: 'the oldest of them: its messages wait for it',
    properties: {
      pid: NULLABLE_INT,
      preparedGid: NULLABLE_TEXT,
      xidAge: INT,
      openForMs: NULLABLE_INT,
      state: NULLABLE_TEXT,
      applicationName: NULLABLE_TEXT,
    },
  },
  deadLettered: INT,
  relay: {
    ...obj(RELAY_FIELDS),
    type: ['object', 'null'],
    description: 'the relay this subscription is, if it is one',
  },
  history: HISTORY,
  partitions: { type: 'array', items: obj({ partition: INT, position: INT, ...PROGRESS }) },
  deadLetters: {
    type: 'array',
    description: 'the latest parked, newest first',
    items: obj({
      position: INT,
      type: TEXT,
      key: NULLABLE_TEXT,
      messageId: NULLABLE_TEXT,
      createdAt: DATE,
      attempts: INT,
      error: NULLABLE_TEXT,
      parkedAt: DATE,
      data: { type: 'string', description: 'the message data as JSON, cut to 300 characters' },
    }),
  },
});

const BY_REASON = (value: object) => obj(Object.fromEntries(REFUSAL_REASONS.map((r) => [r, value])));
const THROTTLE = obj({
  name: TEXT,
  everyMs: NULLABLE_INT,
  limit: NULLABLE_INT,
  perMs: NULLABLE_INT,
  concurrency: NULLABLE_INT,
  permits: { type: 'boolean' },
  leaseMs: NULLABLE_INT,
  refundOnFailure: { type: 'boolean' },
  pausedUntil: NULLABLE_DATE,
  running: {
    type: 'array',
    items: obj({
      id: TEXT,
      key: TEXT,
      holder: TEXT,
      acquiredAt: DATE,
      expiresAt: DATE,
      ageMs: INT,
      leaseLeftMs: INT,
    }),
  },
  runningCount: INT,
  counts: {
    ...obj({ granted: INT, completed: INT, failed: INT, refunded: INT, refused: BY_REASON(INT) }),
    description: 'what this server granted, refused and ended since it started',
  },
  perSecond: obj({ granted: RATE, completed: RATE, failed: RATE, refunded: RATE, refused: BY_REASON(RATE) }),
  refusedHistory: HISTORY,
  recent: {
    type: 'array',
    description: 'the keys most recently active, and how their last permit ended',
    items: obj({
      key: TEXT,
      starts: INT,
      lastStartAt: NULLABLE_DATE,
      lastEndAt: NULLABLE_DATE,
      lastOutcome: { type: ['string', 'null'], enum: ['completed', 'failed', 'expired', null] },
      lastError: NULLABLE_TEXT,
      pausedUntil: NULLABLE_DATE,
      waiting: INT,
    }),
  },
});

const SNAPSHOT = obj({
  at: DATE,
  nodeId: TEXT,
  windowMs: INT,
  sequences: { type: 'array', items: SEQUENCE },
  subscriptions: { type: 'array', items: SUBSCRIPTION },
  throttles: { type: 'array', items: THROTTLE },
});

/** The page's own files: the same bytes for every caller, none of them data. */
function sendFile(reply: FastifyReply, type: string, body: string): FastifyReply {
  return reply
    .type(type)
    .header('content-security-policy', DASHBOARD_CSP)
    .header('x-content-type-options', 'nosniff')
    .header('referrer-policy', 'no-referrer')
    .header('cache-control', 'no-cache')
    .send(body);
}

/**
 * The live dashboard: a page at `/` (open: it holds no data) and the snapshot it polls,
 * `GET /v1/dashboard`, which needs the read scope like every other read.
 */
export function dashboardRoutes(app: FastifyInstance, ordo: Ordo, options: { tokens: boolean }): void {
  const errors = { 401: ERROR, 403: ERROR, 503: ERROR };
  const html = dashboardHtml({ tokens: options.tokens });
  const hidden = { schema: { hide: true } };

  app.get('/', hidden, async (_request, reply) => sendFile(reply, 'text/html; charset=utf-8', html));
  app.get('/dashboard.js', hidden, async (_request, reply) =>
    sendFile(reply, 'text/javascript; charset=utf-8', DASHBOARD_SCRIPT),
  );
  app.get('/dashboard.css', hidden, async (_request, reply) =>
    sendFile(reply, 'text/css; charset=utf-8', DASHBOARD_CSS),
  );
  app.get('/dashboard.svg', hidden, async (_request, reply) =>
    sendFile(reply, 'image/svg+xml', DASHBOARD_ICON),
  );

  const read = dashboardReader(ordo);
  app.get(
    '/v1/dashboard',
    {
      config: { scope: 'read' },
      schema: {
        summary:
          'What the dashboard shows: sequences (rates, counters, ranges, holders), subscriptions (lag, blocker, dead letters), throttles (running permits, outcomes, refusals), read at most once a second',
        response: { ...errors, 200: SNAPSHOT },
      },
    },
    async (_request, reply) => {
      reply.header('cache-control', 'no-store');
      return read();
    },
  );
}
