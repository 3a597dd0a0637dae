-- Delayed jobs: PostgreSQL is the truth; Redis only holds the next window.
CREATE TABLE scheduled_job (
    id              bigserial   PRIMARY KEY,
    category        text        NOT NULL,
    urgency         smallint    NOT NULL CHECK (urgency BETWEEN 0 AND 9),
    run_at          timestamptz NOT NULL,
    payload         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    status          text        NOT NULL DEFAULT 'SCHEDULED' CHECK (status IN
                    ('SCHEDULED', 'QUEUED', 'RUNNING', 'DONE', 'FAILED', 'DEAD', 'CANCELLED')),
    attempts        integer     NOT NULL DEFAULT 0,
    max_attempts    integer     NOT NULL CHECK (max_attempts > 0),
    -- Optimistic version: every transition bumps it, and RUNNING -> DONE/FAILED
    -- only succeeds with the revision the claim returned.
    revision        integer     NOT NULL DEFAULT 0,
    -- False until this run_at has been handed to Redis (the loader's work list).
    pushed          boolean     NOT NULL DEFAULT false,
    idempotency_key text,
    worker          text,
    heartbeat_at    timestamptz,
    started_at      timestamptz,
    finished_at     timestamptz,
    last_error      text,
    created_at      timestamptz NOT NULL,
    CONSTRAINT uq_job_idempotency UNIQUE (category, idempotency_key)
);

-- The loader's incremental scan: pending rows not yet handed to Redis.
CREATE INDEX scheduled_job_unpushed ON scheduled_job (run_at)
    WHERE NOT pushed AND status IN ('SCHEDULED', 'QUEUED', 'FAILED');
-- The loader's full resync (after a Redis flush/restart) and the reaper.
CREATE INDEX scheduled_job_pending ON scheduled_job (run_at)
    WHERE status IN ('SCHEDULED', 'QUEUED', 'FAILED');
CREATE INDEX scheduled_job_running ON scheduled_job (heartbeat_at) WHERE status = 'RUNNING';

-- One row per attempt (DONE, FAILED, DEAD or LOST when its worker died).
CREATE TABLE job_execution (
    id          bigserial   PRIMARY KEY,
    job_id      bigint      NOT NULL REFERENCES scheduled_job (id) ON DELETE CASCADE,
    attempt     integer     NOT NULL,
    worker      text,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    outcome     text        NOT NULL CHECK (outcome IN ('DONE', 'FAILED', 'DEAD', 'LOST')),
    error       text,
    -- An attempt is settled once: a second settlement of it is refused.
    CONSTRAINT uq_job_attempt UNIQUE (job_id, attempt)
);

-- Appointment reminders (24 h before the slot) are scheduler jobs.
ALTER TABLE appointment ADD COLUMN reminder_job_id bigint;
ALTER TABLE appointment ADD COLUMN reminder_sent_at timestamptz;
