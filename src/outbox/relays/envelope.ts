import type { OutboxMessage } from '../messages.js';

/** The fields a destination template may name. */
export const TEMPLATE_FIELDS = ['topic', 'type', 'key', 'partition'] as const;
type TemplateField = (typeof TEMPLATE_FIELDS)[number];

/** What a relay sends for one message, whatever the broker. */
export interface RelayMessage {
  /**
   * The message's one id, the same on every attempt and after a restore: its messageId when it
   * was appended with one, else its topic and position (positions survive a dump and restore).
   */
  id: string;
  topic: string;
  type: string;
  key: string | null;
  partition: number;
  position: number;
  createdAt: Date;
  /** The message's data as JSON text: the body on every broker. */
  body: string;
  /**
   * The message's own headers (a traceparent among them), then the CloudEvents attributes of
   * binary mode, every value a string.
   */
  headers: Record<string, string>;
  /** The broker-side name the relay's template gives this message (subject, routing key, topic…). */
  destination: string;
}

/**
 * A destination template: text with `{topic}`, `{type}`, `{key}` or `{partition}` in it. Checked
 * once when the relay is created, so that a typo is refused there rather than per message.
 */
export interface Template {
  readonly text: string;
  render(fields: Record<TemplateField, string>): string;
}

export function parseTemplate(text: string): { template?: Template; problem?: string } {
  const parts: (string | { field: TemplateField })[] = [];
  let rest = text;
  while (rest.length > 0) {
    const open = rest.indexOf('{');
    const close = rest.indexOf('}');
    if (open === -1 && close === -1) {
      parts.push(rest);
      break;
    }
    if (close !== -1 && (open === -1 || close < open)) return { problem: `a '}' without its '{'` };
    if (close === -1) return { problem: `a '{' without its '}'` };
    const name = rest.slice(open + 1, close);
    if (!(TEMPLATE_FIELDS as readonly string[]).includes(name)) {
      return { problem: `{${name}} is not a field: use ${TEMPLATE_FIELDS.map((f) => `{${f}}`).join(', ')}` };
    }
    if (open > 0) parts.push(rest.slice(0, open));
    parts.push({ field: name as TemplateField });
    rest = rest.slice(close + 1);
  }
  return {
    template: {
      text,
      render: (fields) => parts.map((p) => (typeof p === 'string' ? p : fields[p.field])).join(''),
    },
  };
}

/** The CloudEvents `source` of a topic: a URI reference naming ordo's outbox and the topic. */
export const cloudEventsSource = (topic: string): string => `/ordo/topics/${encodeURIComponent(topic)}`;

export function toRelayMessage(m: OutboxMessage, partition: number, destination: Template): RelayMessage {
  const id = m.messageId ?? `${m.topic}:${m.position}`;
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(m.headers ?? {})) {
    if (value !== null && value !== undefined)
      headers[name] = typeof value === 'string' ? value : JSON.stringify(value);
  }
  headers['ce-specversion'] = '1.0';
  headers['ce-id'] = id;
  headers['ce-type'] = m.type;
  headers['ce-source'] = cloudEventsSource(m.topic);
  if (m.key !== null) headers['ce-subject'] = m.key;
  headers['ce-time'] = m.createdAt.toISOString();
  headers['content-type'] = 'application/json';
  return {
    id,
    topic: m.topic,
    type: m.type,
    key: m.key,
    partition,
    position: m.position,
    createdAt: m.createdAt,
    body: JSON.stringify(m.data),
    headers,
    destination: destination.render({
      topic: m.topic,
      type: m.type,
      key: m.key ?? '',
      partition: String(partition),
    }),
  };
}
