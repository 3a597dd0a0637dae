-- Platform tables shared by every module.

-- Idempotency-Key store. A row is claimed (IN_PROGRESS, with a lease) before the
-- work starts and completed (DONE, with the response) inside the business
-- transaction, so "something was created" and "the response is stored" commit
-- together.
CREATE TABLE idempotency_key (
    caller          text        NOT NULL,
    endpoint        text        NOT NULL,
    key             text        NOT NULL,
    request_hash    bytea       NOT NULL,
    status          text        NOT NULL CHECK (status IN ('IN_PROGRESS', 'DONE')),
    locked_until    timestamptz,
    response_status integer,
    response_body   json,   -- json, not jsonb: replays keep the original key order
    created_at      timestamptz NOT NULL,
    CONSTRAINT idempotency_key_pkey PRIMARY KEY (caller, endpoint, key)
);
CREATE INDEX idempotency_key_created_at ON idempotency_key (created_at);

-- Transactional outbox: written in the business transaction, relayed afterwards.
CREATE TABLE outbox (
    id           bigserial   PRIMARY KEY,
    event_id     uuid        NOT NULL UNIQUE,
    topic        text        NOT NULL,
    key          text,
    payload      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL,
    status       text        NOT NULL DEFAULT 'PENDING'
                             CHECK (status IN ('PENDING', 'DONE', 'DEAD')),
    attempts     integer     NOT NULL DEFAULT 0,
    available_at timestamptz NOT NULL,
    locked_until timestamptz,
    last_error   text,
    published_at timestamptz
);
-- The relay only ever looks at pending rows; this index stays as small as the backlog.
CREATE INDEX outbox_pending ON outbox (id) WHERE status = 'PENDING';
CREATE INDEX outbox_dead ON outbox (id) WHERE status = 'DEAD';

-- Consumer inbox: one row per (consumer, event) that has been applied.
CREATE TABLE inbox (
    consumer     text        NOT NULL,
    event_id     uuid        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

-- Notifications: the notification consumer's own inbox and delivery log.
CREATE TABLE notification (
    id           bigserial   PRIMARY KEY,
    event_id     uuid        NOT NULL,
    topic        text        NOT NULL,
    recipient    bigint      NOT NULL,
    channel      text        NOT NULL,
    subject      text        NOT NULL,
    body         text        NOT NULL,
    status       text        NOT NULL DEFAULT 'PENDING' CHECK (status IN ('PENDING', 'SENT')),
    attempts     integer     NOT NULL DEFAULT 0,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    sent_at      timestamptz,
    CONSTRAINT notification_once UNIQUE (event_id, recipient)
);
