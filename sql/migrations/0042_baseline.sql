-- The baseline: every table, index, type and sequence of ordo's schema as the migrations before
-- the first release left it, squashed into one. A database those migrations built is already at
-- this version and skips it; later changes to tables are migrations after this one.
--
-- The functions live in sql/functions/ and are applied after the migrations. The objects below
-- that call one (a CHECK, the attachments view, a trigger, the first cluster row) need it
-- first; the line below names them and the migrator applies them before this file.
--
--! needs: check_format, trigger_args, keep_attached_gapless, cluster_id

---------------------------------------------------------------------------------------------
-- Sequences: definitions, and the counters of gapless ones.

-- Epochs come from one sequence, so that a name removed and defined again never gets an epoch
-- a node may still hold ranges of.
CREATE SEQUENCE {{schema}}.epochs AS integer;

CREATE TABLE {{schema}}.sequences (
  name        text PRIMARY KEY CHECK (name ~ '^[A-Za-z_][A-Za-z0-9_]{0,62}$'),
  kind        text NOT NULL DEFAULT 'gapless' CHECK (kind IN ('gapless', 'batched')),
  start       bigint NOT NULL DEFAULT 1,
  increment   bigint NOT NULL DEFAULT 1 CHECK (increment > 0),
  min_value   bigint NOT NULL DEFAULT 1,
  max_value   bigint NOT NULL DEFAULT 9007199254740991,
  cycle       boolean NOT NULL DEFAULT false,
  batch       integer CHECK (batch > 0),
  timeout_ms  bigint CHECK (timeout_ms >= 0),
  reset       text NOT NULL DEFAULT 'never' CHECK (reset IN ('never', 'day', 'week', 'month', 'year')),
  time_zone   text NOT NULL DEFAULT 'UTC',
  format      text CHECK (format ~ '\{n(:[0-9]+)?\}'),
  -- Not used: a batched sequence's high-water mark is its storage.
  high_water  bigint,
  -- Bumped by every redefinition: a node serves a range only while its epoch is current.
  epoch       integer NOT NULL DEFAULT nextval('{{schema}}.epochs'),
  created_at  timestamptz NOT NULL DEFAULT now(),
  updated_at  timestamptz NOT NULL DEFAULT now(),
  -- A batched sequence's high-water mark: a PostgreSQL sequence stepping by batch × increment,
  -- so that a node reserves a range with one nextval(), which never waits for a caller's
  -- transaction and is never rolled back.
  storage     text,
  -- The month a fiscal year starts in (reset 'year' only).
  year_start  smallint NOT NULL DEFAULT 1 CHECK (year_start BETWEEN 1 AND 12),
  floor       bigint,
  -- Values stay within ±(2^53 - 1) so that JavaScript numbers never round them.
  CONSTRAINT sequences_check CHECK (min_value >= -9007199254740991 AND max_value <= 9007199254740991),
  CONSTRAINT sequences_check1 CHECK (min_value <= start AND start <= max_value),
  CONSTRAINT batched_shape CHECK (
    kind = 'gapless'
    OR (batch IS NOT NULL AND storage IS NOT NULL AND NOT cycle AND reset = 'never' AND format IS NULL
        AND batch::numeric * increment <= 9007199254740991))
);

COMMENT ON COLUMN {{schema}}.sequences.floor IS
  'Every value an earlier definition of another kind may have handed out is below this; no definition starts below it (null: none)';

-- NOT VALID: the rule is check_format(), code that may grow stricter; definitions stored before
-- it did keep working (render() is safe for any text), every new or changed one is checked.
ALTER TABLE {{schema}}.sequences
  ADD CONSTRAINT sequences_format_bounded CHECK ({{schema}}.check_format(format)) NOT VALID;

-- One row per (sequence, scope, period). `period` is the local start of the reset period
-- ('-infinity' when the sequence never resets). `previous` is the value before the last
-- statement that touched the row, so one statement can hand out several values in order.
CREATE TABLE {{schema}}.counters (
  sequence    text NOT NULL REFERENCES {{schema}}.sequences (name) ON DELETE CASCADE,
  scope       text NOT NULL,
  period      date NOT NULL,
  value       bigint NOT NULL,
  previous    bigint,
  updated_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (sequence, scope, period)
);

