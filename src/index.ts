export { type EmbeddedOptions, envDatabaseUrl, type Log, type LogEntry, type OrdoOptions } from './config.js';
export type { NotificationState, NotificationStatus } from './db/notifications.js';
export {
  type DrizzleTransaction,
  fromDrizzle,
  fromKysely,
  fromPostgresJs,
  fromRawSql,
  type KyselyTransaction,
  type PostgresJsTransaction,
} from './db/drivers.js';
export type { Queryable, Tx } from './db/queryable.js';
export { durationOption, formatDuration, MAX_DURATION_TEXT, parseDuration } from './durations.js';
export { ERROR_CODES, OrdoError, type OrdoErrorCode, sequenceNotFound, toOrdoError } from './errors.js';
export { createOrdo, type DatabaseInfo, Ordo } from './ordo.js';
export { describeHost } from './db/connection-string.js';
export type { Handler, HandlerContext, SubscriptionEnd } from './outbox/consumer.js';
export type { Blocker, PartitionLag, SubscriptionLag } from './outbox/lag.js';
export {
  type Appended,
  MAX_APPEND,
  type MessageInput,
  OUTBOX_NAME_PATTERN,
  type OutboxMessage,
} from './outbox/messages.js';
export {
  type AppendOptions,
  type DeadLetter,
  MAX_ATTEMPTS,
  MAX_BATCH,
  MAX_PARTITIONS,
  MAX_RECEIPT_LENGTH,
  type NackOptions,
  type NackResult,
  Outbox,
  type Received,
  type ReceiveOptions,
  type SeekTarget,
  type SubscribeOptions,
  type Subscription,
} from './outbox/outbox.js';
export {
  MAX_WINDOW,
  RELAY_STATES,
  type Relay,
  type RelayOptions,
  type RelayState,
  type RelayStateName,
  type RelayStatus,
  type RelayTarget,
} from './outbox/relays/relay.js';
export { RELAY_BROKERS, type RelayBroker } from './outbox/relays/brokers.js';
export { TEMPLATE_FIELDS } from './outbox/relays/envelope.js';
export type { StatementResult } from './query/executor.js';
export type { CounterValue, HeldRange, SequenceActivity } from './sequences/activity.js';
export type { AttachOptions, Attachment, CounterHolder, DetachOptions } from './sequences/attachments.js';
export type { Issued } from './sequences/coalescer.js';
export type {
  DefineSequenceOptions,
  ResetPeriod,
  SequenceDefinition,
  SequenceKind,
} from './sequences/definitions.js';
export { MAX_BATCH as MAX_SEQUENCE_BATCH, MAX_TIMEOUT_MS } from './sequences/definitions.js';
export { FORMAT_TOKENS, MAX_FORMAT_LENGTH } from './sequences/format.js';
export {
  MAX_COUNT,
  MAX_IDEMPOTENCY_KEY_LENGTH,
  type NextOptions,
  type RemoveOptions,
  type SequenceStatus,
  Sequences,
} from './sequences/sequences.js';
export {
  type DefineThrottleOptions,
  MAX_DURATION_MS,
  MAX_LIMIT,
  REFUSAL_REASONS,
  type ThrottleDefinition,
  type ThrottlePolicy,
} from './throttles/definitions.js';
export {
  type AcquireResult,
  type FailOptions,
  Permit,
  type PermitCallOptions,
  type PermitEnd,
  type PermitItem,
  type PermitOutcome,
  type Refusal,
} from './throttles/permit.js';
export {
  type AcquireAllOptions,
  type AcquireItem,
  type AcquireOptions,
  type EffectiveLimits,
  type KeyLimits,
  MAX_ITEMS,
  MAX_WAIT_MS,
  type PauseOptions,
  type RemoveThrottleOptions,
  type RunContext,
  type RunOptions,
  type RunResult,
  type RunningPermit,
  type ThrottleCounters,
  type ThrottleState,
  Throttles,
} from './throttles/throttles.js';
export {
  IDENTIFIER_PATTERN,
  MAX_ERROR_LENGTH,
  MAX_TEXT,
  MAX_TIME_ZONE_LENGTH,
  MAX_VALUE,
} from './validate.js';
