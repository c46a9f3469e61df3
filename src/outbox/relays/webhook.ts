import type { Broker } from './brokers.js';

export type WebhookConfig = Record<string, unknown>;

/** To be written. */
export const webhook: Broker<WebhookConfig> = {
  name: 'webhook',
  templateOption: 'TODO',
  window: 1,
  check: (o) => o,
  template: () => '',
  describe: () => 'webhook',
  load: async () => undefined,
  connect: async () => {
    throw new Error('webhook relays are not written yet');
  },
};
