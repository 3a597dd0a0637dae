-- Second release of the Delayed jobs API: lists of jobs, and recurring jobs.

-- 1. GET /api/jobs?status=&category= lists newest first (id DESC) with keyset
--    pagination: each filter has an index whose order is the list's order, so
--    a page is an index range scan from the cursor, never a sort of the set.
--    Two indexes, not three: with both filters the planner walks one of them
--    (usually status, which DEAD/FAILED make selective) and filters the other.
--    A third, composite (status, category, id) index would serve that case
--    exactly, but every job transition (load, claim, settle) is a non-HOT
--    update that inserts into every full index of this table: the hot path
--    pays per index, so the list pays a filter instead (docs/OPERATIONS.md).
--    IF NOT EXISTS: on a large table an operator builds them first with
--    CREATE INDEX CONCURRENTLY (a migration runs in a transaction, where a plain
--    build blocks writes to the table while it runs).
CREATE INDEX IF NOT EXISTS scheduled_job_status_id ON scheduled_job (status, id);
CREATE INDEX IF NOT EXISTS scheduled_job_category_id ON scheduled_job (category, id);

-- 2. A recurring job: a 5-field cron expression read in an IANA time zone.
--    next_at is the next occurrence no job was created for yet (the
--    materialiser's cursor; NULL once the expression has no occurrence left in
--    the accepted range). Deleting the row stops it.
CREATE TABLE recurring_job (
    id          bigserial   PRIMARY KEY,
    category    text        NOT NULL,
    cron        text        NOT NULL,
    timezone    text        NOT NULL,
    payload     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    urgency     smallint    NOT NULL CHECK (urgency BETWEEN 0 AND 9),
    next_at     timestamptz CONSTRAINT ck_recurring_next_at_range
                CHECK (next_at >= '2000-01-01 00:00:00+00' AND next_at < '2100-01-01 00:00:00+00'),
    created_at  timestamptz NOT NULL
);
-- The materialiser's scan: only recurring jobs whose next occurrence falls
-- within the window (work grows with what is due, not with what exists).
CREATE INDEX recurring_job_next_at ON recurring_job (next_at) WHERE next_at IS NOT NULL;

-- 3. The job of one occurrence. The unique key is what makes "one job per
--    occurrence" hold however many materialisers run at once (INSERT ... ON
--    CONFLICT DO NOTHING); partial, so ordinary jobs cost it nothing. It also
--    serves DELETE /api/recurring-jobs/{id} (cancel the pending occurrences).
--    No foreign key: the job outlives its recurring job (history, retention).
ALTER TABLE scheduled_job ADD COLUMN recurring_id bigint;
ALTER TABLE scheduled_job ADD COLUMN occurs_at timestamptz;
ALTER TABLE scheduled_job ADD CONSTRAINT ck_job_occurrence
    CHECK ((recurring_id IS NULL) = (occurs_at IS NULL)) NOT VALID;
ALTER TABLE scheduled_job VALIDATE CONSTRAINT ck_job_occurrence;
CREATE UNIQUE INDEX uq_job_occurrence ON scheduled_job (recurring_id, occurs_at)
    WHERE recurring_id IS NOT NULL;
