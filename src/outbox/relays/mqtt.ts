import type { Broker } from './brokers.js';

export type MqttConfig = Record<string, unknown>;

/** To be written. */
export const mqtt: Broker<MqttConfig> = {
  name: 'mqtt',
  templateOption: 'TODO',
  window: 1,
  check: (o) => o,
  template: () => '',
  describe: () => 'mqtt',
  load: async () => undefined,
  connect: async () => {
    throw new Error('mqtt relays are not written yet');
  },
};
