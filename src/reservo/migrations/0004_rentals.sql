-- Car rentals: exclusive periods on a car, enforced by the database itself.
-- btree_gist (created by 0002) lets one GiST index combine = on bigint with && on ranges.
CREATE EXTENSION IF NOT EXISTS btree_gist;

CREATE TABLE car (
    id          bigserial   PRIMARY KEY,
    plate       text        NOT NULL,
    model       text        NOT NULL,
    city        text        NOT NULL,
    daily_price bigint      NOT NULL CHECK (daily_price > 0),
    host_id     bigint      NOT NULL,
    created_at  timestamptz NOT NULL,
    CONSTRAINT uq_car_plate UNIQUE (plate)
);
CREATE INDEX car_city ON car (city, daily_price, id);

CREATE TABLE booking (
    id              bigserial   PRIMARY KEY,
    car_id          bigint      NOT NULL REFERENCES car (id),
    customer_id     bigint      NOT NULL,
    -- [from, to + turnaround buffer): the buffer lives in the stored period, so
    -- every reader and the constraint see the same blocked time.
    period          tstzrange   NOT NULL,
    -- The `to` the customer asked for (the period's upper bound minus the buffer).
    return_at       timestamptz NOT NULL,
    status          text        NOT NULL CHECK (status IN
                        ('HOLD', 'CONFIRMED', 'ON_TRIP', 'COMPLETED', 'CANCELLED', 'EXPIRED')),
    deposit_amount  bigint      NOT NULL CHECK (deposit_amount >= 0),
    refund_amount   bigint      CHECK (refund_amount >= 0 AND refund_amount <= deposit_amount),
    hold_expires_at timestamptz,
    cancelled_by    text        CHECK (cancelled_by IN ('customer', 'host', 'admin')),
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    CONSTRAINT chk_booking_period CHECK (
        NOT isempty(period) AND lower_inc(period) AND NOT upper_inc(period)
        AND NOT lower_inf(period) AND NOT upper_inf(period)
        AND return_at > lower(period) AND return_at <= upper(period)
    ),
    CONSTRAINT chk_hold_expiry CHECK (status <> 'HOLD' OR hold_expires_at IS NOT NULL),
    -- Never two active bookings of one car whose periods overlap. An expired HOLD
    -- keeps blocking until its status flips (a predicate cannot use now()), so
    -- the booking path flips the stale ones it overlaps in the same transaction.
    CONSTRAINT ex_car_period EXCLUDE USING gist (car_id WITH =, period WITH &&)
        WHERE (status IN ('HOLD', 'CONFIRMED', 'ON_TRIP'))
);
-- The sweeper touches only holds, in expiry order.
CREATE INDEX booking_hold_expiry ON booking (hold_expires_at) WHERE status = 'HOLD';
CREATE INDEX booking_customer ON booking (customer_id);

CREATE TABLE payment (
    id              bigserial   PRIMARY KEY,
    booking_id      bigint      NOT NULL,
    -- The gateway's transaction id (DEPOSIT) or 'refund:<event id>' (REFUND):
    -- a webhook delivered twice or a refund event redelivered inserts nothing.
    provider_txn_id text        NOT NULL,
    type            text        NOT NULL CHECK (type IN ('DEPOSIT', 'REFUND')),
    amount          bigint      NOT NULL CHECK (amount >= 0),
    gateway_ref     text,
    created_at      timestamptz NOT NULL,
    CONSTRAINT uq_payment_provider_txn UNIQUE (provider_txn_id),
    CONSTRAINT fk_payment_booking FOREIGN KEY (booking_id) REFERENCES booking (id)
);
CREATE INDEX payment_booking ON payment (booking_id);
