-- Kafka consumers park records they gave up on here (after N failed attempts, or
-- a record that cannot even be parsed), so the partition moves on and an operator
-- can inspect and replay them. One row per (consumer, record).
CREATE TABLE dead_letter (
    id            bigserial   PRIMARY KEY,
    consumer      text        NOT NULL,
    topic         text        NOT NULL,
    partition     integer     NOT NULL,
    record_offset bigint      NOT NULL,
    event_id      uuid,
    key           text,
    value         bytea       NOT NULL,
    error         text        NOT NULL,
    attempts      integer     NOT NULL,
    parked_at     timestamptz NOT NULL,
    replayed_at   timestamptz,
    CONSTRAINT dead_letter_once UNIQUE (consumer, topic, partition, record_offset)
);
CREATE INDEX dead_letter_event ON dead_letter (event_id);
