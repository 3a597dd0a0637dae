-- Unique jobs and job dependencies (POST /api/jobs `uniqueKey` and `after`).
-- Expand-only: two columns with constant defaults (no table rewrite), a wider
-- status check, a partial unique index and a new table. Code that predates it
-- never writes the new values and never reads them.

-- 1. `unique_key`: at most one unfinished job per (category, unique_key). The
--    index covers the unfinished statuses only, so a key is free again once its
--    job is DONE, DEAD or CANCELLED; POST /api/jobs inserts with ON CONFLICT
--    against it, which is what makes concurrent posts of one key create one job.
--    `waiting_on`: how many of a WAITING job's parents are not DONE yet; the
--    completion of a parent counts it down, and at 0 the job is SCHEDULED.
ALTER TABLE scheduled_job
    ADD COLUMN IF NOT EXISTS unique_key text CHECK (length(unique_key) <= 200),
    ADD COLUMN IF NOT EXISTS waiting_on integer NOT NULL DEFAULT 0;

-- 2. WAITING: a job whose parents are not all DONE. Internal only (the API
--    shows it as SCHEDULED): every pending statement names the statuses it
--    takes (SCHEDULED, QUEUED, FAILED), so a WAITING job is never pushed to
--    Redis, never claimed, and never in the pending partial indexes. The wider
--    check is added NOT VALID and left so: it holds for every row written from
--    now on, and the check it replaces held for every row already there (a
--    subset of these statuses), so a validating scan, under this migration's
--    lock on the table, would prove nothing new.
ALTER TABLE scheduled_job DROP CONSTRAINT IF EXISTS scheduled_job_status_check;
ALTER TABLE scheduled_job DROP CONSTRAINT IF EXISTS scheduled_job_status_known;
ALTER TABLE scheduled_job ADD CONSTRAINT scheduled_job_status_known CHECK (status IN
    ('WAITING', 'SCHEDULED', 'QUEUED', 'RUNNING', 'DONE', 'FAILED', 'DEAD', 'CANCELLED'))
    NOT VALID;

CREATE UNIQUE INDEX IF NOT EXISTS uq_job_unique_key ON scheduled_job (category, unique_key)
    WHERE unique_key IS NOT NULL
      AND status IN ('WAITING', 'SCHEDULED', 'QUEUED', 'RUNNING', 'FAILED');

-- 3. Who waits for whom. A job names only jobs that exist when it is created,
--    and its own id is assigned then, so no job can ever (transitively) wait
--    for itself: the graph has no cycle by construction. Keyed by parent (a
--    completion finds its children), indexed by child (the console's page).
--    Retention deletes a finished parent's rows with it.
CREATE TABLE IF NOT EXISTS job_dependency (
    parent_id bigint NOT NULL REFERENCES scheduled_job (id) ON DELETE CASCADE,
    job_id    bigint NOT NULL REFERENCES scheduled_job (id) ON DELETE CASCADE,
    PRIMARY KEY (parent_id, job_id)
);
CREATE INDEX IF NOT EXISTS job_dependency_job ON job_dependency (job_id);
