-- Appointments, third release: staff overbooking and no-shows.

-- Staff overbooking: a slot takes up to overbook_limit seats beyond its capacity,
-- booked only by its doctor or an admin and counted apart, so the capacity
-- invariant of ordinary bookings is unchanged. One CHECK covers both counters,
-- the last line of defence as before (replaced in one ALTER: one table scan).
-- ADD COLUMN with a constant default rewrites nothing (PostgreSQL 11+).
ALTER TABLE time_slot
    ADD COLUMN IF NOT EXISTS overbook_limit integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS overbooked_count integer NOT NULL DEFAULT 0;
ALTER TABLE time_slot
    DROP CONSTRAINT IF EXISTS chk_booked,
    ADD CONSTRAINT chk_booked CHECK (booked_count BETWEEN 0 AND capacity
                                     AND overbooked_count BETWEEN 0 AND overbook_limit);

-- A repeating schedule generates its slots with the limit it was given.
ALTER TABLE doctor_schedule
    ADD COLUMN IF NOT EXISTS overbook_limit integer NOT NULL DEFAULT 0
        CONSTRAINT chk_schedule_overbook CHECK (overbook_limit >= 0);

-- Which counter an appointment's seat is in (a cancellation frees a seat of the
-- same kind), and the NO_SHOW status a doctor marks after the slot's start.
ALTER TABLE appointment
    ADD COLUMN IF NOT EXISTS overbooked boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS no_show_at timestamptz;
ALTER TABLE appointment
    DROP CONSTRAINT IF EXISTS appointment_status_check,
    ADD CONSTRAINT appointment_status_check
        CHECK (status IN ('BOOKED', 'CANCELLED', 'NO_SHOW'));

-- The no-show policy's state per patient, written only by a no-show (and by an
-- admin's clearing), read by the booking statement with one primary-key probe:
-- the hot path never counts no-shows. blocked_until NULL: not blocked;
-- cleared_at: no-show of slots starting by then no longer count.
CREATE TABLE IF NOT EXISTS patient_block (
    patient_id    bigint      PRIMARY KEY,
    blocked_until timestamptz,
    cleared_at    timestamptz
);
