-- The scheduler's hot path writes each job three times (load, claim, settle)
-- and logs one execution per attempt; at 10,000 jobs/s PostgreSQL's share of
-- that is what limits a drain. Two things cost index and trigger work on every
-- one of those writes without buying anything, and one index was too narrow:

-- 1. The idempotency key's unique index held an entry for every job, keyed or
--    not (a NULL key is never a conflict). Partial: only keyed jobs are in it.
ALTER TABLE scheduled_job DROP CONSTRAINT uq_job_idempotency;
CREATE UNIQUE INDEX uq_job_idempotency ON scheduled_job (category, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- 2. job_execution had a surrogate key beside its natural one, and a foreign
--    key whose check ran a trigger (a lookup and a row lock) per logged attempt.
--    Its rows are written only by the statements that settle their job (in the
--    same statement as the job's UPDATE), so the reference cannot dangle; and a
--    prune of old jobs deletes their executions with them (same job ids).
ALTER TABLE job_execution DROP CONSTRAINT job_execution_job_id_fkey;
ALTER TABLE job_execution DROP COLUMN id;
ALTER TABLE job_execution DROP CONSTRAINT uq_job_attempt;
-- An attempt is still settled once: its key refuses a second settlement.
ALTER TABLE job_execution ADD CONSTRAINT uq_job_attempt PRIMARY KEY (job_id, attempt);

-- 3. The loader's full resync pages by (run_at, id); with the index on run_at
--    alone, a page among many jobs due at the same instant (a midnight batch, a
--    due backlog) re-read and sorted every one of them, per page.
DROP INDEX scheduled_job_pending;
CREATE INDEX scheduled_job_pending ON scheduled_job (run_at, id)
    WHERE status IN ('SCHEDULED', 'QUEUED', 'FAILED');
