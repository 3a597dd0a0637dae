-- Clinic appointments: pre-created slot rows with a capacity.
CREATE EXTENSION IF NOT EXISTS btree_gist;

CREATE TABLE doctor (
    id         bigserial   PRIMARY KEY,
    name       text        NOT NULL,
    timezone   text        NOT NULL,
    specialty  text,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE time_slot (
    id           bigserial   PRIMARY KEY,
    doctor_id    bigint      NOT NULL REFERENCES doctor (id),
    start_at     timestamptz NOT NULL,
    end_at       timestamptz NOT NULL,
    capacity     integer     NOT NULL CHECK (capacity > 0),
    booked_count integer     NOT NULL DEFAULT 0,
    -- The last line of defence: even a buggy code path cannot overbook.
    CONSTRAINT chk_booked CHECK (booked_count BETWEEN 0 AND capacity),
    CONSTRAINT chk_slot_period CHECK (end_at > start_at),
    -- Re-running a schedule never creates a slot twice.
    CONSTRAINT uq_doctor_start UNIQUE (doctor_id, start_at)
);

CREATE TABLE appointment (
    id           bigserial   PRIMARY KEY,
    slot_id      bigint      NOT NULL REFERENCES time_slot (id),
    patient_id   bigint      NOT NULL,
    status       text        NOT NULL CHECK (status IN ('BOOKED', 'CANCELLED')),
    -- A copy of the slot's [start, end) so the database can refuse overlaps.
    period       tstzrange   NOT NULL,
    created_at   timestamptz NOT NULL,
    cancelled_at timestamptz,
    -- One patient never holds two overlapping BOOKED appointments, with any
    -- doctor. The same slot is left to uq_active_patient_slot (slot_id <>), so
    -- each case has its own error code.
    CONSTRAINT ex_patient_overlap EXCLUDE USING gist (
        patient_id WITH =, period WITH &&, slot_id WITH <>
    ) WHERE (status = 'BOOKED')
);

-- At most one BOOKED appointment per patient and slot; cancelled ones do not count.
CREATE UNIQUE INDEX uq_active_patient_slot ON appointment (slot_id, patient_id)
    WHERE status = 'BOOKED';
CREATE INDEX appointment_slot ON appointment (slot_id);
