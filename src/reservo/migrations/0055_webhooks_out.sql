-- Webhooks out: the endpoints subscribers register, the events they get (each
-- event's CloudEvents body kept once, as signed), and one delivery per
-- (endpoint, event). The attempts themselves are scheduler jobs (category
-- webhooks.deliver); a delivery row says where its retries stand.
CREATE TABLE webhook_endpoint (
    id              bigserial   PRIMARY KEY,
    url             text        NOT NULL,
    events          text[]      NOT NULL,
    description     text        NOT NULL DEFAULT '',
    status          text        NOT NULL DEFAULT 'ENABLED',
    -- The signing secret (whsec_...): the HMAC needs it in clear. The previous
    -- one keeps signing until previous_until (a rotation's grace).
    secret          text        NOT NULL,
    previous_secret text,
    previous_until  timestamptz,
    -- Since when every attempt failed (NULL: the last one succeeded): five
    -- days of it disable the endpoint.
    failing_since   timestamptz,
    created_at      timestamptz NOT NULL,
    CONSTRAINT ck_webhook_endpoint_status CHECK (status IN ('ENABLED', 'DISABLED'))
);
-- The fan-out looks the subscribers of a batch's event types up.
CREATE INDEX webhook_endpoint_events ON webhook_endpoint USING gin (events)
    WHERE status = 'ENABLED';

CREATE TABLE webhook_event (
    event_id   uuid        PRIMARY KEY,
    event_type text        NOT NULL,
    body       bytea       NOT NULL,  -- the CloudEvents JSON, byte for byte as signed
    created_at timestamptz NOT NULL
);

-- Retention walks the bodies oldest first.
CREATE INDEX webhook_event_created_at ON webhook_event (created_at);

CREATE TABLE webhook_delivery (
    id               bigserial   PRIMARY KEY,
    endpoint_id      bigint      NOT NULL REFERENCES webhook_endpoint (id) ON DELETE CASCADE,
    event_id         uuid        NOT NULL REFERENCES webhook_event (event_id),
    status           text        NOT NULL DEFAULT 'PENDING',
    attempts         integer     NOT NULL DEFAULT 0,
    -- Which scheduled attempt is the live one: a job carrying another turn (a
    -- retry a redelivery overtook) does nothing.
    turn             integer     NOT NULL DEFAULT 1,
    last_status_code integer,
    last_error       text,
    next_attempt_at  timestamptz,
    retry_until      timestamptz NOT NULL,
    delivered_at     timestamptz,
    created_at       timestamptz NOT NULL,
    CONSTRAINT webhook_delivery_once UNIQUE (endpoint_id, event_id),
    CONSTRAINT ck_webhook_delivery_status CHECK (status IN ('PENDING', 'DELIVERED', 'FAILED'))
);
CREATE INDEX webhook_delivery_by_endpoint ON webhook_delivery (endpoint_id, id DESC);
CREATE INDEX webhook_delivery_event ON webhook_delivery (event_id);
