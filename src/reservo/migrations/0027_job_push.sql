-- POST /api/jobs (scheduler/batch.py) hands the jobs of a batch to Redis right
-- after its commit. Until now each pushed job was then marked in a second
-- transaction (`mark_pushed`: pushed = true, SCHEDULED -> QUEUED), a non-HOT
-- update (status and pushed are in index predicates) that wrote every job
-- twice, four more index entries and one more commit flush per batch: the
-- most frequent statement of the enqueue path.
--
-- Instead the batch inserts those jobs already QUEUED and pushed, and in the
-- same statement writes ONE row here naming them: "these jobs are being
-- handed to Redis". The row goes once the push is done (the next batch of the
-- process deletes it in its own insert statement, no transaction of its own).
-- A row still here after `push_grace_s` means the process died, or Redis
-- failed, between the commit and the push: the loader pushes its jobs (loading
-- is idempotent) and deletes it. So a committed job is still never lost, and
-- the hot path writes each job once, with one index entry fewer (it is never
-- in scheduled_job_unpushed).
CREATE TABLE job_push (
    id         bigserial   PRIMARY KEY,
    job_ids    bigint[]    NOT NULL,
    created_at timestamptz NOT NULL
);
-- The loader's scan of rows older than the grace; rows live for milliseconds,
-- so the table stays a few pages (autovacuum keeps up with its deletes).
CREATE INDEX job_push_created_at ON job_push (created_at);
