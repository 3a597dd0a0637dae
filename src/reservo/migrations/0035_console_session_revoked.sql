-- Console sessions signed out before their expiry (reservo.console.web). The
-- session cookie is signed, not stored, so signing out alone only deleted it in
-- that browser: a copy of it stayed valid until its exp. Signing out now writes
-- the session's id here, and every console request looks it up (primary key).
-- PostgreSQL, not Redis: a revocation must hold when Redis is away (Redis fails
-- open in reservo), and every console page reads PostgreSQL anyway.
--
-- A row is needed only until the session's own expiry (the cookie is refused
-- after it regardless); each sign-out deletes the expired rows, so the table
-- holds at most the sessions signed out in the last RESERVO_CONSOLE_SESSION_S.
CREATE TABLE console_session_revoked (
    session_id text        PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
-- The sign-out's delete of the expired rows.
CREATE INDEX console_session_revoked_expires_at ON console_session_revoked (expires_at);
