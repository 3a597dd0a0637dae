-- Appointments, third release: calendar feeds behind secret URLs
-- (reservo.appointments.calendar).
--
-- One link per owner (a patient, or a doctor's agenda): a new link replaces the
-- row, which revokes the previous URL. Only the SHA-256 of the URL's secret is
-- stored, so a copy of the database gives nobody a working feed URL; a request
-- is looked up by that hash.
CREATE TABLE IF NOT EXISTS calendar_link (
    owner_kind   text        NOT NULL CHECK (owner_kind IN ('patient', 'doctor')),
    owner_id     bigint      NOT NULL,
    token_sha256 bytea       NOT NULL CHECK (octet_length(token_sha256) = 32),
    created_at   timestamptz NOT NULL,
    PRIMARY KEY (owner_kind, owner_id),
    CONSTRAINT uq_calendar_link_token UNIQUE (token_sha256)
);
