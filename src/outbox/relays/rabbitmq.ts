import type { Broker } from './brokers.js';

export type RabbitmqConfig = Record<string, unknown>;

/** To be written. */
export const rabbitmq: Broker<RabbitmqConfig> = {
  name: 'rabbitmq',
  templateOption: 'TODO',
  window: 1,
  check: (o) => o,
  template: () => '',
  describe: () => 'rabbitmq',
  load: async () => undefined,
  connect: async () => {
    throw new Error('rabbitmq relays are not written yet');
  },
};
