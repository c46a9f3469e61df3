import { readFileSync } from 'node:fs';
import { STATUS_CODES } from 'node:http';
import swagger from '@fastify/swagger';
import Fastify, {
  type FastifyBaseLogger,
  type FastifyError,
  type FastifyInstance,
  type FastifyReply,
  type FastifyServerOptions,
  LogController,
} from 'fastify';
import { ERROR_CODES, type Ordo, OrdoError, type OrdoErrorCode, toOrdoError } from '../index.js';
import { authenticate, type Scope, type Token } from './auth.js';
import { answerScrapes, workerScrape } from './cluster.js';
import { dashboardRoutes } from './dashboard-routes.js';
import { createMetrics } from './metrics.js';
import { outboxRoutes } from './outbox-routes.js';
import { ERROR } from './schemas.js';
import { sequenceRoutes } from './sequence-routes.js';
import { throttleRoutes } from './throttle-routes.js';
import { validationMessage } from './validation-message.js';

// The CLI reaches the server through this module alone.
export { parseTokens, readTokensFile, type Token } from './auth.js';

export interface ServerOptions {
  /** Bearer tokens; when empty or absent every route is open. */
  tokens?: readonly Token[];
  /** pino options, or false for no logs. */
  logger?: FastifyServerOptions['logger'];
  /** Largest request body, in bytes (default 64 KiB). */
  bodyLimit?: number;
  /** Most open client connections; more are closed at once (default: what the open-files limit leaves). */
  maxConnections?: number;
  /** A request must arrive whole within this (default 10 s); its headers within 5 s. */
  requestTimeoutMs?: number;
  /**
   * This server is one of the workers of `ordo serve --workers` (node:cluster): /metrics answers
   * for every worker, asked of the primary (see answerWorkerScrapes).
   */
  worker?: boolean;
}

/**
 * In the primary of `ordo serve --workers`: answers the workers' scrapes with their samples
 * summed, and the metrics read from the database, read here once for all of them.
 */
export function answerWorkerScrapes(ordo: Ordo): void {
  answerScrapes(createMetrics(ordo, 'database').registry);
}

/** The logger of a process that serves through its workers: pino with the servers' own settings. */
export function serverLogger(options: { level: string }): FastifyBaseLogger {
  return Fastify({ logger: options }).log;
}

/**
 * Connections the server accepts at most: the process's open-files limit less what the
 * database pool, the LISTEN connection and files need, so that hostile sockets can never
 * starve PostgreSQL connections of file descriptors (EMFILE).
 */
export function defaultMaxConnections(): number {
  const reserve = 256;
  let limit = 1024;
  try {
    const line = readFileSync('/proc/self/limits', 'utf8')
      .split('\n')
      .find((l) => l.startsWith('Max open files'));
    const soft = Number(line?.split(/\s{2,}/)[1]);
    if (Number.isInteger(soft) && soft > 0) limit = soft;
  } catch {
    // Not Linux: assume the common default.
  }
  return Math.max(16, Math.min(10_000, limit - reserve));
}

declare module 'fastify' {
  interface FastifyContextConfig {
    /** The token scope a route needs; routes without one are open (health). */
    scope?: Scope;
  }
}

/** Retry-After of a 503, in seconds: PostgreSQL restarts in about that. */
const RETRY_AFTER_S = 1;

/** What Node's HTTP parser refuses, by its error code. */
const CLIENT_ERRORS: Record<string, { code: OrdoErrorCode; message: string }> = {
  HPE_HEADER_OVERFLOW: {
    code: 'headers_too_large',
    message: 'the request headers are too large (16 KiB at most)',
  },
  ERR_HTTP_REQUEST_TIMEOUT: {
    code: 'request_timeout',
    message: 'the request did not arrive in time: send it whole within the request timeout',
  },
  default: { code: 'invalid_argument', message: 'the request is not valid HTTP' },
};

/** Fastify's own client errors, as ordo codes. Anything else unexpected is a 500. */
const FASTIFY_CODES: Record<string, OrdoErrorCode> = {
  FST_ERR_CTP_BODY_TOO_LARGE: 'payload_too_large',
  FST_ERR_CTP_INVALID_MEDIA_TYPE: 'unsupported_media_type',
  FST_ERR_CTP_INVALID_CONTENT_LENGTH: 'invalid_argument',
  FST_ERR_CTP_EMPTY_JSON_BODY: 'invalid_argument',
  FST_ERR_CTP_INVALID_JSON_BODY: 'invalid_argument',
  FST_ERR_VALIDATION: 'invalid_argument',
};

