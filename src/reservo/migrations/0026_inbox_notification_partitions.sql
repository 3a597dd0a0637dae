-- The inbox and the notification table, partitioned by day (UTC) of the
-- event's own creation time, so that retention drops a whole day of them (as
-- 0025 does for the outbox) instead of deleting it 5,000 rows at a time.
--
-- Both are deduplication tables: their unique keys refuse a second application
-- of an event. A partitioned table only enforces a key that contains the
-- partition key, so the partition key must be a time that is the SAME on every
-- delivery of an event: `event_created_at`, the outbox row's created_at, which
-- the relay hands over with the event and the Kafka envelope carries ("time").
-- An event id has one outbox row, so one creation time: (consumer, event_id,
-- event_created_at) refuses exactly what (consumer, event_id) refused, and
-- notification_once (event_id, recipient, event_created_at) what
-- (event_id, recipient) refused. docs/SCALING.md, "History tables".
--
-- Existing rows: their event's creation time is read from the outbox when the
-- event is still there (every event the relay can still deliver: pending, or
-- published within the outbox's retention). Otherwise it is unknown, and the
-- row's own time stands in (processed_at, created_at): a redelivery of such an
-- event (a Kafka consumer lagging more than the outbox's retention, or a
-- derived per-bet notification id) would not meet that row.

-- 1. The inbox.
ALTER TABLE inbox RENAME TO inbox_before_0026;
ALTER TABLE inbox_before_0026 RENAME CONSTRAINT inbox_pkey TO inbox_before_0026_pkey;
ALTER INDEX inbox_processed_at RENAME TO inbox_before_0026_processed_at;

CREATE TABLE inbox (
    consumer         text        NOT NULL,
    event_id         uuid        NOT NULL,
    processed_at     timestamptz NOT NULL DEFAULT now(),
    -- The event's creation time as its producer stamped it (Event.created_at).
    event_created_at timestamptz NOT NULL,
    CONSTRAINT inbox_pkey PRIMARY KEY (consumer, event_id, event_created_at)
) PARTITION BY RANGE (event_created_at);
CREATE TABLE inbox_default PARTITION OF inbox DEFAULT;
-- The drop's check (a row of the day applied within retention) and the batch
-- pruner's walk of what drops leave.
CREATE INDEX inbox_processed_at ON inbox (processed_at);

SELECT history_partition_add('inbox', (now() AT TIME ZONE 'UTC')::date + d)
  FROM generate_series(0, 7) AS d;

-- A plain join (an event id has one outbox row: emit mints a random one per
-- row), so the planner may hash the outbox once instead of probing each of its
-- partitions per row.
INSERT INTO inbox (consumer, event_id, processed_at, event_created_at)
SELECT i.consumer, i.event_id, i.processed_at, coalesce(o.created_at, i.processed_at)
  FROM inbox_before_0026 i
  LEFT JOIN outbox o ON o.event_id = i.event_id;

DROP TABLE inbox_before_0026;
ANALYZE inbox;

-- 2. The notification table. Same columns (and the id sequence), plus
--    event_created_at; the primary key becomes (id, event_created_at) (ids still
--    come from one sequence).
ALTER TABLE notification RENAME TO notification_before_0026;
ALTER TABLE notification_before_0026
    RENAME CONSTRAINT notification_pkey TO notification_before_0026_pkey;
ALTER TABLE notification_before_0026
    RENAME CONSTRAINT notification_once TO notification_before_0026_once;
ALTER INDEX notification_created_at RENAME TO notification_before_0026_created_at;

CREATE TABLE notification (
    LIKE notification_before_0026 INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    -- The creation time of the event the message came from (Event.created_at).
    event_created_at timestamptz NOT NULL,
    CONSTRAINT notification_pkey PRIMARY KEY (id, event_created_at),
    CONSTRAINT notification_once UNIQUE (event_id, recipient, event_created_at)
) PARTITION BY RANGE (event_created_at);
ALTER SEQUENCE notification_id_seq OWNED BY notification.id;
CREATE TABLE notification_default PARTITION OF notification DEFAULT;
-- As 0014: by creation time, not on status/sent_at, so marking a row SENT
-- stays a HOT update.
CREATE INDEX notification_created_at ON notification (created_at);

SELECT history_partition_add('notification', (now() AT TIME ZONE 'UTC')::date + d)
  FROM generate_series(0, 7) AS d;

INSERT INTO notification
SELECT n.*, coalesce(o.created_at, n.created_at)
  FROM notification_before_0026 n
  LEFT JOIN outbox o ON o.event_id = n.event_id;

DROP TABLE notification_before_0026;
ANALYZE notification;
