-- Betting: matches with odds, bets with 1-20 selections, set-based settlement.

-- The exact product of numerics (no floating point): payout = floor(stake * product(odds)).
CREATE AGGREGATE betting_product(numeric) (sfunc = numeric_mul, stype = numeric, initcond = '1');

CREATE TABLE betting_match (
    id                bigserial   PRIMARY KEY,
    external_id       text        NOT NULL,
    home              text        NOT NULL,
    away              text        NOT NULL,
    starts_at         timestamptz NOT NULL,
    odds              jsonb       NOT NULL,
    -- The result, once (the first providerEventId that reached settlement wins).
    result_status     text        CHECK (result_status IN ('FINISHED', 'CANCELLED')),
    home_score        integer,
    away_score        integer,
    result_event_id   text,
    result_at         timestamptz,
    -- OPEN (no result) -> SETTLING (chunks running) -> SETTLED.
    settlement_status text        NOT NULL DEFAULT 'OPEN'
                                  CHECK (settlement_status IN ('OPEN', 'SETTLING', 'SETTLED')),
    settled_bets      bigint      NOT NULL DEFAULT 0,
    settled_at        timestamptz,
    created_at        timestamptz NOT NULL,
    CONSTRAINT betting_match_external_id UNIQUE (external_id)
);
-- The sweeper resumes settlements a crashed worker left half done.
CREATE INDEX betting_match_settling ON betting_match (id) WHERE settlement_status = 'SETTLING';

CREATE TABLE betting_bet (
    id               bigserial   PRIMARY KEY,
    account_id       bigint      NOT NULL,
    owner_id         bigint      NOT NULL,
    currency         text        NOT NULL,
    stake            bigint      NOT NULL CHECK (stake > 0),
    legs             smallint    NOT NULL DEFAULT 1 CHECK (legs BETWEEN 1 AND 20),
    potential_payout bigint      NOT NULL,
    status           text        NOT NULL DEFAULT 'PENDING'
                                 CHECK (status IN ('PENDING', 'WON', 'LOST', 'VOID')),
    payout           bigint,
    created_at       timestamptz NOT NULL,
    settled_at       timestamptz
) WITH (fillfactor = 90);  -- room on the page: settling a bet is a HOT update

-- One row per leg. The primary key makes the legs of a bet distinct matches.
CREATE TABLE betting_selection (
    bet_id   bigint        NOT NULL REFERENCES betting_bet (id),
    match_id bigint        NOT NULL REFERENCES betting_match (id),
    market   text          NOT NULL CHECK (market IN ('1X2', 'TOTALS_2_5', 'BTTS')),
    pick     text          NOT NULL,
    odds     numeric(10,2) NOT NULL CHECK (odds >= 1.01),
    status   text          NOT NULL DEFAULT 'PENDING'
                           CHECK (status IN ('PENDING', 'WON', 'LOST', 'VOID')),
    CONSTRAINT betting_selection_pkey PRIMARY KEY (bet_id, match_id)
);
-- Settlement reads only the pending legs of one match: the index holds only
-- pending legs, so its cost follows the settled match, not the whole backlog.
CREATE INDEX betting_selection_pending ON betting_selection (match_id, bet_id)
    WHERE status = 'PENDING';

-- The settlement consumer's inbox: a providerEventId is applied once, whichever
-- path (Kafka or the PostgreSQL fallback) delivered it.
CREATE TABLE betting_result_inbox (
    provider_event_id text        PRIMARY KEY,
    match_external_id text        NOT NULL,
    outcome           text        NOT NULL,  -- APPLIED | DUPLICATE_MATCH | UNKNOWN_MATCH
    received_at       timestamptz NOT NULL
);

-- Results the webhook could not hand to Kafka (not configured, down, breaker open).
CREATE TABLE webhook_events_fallback (
    id                uuid        PRIMARY KEY,
    provider_event_id text        NOT NULL,
    payload           jsonb       NOT NULL,
    created_at        timestamptz NOT NULL,
    status            text        NOT NULL DEFAULT 'PENDING'
                                  CHECK (status IN ('PENDING', 'RESENT', 'FAILED')),
    attempts          integer     NOT NULL DEFAULT 0,
    last_error        text,
    resent_at         timestamptz
);
CREATE INDEX webhook_events_fallback_pending ON webhook_events_fallback (created_at)
    WHERE status = 'PENDING';

-- Signed but malformed webhook bodies, kept for investigation.
CREATE TABLE webhook_events_rejected (
    id          bigserial   PRIMARY KEY,
    source      text        NOT NULL,
    body        text        NOT NULL,
    error       text        NOT NULL,
    received_at timestamptz NOT NULL
);
