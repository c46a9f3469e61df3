import type { Broker } from './brokers.js';

export type RedisConfig = Record<string, unknown>;

/** To be written. */
export const redis: Broker<RedisConfig> = {
  name: 'redis',
  templateOption: 'TODO',
  window: 1,
  check: (o) => o,
  template: () => '',
  describe: () => 'redis',
  load: async () => undefined,
  connect: async () => {
    throw new Error('redis relays are not written yet');
  },
};