-- Idempotent takes: a client that retries a call with the same key gets the same numbers, so a
-- number committed while its answer was lost (a connection cut between COMMIT and the reply)
-- still reaches the client that asked for it. Kept for a day (maintain() deletes older ones).
CREATE TABLE {{schema}}.issued (
  sequence        text NOT NULL REFERENCES {{schema}}.sequences (name) ON DELETE CASCADE,
  idempotency_key text NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 200),
  scope           text NOT NULL,
  how_many        integer NOT NULL,
  issued_values   bigint[],
  texts           text[],
  period          text,
  issued_at       timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (sequence, idempotency_key)
);

CREATE INDEX issued_by_age ON {{schema}}.issued (issued_at);

---------------------------------------------------------------------------------------------
-- Gapless numbers at commit: the attachments are triggers on the users' tables, so a dropped
-- table takes its attachment with it.

-- Every column numbered at commit: one row per attach_sequence() (a partitioned table once).
CREATE VIEW {{schema}}.attachments AS
  SELECT a[1] AS sequence, t.tgrelid::regclass AS table_name, a[2] AS column_name,
         nullif(a[3], '') AS scope_column, nullif(a[4], '') AS text_column, t.tgname AS trigger_name
  FROM pg_trigger AS t
  JOIN pg_proc AS p ON p.oid = t.tgfoid
  CROSS JOIN LATERAL (SELECT {{schema}}.trigger_args(t.tgargs) AS a) AS x
  WHERE p.pronamespace = '{{schema}}'::regnamespace
    AND p.proname LIKE 'number\_at\_commit\_%'
    AND t.tgparentid = 0;

-- A sequence some table is numbered from stays gapless.
CREATE TRIGGER keep_attached_gapless BEFORE UPDATE OF kind ON {{schema}}.sequences
  FOR EACH ROW WHEN (OLD.kind = 'gapless' AND NEW.kind <> 'gapless')
  EXECUTE FUNCTION {{schema}}.keep_attached_gapless();

---------------------------------------------------------------------------------------------
-- Batched sequences: which node reserved which range, in which epoch of the definition.

CREATE TABLE {{schema}}.sequence_batches (
  sequence    text NOT NULL REFERENCES {{schema}}.sequences (name) ON DELETE CASCADE,
  node_id     uuid NOT NULL,
  first       bigint NOT NULL,
  last        bigint NOT NULL,
  epoch       integer NOT NULL,
  reserved_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (sequence, first)
);

CREATE INDEX sequence_batches_node ON {{schema}}.sequence_batches (node_id, reserved_at);

---------------------------------------------------------------------------------------------
-- Outbox.

-- Every message appended, with the transaction that wrote it. The table has no CHECK
-- constraints: append_many() is the one writer and checks each message in its own statement
-- (message_problem()), since PostgreSQL builds a table's CHECK expressions anew for every
-- statement that writes to it. topic and message_id compare byte by byte (COLLATE "C"): ordo
-- only compares them for equality, and they lead the indexes every append walks.
CREATE TABLE {{schema}}.messages (
  position        bigint GENERATED ALWAYS AS IDENTITY,
  transaction_id  xid8 NOT NULL DEFAULT pg_current_xact_id(),
  topic           text COLLATE "C" NOT NULL,
  type            text NOT NULL,
  key             text,
  message_id      text COLLATE "C",
  data            jsonb NOT NULL,
  headers         jsonb NOT NULL DEFAULT '{}',
  created_at      timestamptz NOT NULL DEFAULT now(),
  -- With the topic fixed, an index scan returns a transaction's messages in order with no sort.
  -- It is the key as well: an index on position alone would cost every append and serve no read.
  CONSTRAINT messages_order PRIMARY KEY (topic, transaction_id, position)
);

-- A repeated message_id on a topic is stored once: retries of an append are harmless.
CREATE UNIQUE INDEX messages_message_id ON {{schema}}.messages (topic, message_id)
  WHERE message_id IS NOT NULL;

-- Rounds read by position within a topic.
CREATE INDEX messages_topic_position ON {{schema}}.messages (topic, position);

-- The database clusters this outbox has lived in (a restore into another cluster starts a new
-- one), with the first position appended in each: positions below it committed before the
-- cluster began.
CREATE TABLE {{schema}}.clusters (
  cluster         bigint PRIMARY KEY,
  first_position  bigint NOT NULL,
  recorded_at     timestamptz NOT NULL DEFAULT now()
);

