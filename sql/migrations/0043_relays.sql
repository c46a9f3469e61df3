-- Relays: the subscriptions whose handler is a broker, where each publishes, and the last failure
-- its process met (a broker away is not a failed message, so the subscription does not record
-- it). Written by the relay's process as it starts and fails; read by any process, so that
-- `ordo status` and every instance's HTTP API show the relays wherever they run.
CREATE TABLE {{schema}}.relays (
  name          text PRIMARY KEY REFERENCES {{schema}}.subscriptions (name) ON DELETE CASCADE,
  broker        text NOT NULL,
  -- Where it publishes, without secrets.
  target        text NOT NULL,
  started_at    timestamptz NOT NULL DEFAULT now(),
  last_error    text,
  last_error_at timestamptz
);
