// What a relay sends for a message, whatever the broker: its one id, its body, its headers and
// CloudEvents attributes, and the destination its template names.
import { describe, expect, it } from 'vitest';
import type { OutboxMessage } from '../src/index.js';
import { cloudEventsSource, parseTemplate, toRelayMessage } from '../src/outbox/relays/envelope.js';

const message = (over: Partial<OutboxMessage> = {}): OutboxMessage => ({
  position: 1042,
  transactionId: '777',
  topic: 'orders',
  type: 'OrderPlaced',
  key: 'ord-7',
  messageId: null,
  data: { total: 42 },
  headers: { traceparent: '00-abc-def-01', retries: 3, note: null },
  createdAt: new Date('2026-11-28T10:00:00.000Z'),
  ...over,
});
const template = (text: string) => parseTemplate(text).template!;

describe('templates', () => {
  it('render {topic}, {type}, {key} and {partition}, and text around them', () => {
    const t = template('{topic}.{type}.k-{key}.p{partition}');
    expect(t.render({ topic: 'orders', type: 'Placed', key: 'a', partition: '3' })).toBe(
      'orders.Placed.k-a.p3',
    );
    expect(template('plain').render({ topic: 'x', type: 'y', key: 'z', partition: '0' })).toBe('plain');
  });

  it('refuse an unknown field and a brace without its pair, saying which', () => {
    expect(parseTemplate('a.{tenant}').problem).toBe(
      '{tenant} is not a field: use {topic}, {type}, {key}, {partition}',
    );
    expect(parseTemplate('a.{type').problem).toBe("a '{' without its '}'");
    expect(parseTemplate('a.type}').problem).toBe("a '}' without its '{'");
    expect(parseTemplate('{}').problem).toMatch(/\{\} is not a field/);
  });
});

describe('the message a relay sends', () => {
  it('is identified by its messageId when it has one, else by its topic and position', () => {
    expect(toRelayMessage(message(), 0, template('x')).id).toBe('orders:1042');
    expect(toRelayMessage(message({ messageId: 'order-7-placed' }), 0, template('x')).id).toBe(
      'order-7-placed',
    );
  });

  it('carries its data as JSON, its own headers as text, and the CloudEvents attributes of binary mode', () => {
    const m = toRelayMessage(message(), 2, template('{type}.{partition}'));
    expect(m.body).toBe('{"total":42}');
    expect(m.destination).toBe('OrderPlaced.2');
    expect(m.headers).toEqual({
      traceparent: '00-abc-def-01',
      retries: '3',
      'ce-specversion': '1.0',
      'ce-id': 'orders:1042',
      'ce-type': 'OrderPlaced',
      'ce-source': '/ordo/topics/orders',
      'ce-subject': 'ord-7',
      'ce-time': '2026-11-28T10:00:00.000Z',
      'content-type': 'application/json',
    });
  });

  it('without a key: no ce-subject, and {key} renders empty', () => {
    const m = toRelayMessage(message({ key: null }), 0, template('k-{key}'));
    expect(m.headers).not.toHaveProperty('ce-subject');
    expect(m.destination).toBe('k-');
  });

  it('a topic is escaped in ce-source as a URI reference', () => {
    expect(cloudEventsSource('a:b.c')).toBe('/ordo/topics/a%3Ab.c');
  });
});