INSERT INTO {{schema}}.clusters (cluster, first_position) VALUES ({{schema}}.cluster_id(), 0);

CREATE TABLE {{schema}}.subscriptions (
  name        text PRIMARY KEY CHECK (length(name) <= 200 AND name ~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]*$'),
  topic       text COLLATE "C" NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  partitions  integer NOT NULL DEFAULT 1 CHECK (partitions BETWEEN 1 AND 256)
);

CREATE INDEX subscriptions_topic ON {{schema}}.subscriptions (topic);

-- Where each partition of a subscription stands. A round delivers, in position order, the
-- messages committed between two snapshots (base and target); its progress is the last position
-- delivered.
CREATE TABLE {{schema}}.subscription_partitions (
  subscription        text NOT NULL REFERENCES {{schema}}.subscriptions (name) ON DELETE CASCADE,
  partition           integer NOT NULL,
  -- Bumped by every change: a batch is acknowledged only against the version it was read at.
  version             bigint NOT NULL DEFAULT 0,
  base_position       bigint NOT NULL,
  base_snapshot       pg_snapshot NOT NULL,
  base_bound          xid8,            -- null: unknown, every id from the snapshot's xmax up
  target_position     bigint,
  target_snapshot     pg_snapshot,
  target_bound        xid8,
  -- Messages below it were committed before the target's cluster began: no visibility test.
  target_floor        bigint,
  target_cluster      bigint,
  progress            bigint NOT NULL DEFAULT 0,       -- last position delivered in this round
  -- A (transaction, position) cursor of a subscription older than commit-order rounds, kept
  -- until its first round is done.
  legacy_transaction_id xid8,
  legacy_position     bigint,
  -- The cluster the base was taken in.
  cluster             bigint NOT NULL,
  owner               text,
  lease_until         timestamptz,
  not_before          timestamptz,
  -- The batch handed out under the lease and not yet acknowledged.
  batch_last          bigint,
  batch_count         integer,
  batch_done          boolean,
  -- After a batch failed: deliver one at a time up to here, to find the message that fails.
  single_until        bigint,
  attempts            integer NOT NULL DEFAULT 0,
  attempts_position   bigint,
  last_error          text,
  delivered           bigint NOT NULL DEFAULT 0,
  -- Messages handed out again: after a failure, a lapsed lease, or a crash before the ack.
  redelivered         bigint NOT NULL DEFAULT 0,
  checkpointed_at     timestamptz,
  PRIMARY KEY (subscription, partition)
);

-- The consumers of a subscription in this library, so that they share its partitions.
CREATE TABLE {{schema}}.subscription_members (
  subscription  text NOT NULL REFERENCES {{schema}}.subscriptions (name) ON DELETE CASCADE,
  member        text NOT NULL,
  joined_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
  seen_until    timestamptz NOT NULL,
  PRIMARY KEY (subscription, member)
);

-- Messages a subscription gave up on after its attempts, with the last error.
CREATE TABLE {{schema}}.dead_letters (
  subscription    text NOT NULL,
  position        bigint NOT NULL,
  transaction_id  xid8 NOT NULL,
  topic           text NOT NULL,
  type            text NOT NULL,
  key             text,
  message_id      text,
  data            jsonb NOT NULL,
  headers         jsonb NOT NULL,
  created_at      timestamptz NOT NULL,
  attempts        integer NOT NULL,
  error           text,
  parked_at       timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (subscription, position)
);

---------------------------------------------------------------------------------------------
-- Throttles.

-- A throttle removed and defined again is a new incarnation: rows its previous incarnation
-- may have left behind (a decision racing with the removal) are recognised and never count.
CREATE SEQUENCE {{schema}}.throttle_incarnations AS bigint;

