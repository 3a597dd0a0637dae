-- Booking rules and series (fourth release). Expand-only: every new column is
-- nullable or has a constant default (no table rewrite), so a 0.3.0 process
-- keeps inserting slots (notice 0, no daily limit: the rules it never heard of)
-- and booking them during a rolling upgrade.

-- A schedule's booking rules, copied onto each slot it generates (as its
-- price, 0054): min_notice_minutes, how long before its start a patient may
-- still book or reschedule into the slot (0: up to its start);
-- max_per_patient_day, how many live appointments (BOOKED or HELD) a patient
-- may hold with the doctor on one local day (NULL: no limit).
ALTER TABLE time_slot
    ADD COLUMN IF NOT EXISTS min_notice_minutes integer NOT NULL DEFAULT 0
        CONSTRAINT chk_slot_min_notice CHECK (min_notice_minutes >= 0),
    ADD COLUMN IF NOT EXISTS max_per_patient_day integer
        CONSTRAINT chk_slot_max_per_day CHECK (max_per_patient_day >= 1);
ALTER TABLE doctor_schedule
    ADD COLUMN IF NOT EXISTS min_notice_minutes integer NOT NULL DEFAULT 0
        CONSTRAINT chk_schedule_min_notice CHECK (min_notice_minutes >= 0),
    ADD COLUMN IF NOT EXISTS max_per_patient_day integer
        CONSTRAINT chk_schedule_max_per_day CHECK (max_per_patient_day >= 1);

-- The daily limit's lock: a booking into a slot with a limit locks the row of
-- (doctor, patient, local day) before it counts that day's live appointments,
-- so two bookings of one patient's day are counted one after the other (the
-- second sees the first committed). Nothing else is stored here: the count is
-- always read from the appointments themselves, so no cancel, expiry or
-- reschedule has a counter to keep right.
CREATE TABLE IF NOT EXISTS appointment_day_lock (
    doctor_id  bigint      NOT NULL,
    patient_id bigint      NOT NULL,
    day        date        NOT NULL,
    locked_at  timestamptz NOT NULL,
    PRIMARY KEY (doctor_id, patient_id, day)
);

-- A series: several slots booked for one patient at once, all or nothing, and
-- cancelled together (those not started). appointment.series_id is set on the
-- appointments the series booked (NULL for every other appointment).
CREATE TABLE IF NOT EXISTS appointment_series (
    id         bigserial   PRIMARY KEY,
    patient_id bigint      NOT NULL,
    created_at timestamptz NOT NULL
);
ALTER TABLE appointment ADD COLUMN IF NOT EXISTS series_id bigint;
CREATE INDEX IF NOT EXISTS appointment_series ON appointment (series_id)
    WHERE series_id IS NOT NULL;