/** The HTTP surface of one Ordo client. Routes call the client; they never issue SQL. */
export async function buildServer(ordo: Ordo, options: ServerOptions = {}): Promise<FastifyInstance> {
  const tokens = options.tokens ?? [];
  const metrics = createMetrics(ordo, options.worker ? 'process' : 'both');
  const scrape = options.worker ? workerScrape(metrics.registry) : () => metrics.registry.metrics();
  const app = Fastify({
    logger: options.logger ?? false,
    // One line per request, written by the onResponse hook below, instead of Fastify's two.
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: options.bodyLimit ?? 64 * 1024,
    // Slow and idle clients are closed: a whole request within requestTimeout (headers within
    // half of it), an idle kept-alive connection after 5 s, a silent socket after 30 s.
    requestTimeout: options.requestTimeoutMs ?? 10_000,
    http: {
      headersTimeout: Math.ceil((options.requestTimeoutMs ?? 10_000) / 2),
      // How often Node looks for requests past those times (its default, 30 s, lets them linger).
      connectionsCheckingInterval: 500,
    },
    keepAliveTimeout: 5_000,
    connectionTimeout: 30_000,
    // Refuse what does not match a schema instead of coercing or dropping it.
    // verbose: errors carry the value and its schema, for messages that name what is allowed.
    // allowUnionTypes: a property that takes several types says so with one `type` list (a
    // timeout is milliseconds or a duration text), so that a refusal names every type allowed;
    // without it Ajv's strict mode warns at every start.
    ajv: {
      customOptions: {
        coerceTypes: false,
        removeAdditional: false,
        allErrors: false,
        verbose: true,
        allowUnionTypes: true,
      },
    },
    schemaErrorFormatter: (errors, dataVar) => new Error(validationMessage(errors, dataVar)),
    // Refusals while closing are ordo's { code: 'closed' } (see onRequest), not Fastify's body.
    return503OnClosing: false,
    // Long names reach the schema, which refuses them with a 400 like any other bad name.
    routerOptions: { maxParamLength: 16_384 },
    // Errors Node answers before a request exists (bad HTTP, headers too large, too slow): the
    // same { code, message } as every other error, and the connection closed.
    clientErrorHandler: (error: NodeJS.ErrnoException, socket) => {
      const answer = CLIENT_ERRORS[error.code ?? ''] ?? CLIENT_ERRORS.default!;
      if (!socket.writable || error.code === 'ECONNRESET' || error.code === 'EPIPE') {
        socket.destroy();
        return;
      }
      metrics.errors.inc({ code: answer.code });
      const body = JSON.stringify({ code: answer.code, message: answer.message });
      socket.end(
        `HTTP/1.1 ${ERROR_CODES[answer.code]} ${STATUS_CODES[ERROR_CODES[answer.code]]}\r\n` +
          `Connection: close\r\nContent-Type: application/json; charset=utf-8\r\n` +
          `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
      );
    },
    frameworkErrors: (error, _request, reply) => {
      metrics.errors.inc({ code: 'invalid_argument' });
      (reply as FastifyReply).status(400).send({ code: 'invalid_argument', message: error.message });
    },
  });
  app.server.maxConnections = options.maxConnections ?? defaultMaxConnections();
  // JSON only: a text/plain body is refused with 415, never parsed as something else.
  app.removeContentTypeParser('text/plain');
  let closing = false;
  app.addHook('preClose', async () => {
    closing = true;
  });
  // Once closing, every answer closes its connection, so a kept-alive client cannot hold the
  // server open after its last request. (Hooks here take a callback: an async hook costs every
  // request a promise.)
  app.addHook('onSend', (_request, reply, payload, done) => {
    if (closing) reply.header('connection', 'close');
    done(null, payload);
  });

  await app.register(swagger, {
    openapi: {
      openapi: '3.1.0',
      info: { title: 'ordo', version: '0.1.0', description: 'Numbers and order you can trust on PostgreSQL' },
      components: { securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } } },
      security: tokens.length ? [{ bearer: [] }] : [],
    },
  });

  app.addHook('onRequest', (request, _reply, done) => {
    if (closing) return done(new OrdoError('closed', 'the server is shutting down'));
    // Bodies are read as UTF-8 whatever the header says: refuse one declared otherwise.
    const type = request.headers['content-type'];
    if (type !== undefined && type.includes(';')) {
      const charset = /;\s*charset="?([^";\s]+)/i.exec(type)?.[1];
      if (charset !== undefined && !/^utf-?8$/i.test(charset)) {
        return done(
          new OrdoError('unsupported_media_type', `bodies must be UTF-8 JSON (got charset=${charset})`),
        );
      }
    }
    if (tokens.length === 0) return done();
    const scope = request.routeOptions.config.scope;
    if (!scope) return done();
    const token = authenticate(tokens, request.headers.authorization);
    if (!token)
      return done(
        new OrdoError('unauthorized', 'a valid bearer token is required (Authorization: Bearer …)'),
      );
    if (!token.scopes.has(scope))
      return done(new OrdoError('forbidden', `this token lacks the '${scope}' scope`));
    done();
  });

  app.addHook('onResponse', (request, reply, done) => {
    const ms = reply.elapsedTime;
    metrics.request(request.routeOptions.url ?? 'unmatched', request.method, reply.statusCode, ms / 1000);
    const url = request.url;
    const query = url.indexOf('?');
    request.log.info(
      {
        method: request.method,
        // The path only: a query string may carry what must not be logged (a token put there).
        url: query === -1 ? url : url.slice(0, query),
        status: reply.statusCode,
        ms: Math.round(ms * 10) / 10,
      },
      'request',
    );
    done();
  });

  app.setErrorHandler((error: FastifyError, request, reply) => {
    const known = error instanceof OrdoError ? error : undefined;
    const code: OrdoErrorCode | undefined =
      known?.code ??
      (error.validation ? 'invalid_argument' : error.code ? FASTIFY_CODES[error.code] : undefined) ??
      (typeof error.statusCode === 'number' && error.statusCode < 500 ? 'invalid_argument' : undefined);
    const ordoError = known ?? (code ? new OrdoError(code, error.message) : toOrdoError(error));
    // A 503 is a passing state the client retries (a restart): a warning; a 500 is a fault.
    if (ordoError.httpStatus === 503) request.log.warn({ code: ordoError.code }, ordoError.message);
    else if (ordoError.httpStatus >= 500) request.log.error({ err: error }, 'request failed');
    metrics.errors.inc({ code: ordoError.code });
    // Every 503 is transient (a restart, a timeout, a closing server): say when to come back.
    if (ordoError.httpStatus === 503) reply.header('retry-after', String(RETRY_AFTER_S));
    reply.status(ordoError.httpStatus).send({ code: ordoError.code, message: ordoError.message });
  });

  app.setNotFoundHandler((request, reply) => {
    metrics.errors.inc({ code: 'not_found' });
    reply
      .status(404)
      .send({ code: 'not_found', message: `no route ${request.method} ${request.url.split('?')[0]}` });
  });

  const errors = { 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 409: ERROR, 503: ERROR };

  // The process lives: answered whatever the database does.
  app.get('/healthz', { schema: { hide: true } }, async () => ({ status: 'ok' }));
  // The database answers: 503 database_unavailable (with Retry-After) while it does not.
  // `server`: the host ordo's sessions go to (with several hosts in the URL, the primary in use).
  app.get('/readyz', { schema: { hide: true } }, async () => ({
    status: 'ready',
    databaseMs: await ordo.ping(),
    server: ordo.server(),
  }));

  app.get('/metrics', { config: { scope: 'read' }, schema: { hide: true } }, async (_request, reply) => {
    reply.type(metrics.registry.contentType);
    return scrape();
  });

  app.get('/openapi.json', { config: { scope: 'read' }, schema: { hide: true } }, async () => app.swagger());

  app.post<{ Body: { query: string } }>(
    '/v1/query',
    {
      config: { scope: 'admin' },
      schema: {
        summary: 'Run SurrealQL-compatible statements; one { result } or { error, code } per statement',
        body: {
          type: 'object',
          additionalProperties: false,
          required: ['query'],
          properties: { query: { type: 'string', minLength: 1, maxLength: 60_000 } },
        },
        response: {
          ...errors,
          200: { type: 'array', items: { type: 'object', additionalProperties: true } },
        },
      },
    },
    async (request) => ordo.query(request.body.query),
  );

  sequenceRoutes(app, ordo, metrics);

  outboxRoutes(app, ordo);

  throttleRoutes(app, ordo);

  dashboardRoutes(app, ordo, { tokens: tokens.length > 0 });

  return app;
}