CREATE TABLE {{schema}}.throttles (
  name              text PRIMARY KEY CHECK (name ~ '^[A-Za-z_][A-Za-z0-9_]{0,62}$'),
  -- At most one start per every_ms per key.
  every_ms          bigint CHECK (every_ms BETWEEN 1 AND 31536000000),
  -- A token bucket per key: bursts of rate_limit, refilled at rate_limit per per_ms.
  -- (`limit` is a reserved word in SQL, hence rate_limit.)
  rate_limit        integer CHECK (rate_limit BETWEEN 1 AND 1000000),
  per_ms            bigint CHECK (per_ms BETWEEN 1 AND 31536000000),
  -- At most this many live permits per key.
  concurrency       integer CHECK (concurrency BETWEEN 1 AND 1000000),
  -- A permit not completed, failed or extended within lease_ms is dead. Null: a throttle
  -- without permits (a plain rate limiter), whose grants store nothing.
  lease_ms          bigint DEFAULT 300000 CHECK (lease_ms BETWEEN 1 AND 31536000000),
  -- What fail_permit() does when the caller does not say: give the start back or not.
  refund_on_failure boolean NOT NULL DEFAULT false,
  incarnation       bigint NOT NULL DEFAULT nextval('{{schema}}.throttle_incarnations'),
  created_at        timestamptz NOT NULL DEFAULT now(),
  updated_at        timestamptz NOT NULL DEFAULT now(),
  -- A pause of the whole throttle: every request waits until then.
  paused_until      timestamptz,
  CONSTRAINT throttles_check CHECK ((rate_limit IS NULL) = (per_ms IS NULL)),
  CONSTRAINT throttles_check1 CHECK (every_ms IS NOT NULL OR rate_limit IS NOT NULL OR concurrency IS NOT NULL),
  CONSTRAINT throttles_permits_check CHECK (lease_ms IS NOT NULL OR (concurrency IS NULL AND NOT refund_on_failure))
);

-- One row per (throttle, key) ever used. Its row lock serializes the decisions on the key.
-- fillfactor: the row is rewritten by every grant; room on the page keeps those updates HOT.
-- No CHECK constraints: each column has one writer that checks what it writes (see messages).
CREATE TABLE {{schema}}.throttle_state (
  name         text NOT NULL,
  key          text NOT NULL,
  incarnation  bigint NOT NULL,
  -- The last granted start, as shown to users.
  last_start   timestamptz,
  -- The start the `every` interval runs from: last_start, or the one before it after a refund.
  every_from   timestamptz,
  -- GCRA theoretical arrival time: the bucket is full when tat <= now.
  tat          timestamptz,
  -- The permit that ended last (by its end time), and how: 'completed', 'failed' or 'expired'.
  last_end     timestamptz,
  last_outcome text,
  last_error   text,
  last_permit  uuid,
  starts       bigint NOT NULL DEFAULT 0,
  -- The clock of the last decision that wrote this row: a decision never uses an earlier one.
  decided_at   timestamptz,
  -- Every permit whose lease ran out by then is marked expired: the next decision looks only
  -- at leases that ended after it.
  swept_until  timestamptz,
  -- A pause of this key (a failure with a hold, as after a downstream 429).
  paused_until timestamptz,
  -- The key's own limits, which replace the throttle's (set_key_limits()).
  own_every_ms    bigint,
  own_rate_limit  integer,
  own_per_ms      bigint,
  own_concurrency integer,
  -- Units of permits not yet folded or swept: when no locked key has any, a decision reads no
  -- permits.
  live_units   bigint NOT NULL DEFAULT 0,
  PRIMARY KEY (name, key)
) WITH (fillfactor = 70);

-- Live permits, and ended ones until the next decision on their key folds them into
-- throttle_state (completed and failed permits are then deleted; expired ones are kept for a
-- day, so that their holder is told permit_expired rather than permit_not_found). A composite
-- permit has a row per limit, sharing the id.
-- fillfactor and autovacuum: rows come and go by the thousand and are updated once; room on
-- the page keeps the update HOT, and autovacuum visits every few thousand of them, whatever the
-- table's size. REPLICA IDENTITY FULL: the table has no primary key, and its updates and
-- deletes stay publishable where a publication covers every table.
CREATE TABLE {{schema}}.permits (
  id           uuid NOT NULL,
  name         text NOT NULL,
  key          text NOT NULL,
  incarnation  bigint NOT NULL,
  holder       text NOT NULL,
  acquired_at  timestamptz NOT NULL,
  expires_at   timestamptz NOT NULL,
  ended_at     timestamptz,
  -- 'completed', 'failed' or 'expired', written by the functions that end and fold permits.
  outcome      text,
  error        text,
  -- fail_permit(…, refund): the next decision gives back what this permit consumed.
  refund       boolean NOT NULL DEFAULT false,
  -- What the grant consumed, so that a refund gives back exactly that: the `every` start it
  -- replaced, and the emission interval its token cost.
  every_before timestamptz,
  rate_cost    interval,
  cost         integer NOT NULL DEFAULT 1,
  -- fail(…, hold): the next decision on the key pauses it until then.
  hold_until   timestamptz,
  -- Guards the logic of the functions that end permits: ended_at and outcome are set together.
  CHECK ((ended_at IS NULL) = (outcome IS NULL))
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.0, autovacuum_vacuum_threshold = 5000,
        autovacuum_vacuum_insert_scale_factor = 0.0, autovacuum_vacuum_insert_threshold = 5000);

