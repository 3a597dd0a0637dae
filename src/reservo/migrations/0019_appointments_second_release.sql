-- Appointments, second release: a patient's list, reschedule, waitlists, repeating
-- schedules, and the contact data notifications are sent to.
--
-- Plain CREATE INDEX, as in 0014: on a deployment whose appointment table is
-- already large, create the same index first with CREATE INDEX CONCURRENTLY (same
-- name and definition, outside a transaction); IF NOT EXISTS then skips it here.

-- A patient's appointments, soonest first: keyset on (start, id). Not on status:
-- the status filter reads this index (a patient holds few appointments), and
-- one index less on the hottest insert.
CREATE INDEX IF NOT EXISTS appointment_patient_start
    ON appointment (patient_id, lower(period), id);

-- The appointment a reschedule replaced (the old one is CANCELLED in the same
-- transaction as the new one is BOOKED).
ALTER TABLE appointment ADD COLUMN IF NOT EXISTS rescheduled_from bigint
    REFERENCES appointment (id);

-- Patients waiting for a seat of a full slot, first come first served (id order).
-- A freed seat goes to the first one still free at that time, in the transaction
-- that frees it; the entry is deleted then (booked or skipped).
CREATE TABLE IF NOT EXISTS waitlist_entry (
    id         bigserial   PRIMARY KEY,
    slot_id    bigint      NOT NULL REFERENCES time_slot (id),
    patient_id bigint      NOT NULL,
    created_at timestamptz NOT NULL,
    CONSTRAINT uq_waitlist_slot_patient UNIQUE (slot_id, patient_id)
);
CREATE INDEX IF NOT EXISTS waitlist_entry_slot_order ON waitlist_entry (slot_id, id);

-- A schedule without an end date. The "appointments" worker role expands it up to
-- today + the horizon, day after day; generated_until is the last local date done
-- (a conditional UPDATE on it is how one worker of many claims the next days).
CREATE TABLE IF NOT EXISTS doctor_schedule (
    id              bigserial   PRIMARY KEY,
    doctor_id       bigint      NOT NULL REFERENCES doctor (id),
    first_day       date        NOT NULL,
    weekdays        integer[]   NOT NULL,
    start_time      time        NOT NULL,
    end_time        time        NOT NULL,
    slot_minutes    integer     NOT NULL CHECK (slot_minutes BETWEEN 5 AND 720),
    capacity        integer     NOT NULL CHECK (capacity > 0),
    generated_until date        NOT NULL,
    created_at      timestamptz NOT NULL,
    CONSTRAINT chk_schedule_hours CHECK (end_time > start_time),
    CONSTRAINT chk_schedule_weekdays CHECK (weekdays <@ ARRAY[1, 2, 3, 4, 5, 6, 7]
                                            AND cardinality(weekdays) BETWEEN 1 AND 7)
);
CREATE INDEX IF NOT EXISTS doctor_schedule_generated ON doctor_schedule (generated_until);

-- Where a user's notifications go (user ids are global: a patient's contact is
-- also used for any other notification of that user). Without a row, the
-- configured channel's default applies (RESERVO_NOTIFY_EMAIL_TEMPLATE, or the
-- user id for the HTTP/SMS channel).
CREATE TABLE IF NOT EXISTS contact (
    user_id    bigint      PRIMARY KEY,
    email      text,
    phone      text,
    updated_at timestamptz NOT NULL,
    CONSTRAINT chk_contact_email CHECK (
        email IS NULL OR (length(email) <= 254 AND email ~ '^[^@[:space:]]+@[^@[:space:]]+$')),
    CONSTRAINT chk_contact_phone CHECK (phone IS NULL OR phone ~ '^\+[1-9][0-9]{6,14}$')
);
