-- Prepaid appointments (the appointments note's HELD state): a schedule may ask
-- for payment before a seat is confirmed. Booking such a slot takes the seat at
-- once (booked_count counts it) as a HELD appointment with hold_expires_at; the
-- payment webhook turns it BOOKED, and past its expiry it becomes EXPIRED and
-- gives the seat back. Every flip is a conditional UPDATE on status = 'HELD', so
-- of a payment, an expiry and a cancel racing on one row exactly one wins, and
-- only the winner releases (or keeps) the seat.
--
-- All new columns are nullable without a default (no table rewrite). The two
-- per-patient constraints are rebuilt to cover HELD seats too (one index build
-- each; appointment is not partitioned): a patient holds no two seats in a slot,
-- nor two overlapping seats anywhere, whether paid yet or not, so confirming a
-- hold can never collide with another of the patient's appointments.

-- The price of a slot, copied from its schedule when generated (NULL: not
-- prepaid, booked at once as before), and how long a hold lasts.
ALTER TABLE time_slot
    ADD COLUMN IF NOT EXISTS prepaid_amount bigint,
    ADD COLUMN IF NOT EXISTS prepaid_currency text,
    ADD COLUMN IF NOT EXISTS hold_minutes integer,
    ADD CONSTRAINT chk_slot_prepaid CHECK (
        (prepaid_amount IS NULL AND prepaid_currency IS NULL AND hold_minutes IS NULL)
        OR (prepaid_amount > 0 AND prepaid_currency IS NOT NULL
            AND hold_minutes BETWEEN 1 AND 1440));

ALTER TABLE doctor_schedule
    ADD COLUMN IF NOT EXISTS prepaid_amount bigint,
    ADD COLUMN IF NOT EXISTS prepaid_currency text,
    ADD COLUMN IF NOT EXISTS hold_minutes integer,
    ADD CONSTRAINT chk_schedule_prepaid CHECK (
        (prepaid_amount IS NULL AND prepaid_currency IS NULL AND hold_minutes IS NULL)
        OR (prepaid_amount > 0 AND prepaid_currency IS NOT NULL
            AND hold_minutes BETWEEN 1 AND 1440));

-- An appointment's price is the slot's when it was booked (a later schedule
-- change never reprices a hold); overpaid_refund is the excess of the payment
-- that confirmed it (0: paid exactly; NULL: no payment confirmed it).
ALTER TABLE appointment
    ADD COLUMN IF NOT EXISTS hold_expires_at timestamptz,
    ADD COLUMN IF NOT EXISTS price_amount bigint,
    ADD COLUMN IF NOT EXISTS price_currency text,
    ADD COLUMN IF NOT EXISTS overpaid_refund bigint,
    ADD COLUMN IF NOT EXISTS settled_at timestamptz;
ALTER TABLE appointment
    DROP CONSTRAINT IF EXISTS appointment_status_check,
    ADD CONSTRAINT appointment_status_check
        CHECK (status IN ('HELD', 'BOOKED', 'CANCELLED', 'NO_SHOW', 'EXPIRED')),
    -- A hold always has an end; only a priced appointment is ever held.
    ADD CONSTRAINT chk_appointment_hold CHECK (
        status <> 'HELD' OR (hold_expires_at IS NOT NULL AND price_amount > 0)),
    ADD CONSTRAINT chk_appointment_overpaid CHECK (overpaid_refund >= 0);

DROP INDEX IF EXISTS uq_active_patient_slot;
CREATE UNIQUE INDEX uq_active_patient_slot ON appointment (slot_id, patient_id)
    WHERE status IN ('BOOKED', 'HELD');
ALTER TABLE appointment
    DROP CONSTRAINT IF EXISTS ex_patient_overlap,
    ADD CONSTRAINT ex_patient_overlap EXCLUDE USING gist (
        patient_id WITH =, period WITH &&, slot_id WITH <>
    ) WHERE (status IN ('BOOKED', 'HELD'));

-- The holds, by their end: the sweeper's batches and the expired holds of one
-- slot (the slot list counts them free before any job flipped them). Small:
-- only the rows HELD right now.
CREATE INDEX IF NOT EXISTS appointment_held_expiry ON appointment (hold_expires_at)
    WHERE status = 'HELD';
CREATE INDEX IF NOT EXISTS appointment_held_slot ON appointment (slot_id, hold_expires_at)
    WHERE status = 'HELD';

-- Payments of prepaid appointments, as rentals' payment table (0004, 0029,
-- 0051): one row per gateway transaction (PAYMENT), refunds executed by the
-- refund consumer as 'refund:<event id>' (REFUND), so a redelivered webhook or
-- refund event inserts nothing. What each payment settled is recorded with it.
CREATE TABLE IF NOT EXISTS appointment_payment (
    id              bigserial   PRIMARY KEY,
    appointment_id  bigint      NOT NULL REFERENCES appointment (id),
    provider_txn_id text        NOT NULL,
    type            text        NOT NULL CHECK (type IN ('PAYMENT', 'REFUND')),
    amount          bigint      NOT NULL CHECK (amount >= 0),
    amount_due      bigint      CHECK (amount_due >= 0),
    refund_due      bigint      CHECK (refund_due >= 0 AND refund_due <= amount),
    outcome         text        CHECK (outcome IN ('confirmed', 'overpaid', 'underpaid',
                                                   'not_payable')),
    gateway_ref     text,
    created_at      timestamptz NOT NULL,
    CONSTRAINT uq_appointment_payment_txn UNIQUE (provider_txn_id)
);
CREATE INDEX IF NOT EXISTS appointment_payment_appointment
    ON appointment_payment (appointment_id);
