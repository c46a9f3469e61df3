// `ordo serve` against clients that do not play fair: garbage, huge headers, bodies sent a byte
// at a time, sockets left open by the hundred. The server closes them, answers them with
// { code, message }, and keeps serving everyone else; /readyz tells a database that is gone.
import { connect, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freshDatabase, type TestDatabase } from './support/database.js';
import { ownPostgres } from './support/own-postgres.js';
import { killAll, type ServerProcess, startServer } from './support/server-process.js';

let db: TestDatabase;
let server: ServerProcess;
const sockets = new Set<Socket>();

beforeAll(async () => {
  db = await freshDatabase();
  server = await startServer({ databaseUrl: db.url, args: ['--request-timeout', '2s'] });
  await post('/v1/sequences/hostile', {}, 'PUT');
});

afterAll(async () => {
  for (const s of sockets) s.destroy();
  await server?.stop().catch(() => undefined);
  await killAll();
  await db?.drop();
});

async function post(path: string, json: unknown, method = 'POST'): Promise<{ status: number; json: any }> {
  const r = await fetch(`${server.url}${path}`, {
    method,
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(json),
    signal: AbortSignal.timeout(10_000),
  });
  return { status: r.status, json: await r.json() };
}

/** A raw connection to the server; resolves with everything it answered once it closes. */
function raw(port: number, send?: string): { socket: Socket; closed: Promise<string> } {
  const socket = connect(port, '127.0.0.1');
  sockets.add(socket);
  let received = '';
  socket.on('data', (chunk) => {
    received += chunk.toString();
  });
  socket.on('error', () => undefined);
  const closed = new Promise<string>((resolve) =>
    socket.on('close', () => {
      sockets.delete(socket);
      resolve(received);
    }),
  );
  if (send !== undefined) socket.write(send);
  return { socket, closed };
}

/** Status and JSON body of a raw HTTP answer. */
function parse(answer: string): { status: number; body: any } {
  const [head, body] = answer.split('\r\n\r\n');
  return { status: Number(head!.split(' ')[1]), body: JSON.parse(body!) };
}

describe('what Node refuses before a request exists', () => {
  it('garbage is a 400 { code, message } and the connection is closed', async () => {
    const { closed } = raw(server.port, 'HELLO THERE\r\n\r\n');
    const answer = parse(await closed);
    expect(answer).toEqual({ status: 400, body: { code: 'invalid_argument', message: expect.any(String) } });
  });

  it('headers over 16 KiB are a 431 headers_too_large', async () => {
    const big = `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`;
    const answer = parse(await raw(server.port, big).closed);
    expect(answer.status).toBe(431);
    expect(answer.body).toMatchObject({
      code: 'headers_too_large',
      message: expect.stringContaining('16 KiB'),
    });
  });

  it('a body sent a byte at a time is cut off at the request timeout with a 408 request_timeout', async () => {
    const started = Date.now();
    const { socket, closed } = raw(
      server.port,
      'POST /v1/sequences/hostile/next HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{',
    );
    const drip = setInterval(() => socket.write(' '), 300);
    const answer = await closed;
    clearInterval(drip);
    // --request-timeout 2s; Node checks every second or so.
    expect(Date.now() - started).toBeLessThan(8_000);
    expect(parse(answer)).toMatchObject({ status: 408, body: { code: 'request_timeout' } });
  });
});

describe('many hostile sockets', () => {
  it('with 300 idle sockets and 100 slow bodies open, a client taking numbers gets every one', async () => {
    const hostile = [
      ...Array.from({ length: 300 }, () => raw(server.port)),
      ...Array.from({ length: 100 }, () =>
        raw(
          server.port,
          'POST /v1/sequences/hostile/next HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n',
        ),
      ),
    ];
    const values: number[] = [];
    for (let i = 0; i < 100; i++) {
      const r = await post('/v1/sequences/hostile/next', {});
      expect(r.status).toBe(200);
      values.push(r.json.value);
    }
    expect(values).toEqual(values.map((_, i) => values[0]! + i));
    expect((await fetch(`${server.url}/healthz`)).status).toBe(200);
    // The slow ones are closed by the request timeout, the idle ones by the socket timeout.
    const answers = await Promise.all(hostile.slice(300).map((h) => h.closed));
    for (const a of answers) expect(parse(a).status).toBe(408);
    for (const h of hostile.slice(0, 300)) h.socket.destroy();
  });

  it('--max-connections: connections past the cap are closed at once; the server serves again when they go', async () => {
    const capped = await startServer({ databaseUrl: db.url, args: ['--max-connections', '20'] });
    try {
      const held = Array.from({ length: 20 }, () => raw(capped.port));
      await sleep(300);
      const extra = raw(capped.port, 'GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n');
      expect(await extra.closed).toBe(''); // closed without an answer: the cap holds
      for (const h of held) h.socket.destroy();
      await Promise.all(held.map((h) => h.closed));
      await sleep(100);
      expect((await fetch(`${capped.url}/healthz`)).status).toBe(200);
    } finally {
      await capped.stop();
    }
  });
});

describe('/readyz', () => {
  it('200 while the database answers; 503 database_unavailable with Retry-After when it is gone, while /healthz stays 200', async () => {
    const own = await ownPostgres();
    const ownServer = await startServer({ databaseUrl: own.url });
    try {
      const ready = await fetch(`${ownServer.url}/readyz`);
      expect(ready.status).toBe(200);
      expect(await ready.json()).toMatchObject({ status: 'ready', databaseMs: expect.any(Number) });
      await own.stop();
      const gone = await fetch(`${ownServer.url}/readyz`);
      expect(gone.status).toBe(503);
      expect(gone.headers.get('retry-after')).toBe('1');
      const body = (await gone.json()) as { code: string; message: string };
      expect(body).toMatchObject({ code: 'database_unavailable' });
      // Never the database's address.
      expect(body.message).not.toMatch(/127\.0\.0\.1|:\d{4,5}/);
      expect((await fetch(`${ownServer.url}/healthz`)).status).toBe(200);
    } finally {
      await ownServer.stop();
      await own.stop().catch(() => undefined);
    }
  });
});