ALTER TABLE {{schema}}.permits REPLICA IDENTITY FULL;

-- complete, fail and extend find a permit by its id alone (their expiry test stays out of the
-- index condition, so that this index serves them however the planner estimates the table).
CREATE INDEX permits_by_id ON {{schema}}.permits (id);

-- A key's permits by expiry: counting the live ones, finding the ended ones and the leases that
-- ran out. ended_at is not indexed (nor in an index predicate), so that complete and fail are
-- HOT updates.
CREATE INDEX permits_by_key ON {{schema}}.permits (name, key, expires_at);

-- Keys with something to apply under their lock (a refund, a hold): a decision on them always
-- takes the lock, even when a snapshot refuses.
CREATE INDEX permits_to_fold ON {{schema}}.permits (name, key) WHERE refund OR hold_until IS NOT NULL;

-- One key of a decision: its definition (the key's own limits over the throttle's), its state
-- as it will be written back, and what this decision found.
CREATE TYPE {{schema}}.throttle_key AS (
  name            text,
  key             text,
  incarnation     bigint,
  every_ms        bigint,
  rate_limit      integer,
  per_ms          bigint,
  concurrency     integer,
  lease_ms        bigint,
  unit            interval,      -- a token's emission interval
  throttle_paused timestamptz,
  -- throttle_state's columns
  state_incarnation bigint,
  last_start      timestamptz,
  every_from      timestamptz,
  tat             timestamptz,
  last_end        timestamptz,
  last_outcome    text,
  last_error      text,
  last_permit     uuid,
  starts          bigint,
  decided_at      timestamptz,
  swept_until     timestamptz,
  paused_until    timestamptz,
  own_every_ms    bigint,
  own_rate_limit  integer,
  own_per_ms      bigint,
  own_concurrency integer,
  -- this decision
  locked          boolean,
  to_fold         boolean,       -- a refund or a hold waits in its permits
  c               timestamptz,   -- the clock the key is decided at
  live            bigint,        -- units of live permits
  earliest        timestamptz,   -- the first live lease to run out
  wait            interval,      -- refused from a snapshot: how long, and why
  reason          text,
  changed         boolean
);

-- Requests waiting in line. A waiter is alive while its process renews alive_until (a process
-- killed leaves the line when it lapses); served, it holds the permit until its process picks
-- it up. last_*: the answer it got when it last was at the head of its lane.
CREATE TABLE {{schema}}.throttle_waiters (
  id              uuid PRIMARY KEY,
  seq             bigint GENERATED ALWAYS AS IDENTITY,
  lane            text NOT NULL,
  names           text[] NOT NULL,
  keys            text[] NOT NULL,
  costs           integer[] NOT NULL,
  holder          text,
  enqueued_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
  alive_until     timestamptz NOT NULL,
  permit_id       uuid,
  permit_holder   text,
  acquired_at     timestamptz,
  expires_at      timestamptz,
  last_wait_ms    bigint,
  last_reason     text,
  last_name       text,
  last_key        text
);

-- The lines a waiter stands in: one per (throttle, key) it asks for.
CREATE TABLE {{schema}}.throttle_waiter_items (
  name    text NOT NULL,
  key     text NOT NULL,
  waiter  uuid NOT NULL REFERENCES {{schema}}.throttle_waiters (id) ON DELETE CASCADE,
  PRIMARY KEY (name, key, waiter)
);

CREATE INDEX throttle_waiter_items_waiter ON {{schema}}.throttle_waiter_items (waiter);

-- When each lane was last served: the lane served least recently goes first.
CREATE TABLE {{schema}}.throttle_lanes (
  lane       text PRIMARY KEY,
  served_at  timestamptz NOT NULL
);
