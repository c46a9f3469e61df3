export type { EmbeddedOptions, Log, LogEntry, OrdoOptions } from './config.js';
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
export { ERROR_CODES, OrdoError, type OrdoErrorCode } from './errors.js';
export { createOrdo, type DatabaseInfo, Ordo } from './ordo.js';
export type { Handler, HandlerContext, SubscriptionEnd } from './outbox/consumer.js';
export type { Blocker, SubscriptionLag } from './outbox/lag.js';
export { type Appended, MAX_APPEND, type MessageInput, type OutboxMessage } from './outbox/messages.js';
export {
  type AppendOptions,
  type DeadLetter,
  Outbox,
  type SubscribeOptions,
  type Subscription,
} from './outbox/outbox.js';
export type { StatementResult } from './query/executor.js';
export type { Issued } from './sequences/coalescer.js';
export type {
  DefineSequenceOptions,
  ResetPeriod,
  SequenceDefinition,
  SequenceKind,
} from './sequences/definitions.js';
export { FORMAT_TOKENS } from './sequences/format.js';
export {
  MAX_COUNT,
  type NextOptions,
  type RemoveOptions,
  type SequenceStatus,
  Sequences,
} from './sequences/sequences.js';
export type { DefineThrottleOptions, ThrottleDefinition, ThrottlePolicy } from './throttles/definitions.js';
export {
  type AcquireResult,
  type FailOptions,
  Permit,
  type PermitCallOptions,
  type PermitEnd,
  type PermitOutcome,
  type Refusal,
} from './throttles/permit.js';
export {
  type AcquireOptions,
  type RemoveThrottleOptions,
  type RunContext,
  type RunOptions,
  type RunResult,
  type RunningPermit,
  type ThrottleState,
  Throttles,
} from './throttles/throttles.js';
