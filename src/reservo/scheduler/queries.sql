-- Named queries of the scheduler module.

-- name: insert_job
-- A repeated idempotency key inserts nothing; the caller then reads the first job.
INSERT INTO scheduled_job (category, urgency, run_at, payload, status, max_attempts,
                           idempotency_key, created_at)
VALUES ($1, $2, $3, $4, 'SCHEDULED', $5, $6, $7)
ON CONFLICT (category, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING *;

-- name: insert_jobs
-- A batch of POST /api/jobs (scheduler/batch.py) in one statement: ids follow
-- the order given, and the rows come back in it. The jobs the batch pushes
-- after its commit ($7 true: due within the window) are written QUEUED and
-- pushed at once, with ONE job_push row naming them (migration 0027): the
-- loader pushes that row's jobs if it is still there after the grace (the
-- process died between commit and push). $8: the job_push rows of pushes this
-- process finished, deleted here instead of in a transaction of their own.
-- Each job is written once: no mark_pushed rewriting it after the push.
--
-- $9: each job's unique key (NULL: none; unique within the batch, the caller
-- answers a repeat in the batch with the first). A key an unfinished job holds
-- already (index uq_job_unique_key) inserts nothing: the holder's row comes
-- back instead, `created` false (the no-op DO UPDATE is what returns it, and
-- it waits for a holder still being written by another transaction, then
-- inserts if that one finished meanwhile).
-- $10/$11: the pairs (ordinal of the job in the batch, parent id) of `after`.
-- The parents are locked FOR SHARE and their latest status read: a parent's
-- completion either committed before (it is DONE here and not counted) or waits
-- for this commit and then sees the edges (release_dependents). A job with a
-- parent not DONE is WAITING on that many; one with a DEAD or CANCELLED parent
-- is CANCELLED at once (dependency_failed). Unknown parents were refused before.
WITH parents AS MATERIALIZED (
    SELECT id, status FROM scheduled_job
     WHERE id = ANY($11::bigint[])
     ORDER BY id
       FOR SHARE
), deps AS MATERIALIZED (
    SELECT DISTINCT d.ord, d.parent_id, p.status
      FROM unnest($10::bigint[], $11::bigint[]) AS d(ord, parent_id)
      JOIN parents p ON p.id = d.parent_id
), blocked AS MATERIALIZED (
    SELECT ord, count(*) FILTER (WHERE status <> 'DONE') AS waiting,
           bool_or(status IN ('DEAD', 'CANCELLED')) AS failed
      FROM deps GROUP BY ord
), items AS MATERIALIZED (
    SELECT nextval('scheduled_job_id_seq') AS id, t.*,
           coalesce(b.waiting, 0)::int AS waiting, coalesce(b.failed, false) AS failed
      FROM unnest($1::text[], $2::smallint[], $3::timestamptz[], $4::jsonb[], $7::boolean[],
                  $9::text[])
           WITH ORDINALITY AS t(category, urgency, run_at, payload, push, unique_key, ord)
      LEFT JOIN blocked b ON b.ord = t.ord
     ORDER BY t.ord
), ins AS (
    INSERT INTO scheduled_job (id, category, urgency, run_at, payload, status, pushed,
                               max_attempts, created_at, unique_key, waiting_on,
                               finished_at, last_error)
    SELECT id, category, urgency, run_at, payload,
           CASE WHEN failed THEN 'CANCELLED' WHEN waiting > 0 THEN 'WAITING'
                WHEN push THEN 'QUEUED' ELSE 'SCHEDULED' END,
           push AND NOT failed AND waiting = 0, $5, $6, unique_key,
           CASE WHEN failed THEN 0 ELSE waiting END,
           CASE WHEN failed THEN $6::timestamptz END,
           CASE WHEN failed THEN 'dependency_failed' END
      FROM items ORDER BY ord
        ON CONFLICT (category, unique_key)
           WHERE unique_key IS NOT NULL
             AND status IN ('WAITING', 'SCHEDULED', 'QUEUED', 'RUNNING', 'FAILED')
        DO UPDATE SET unique_key = EXCLUDED.unique_key
    RETURNING *
), made AS (
    -- Each row with its item: by id for a job created here, by key for the
    -- holder of a key (two equi-joins: hash joins, where one join on an OR
    -- would compare every pair of the batch).
    SELECT ins.*, i.ord, true AS created FROM ins JOIN items i ON i.id = ins.id
    UNION ALL
    SELECT ins.*, i.ord, false FROM ins JOIN items i
        ON i.category = ins.category AND i.unique_key = ins.unique_key AND i.id <> ins.id
), edges AS (
    INSERT INTO job_dependency (parent_id, job_id)
    SELECT d.parent_id, m.id FROM deps d JOIN made m ON m.ord = d.ord AND m.created
), mark AS (
    INSERT INTO job_push (job_ids, created_at)
    SELECT array_agg(id ORDER BY id), $6 FROM made WHERE created AND pushed
    HAVING count(*) > 0
    RETURNING id
), gone AS (
    DELETE FROM job_push WHERE id = ANY($8::bigint[])
)
SELECT made.*, (SELECT id FROM mark) AS push_id FROM made ORDER BY made.ord;

-- name: existing_jobs
-- Which of these ids are jobs (POST /api/jobs `after`: 422 unknown_dependency
-- for the others).
SELECT id FROM scheduled_job WHERE id = ANY($1::bigint[]);

-- name: release_dependents
-- In the transaction that made the jobs $1 DONE, after that statement (so its
-- snapshot sees every edge committed by a child that locked one of them before
-- the completion did): each WAITING child counts down by its parents among
-- them, and at 0 it is SCHEDULED, due now or at its own run_at if later, not
-- pushed yet (the executor hands the returned rows to Redis, the loader
-- otherwise). Children locked in id order, as in complete: two completions
-- releasing the same children never deadlock, and each decrement applies to
-- the row as the other left it.
WITH counts AS (
    SELECT job_id, count(*) AS n FROM job_dependency
     WHERE parent_id = ANY($1::bigint[]) GROUP BY job_id
), locked AS MATERIALIZED (
    SELECT id FROM scheduled_job
     WHERE id = ANY(ARRAY(SELECT job_id FROM counts)) ORDER BY id FOR UPDATE
)
UPDATE scheduled_job j
   SET waiting_on = GREATEST(j.waiting_on - c.n, 0),
       status = CASE WHEN j.waiting_on - c.n <= 0 THEN 'SCHEDULED' ELSE 'WAITING' END,
       run_at = CASE WHEN j.waiting_on - c.n <= 0 THEN GREATEST(j.run_at, $2) ELSE j.run_at END,
       revision = j.revision + 1, pushed = false
  FROM counts c
 WHERE j.id = ANY(ARRAY(SELECT id FROM locked)) AND j.id = c.job_id AND j.status = 'WAITING'
RETURNING j.id, j.category, j.urgency, j.run_at, j.revision, j.status;

-- name: cancel_dependents
-- In the transaction that ended the jobs $1 DEAD or CANCELLED, after that
-- statement (same reason as release_dependents): every job waiting on them,
-- directly or through other waiting jobs, is CANCELLED with dependency_failed.
-- A child of a job not DONE is WAITING itself, so the walk stops at finished
-- rows; the graph has no cycle (migration 0058).
WITH RECURSIVE down AS (
    SELECT d.job_id FROM job_dependency d
      JOIN scheduled_job p ON p.id = d.parent_id
     WHERE d.parent_id = ANY($1::bigint[]) AND p.status IN ('DEAD', 'CANCELLED')
    UNION
    SELECT d.job_id FROM job_dependency d JOIN down ON d.parent_id = down.job_id
), locked AS MATERIALIZED (
    SELECT id FROM scheduled_job
     WHERE id = ANY(ARRAY(SELECT job_id FROM down)) ORDER BY id FOR UPDATE
)
UPDATE scheduled_job j
   SET status = 'CANCELLED', revision = j.revision + 1, finished_at = $2, waiting_on = 0,
       last_error = 'dependency_failed'
 WHERE j.id = ANY(ARRAY(SELECT id FROM locked)) AND j.status = 'WAITING'
RETURNING j.id;

-- name: dependencies_of
-- The console's page of a job: its unique key, the jobs it waits for and the
-- jobs that wait for it, with their statuses.
SELECT 'parent' AS side, p.id, p.category, p.status
  FROM job_dependency d JOIN scheduled_job p ON p.id = d.parent_id
 WHERE d.job_id = $1
UNION ALL
SELECT 'child', c.id, c.category, c.status
  FROM job_dependency d JOIN scheduled_job c ON c.id = d.job_id
 WHERE d.parent_id = $1
 ORDER BY 1, 2
 LIMIT $2;

-- name: unique_key_of
-- The unique key a job was created with (the console shows it beside its dependencies).
SELECT unique_key FROM scheduled_job WHERE id = $1;

-- name: insert_jobs_bulk
-- Bulk load path (benchmarks, imports): no idempotency keys.
INSERT INTO scheduled_job (category, urgency, run_at, payload, status, max_attempts, created_at)
SELECT $1, u, r, p, 'SCHEDULED', $5, $6
  FROM unnest($2::smallint[], $3::timestamptz[], $4::jsonb[]) AS t(u, r, p);

-- name: job_by_key
-- The job an idempotency key created first.
SELECT * FROM scheduled_job WHERE category = $1 AND idempotency_key = $2;

-- name: get_job
-- One job by id.
SELECT * FROM scheduled_job WHERE id = $1;

-- name: drop_new_jobs
-- Jobs a POST /api/jobs batch inserted in its own transaction but must not keep
-- (their Idempotency-Key was written by another transaction meanwhile: that
-- one's job is the answer).
DELETE FROM scheduled_job WHERE id = ANY($1::bigint[]);

-- name: status_of
-- Where a batch of jobs stands (why an executor could not claim them), and
-- whether their category is paused (they then wait in Redis's due queue).
SELECT j.id, j.status, j.run_at, j.category, j.urgency, coalesce(c.paused, false) AS paused
  FROM scheduled_job j LEFT JOIN job_category c ON c.category = j.category
 WHERE j.id = ANY($1::bigint[]);

-- name: mark_pushed
-- Only rows still pending with the run_at that was pushed; a claimed or
-- retried row is left alone. SKIP LOCKED: a row locked right now is being
-- claimed (or marked by another loader), so this never waits and never takes
-- part in a deadlock; a row it skipped is at worst pushed again (a no-op).
--
-- Shape shared by the batch statements below: lock by primary key only (id =
-- ANY(...), in id order), test the locked rows' columns in memory, update
-- `id = ANY(ARRAY(...))`. A status or run_at test in the locking scan matches
-- the predicate of a partial index, and the planner (with statistics from
-- before a drain, or none yet) then scanned that whole index for every batch
-- instead of looking the ids up: cost grew with the backlog.
WITH locked AS MATERIALIZED (
    SELECT id, revision, pushed, status FROM scheduled_job
     WHERE id = ANY($1::bigint[])
     ORDER BY id
       FOR UPDATE SKIP LOCKED
)
UPDATE scheduled_job j
   SET pushed = true,
       status = CASE WHEN j.status = 'SCHEDULED' THEN 'QUEUED' ELSE j.status END
 WHERE j.id = ANY(ARRAY(
         SELECT l.id FROM locked l
           JOIN unnest($1::bigint[], $2::int[]) AS t(id, rev) ON t.id = l.id AND t.rev = l.revision
          WHERE NOT l.pushed AND l.status IN ('SCHEDULED', 'QUEUED', 'FAILED')));

-- name: stale_pushes
-- The loader's recovery of a push that did not finish: job_push rows older
-- than the grace ($1), oldest first (index job_push_created_at).
SELECT id, job_ids FROM job_push WHERE created_at < $1 ORDER BY created_at LIMIT $2;

-- name: delete_pushes
-- Those rows once their jobs are in Redis (a second loader deleting them too
-- is a no-op).
DELETE FROM job_push WHERE id = ANY($1::bigint[]);

-- name: unpushed
-- The loader's incremental work: pending rows due before the horizon that
-- Redis has not been given yet. The loader's rows say whether they are marked
-- pushed already (here: never), so it marks only those that are not.
SELECT id, category, urgency, run_at, revision, pushed
  FROM scheduled_job
 WHERE NOT pushed AND status IN ('SCHEDULED', 'QUEUED', 'FAILED') AND run_at < $1
 ORDER BY run_at
 LIMIT $2;

-- name: unpushed_ids
-- The same page as unpushed, ids only: the loader's fallback when a row of the
-- page cannot be decoded (its rows are then read one at a time).
SELECT id
  FROM scheduled_job
 WHERE NOT pushed AND status IN ('SCHEDULED', 'QUEUED', 'FAILED') AND run_at < $1
 ORDER BY run_at
 LIMIT $2;

-- name: pending_page
-- The loader's full resync (Redis flushed or restarted), paged by run_at/id.
SELECT id, category, urgency, run_at, revision, pushed
  FROM scheduled_job
 WHERE status IN ('SCHEDULED', 'QUEUED', 'FAILED') AND run_at < $1
   AND (run_at, id) > ($2, $3)
 ORDER BY run_at, id
 LIMIT $4;

-- name: pending_page_ids
-- The same page as pending_page, ids only (the loader's fallback, as above).
SELECT id
  FROM scheduled_job
 WHERE status IN ('SCHEDULED', 'QUEUED', 'FAILED') AND run_at < $1
   AND (run_at, id) > ($2, $3)
 ORDER BY run_at, id
 LIMIT $4;

-- name: loadable_rows
-- What the loader pushes, for given ids still pending.
SELECT id, category, urgency, run_at, revision, pushed
  FROM scheduled_job
 WHERE id = ANY($1::bigint[]) AND status IN ('SCHEDULED', 'QUEUED', 'FAILED');

-- name: park
-- A row a background loop could not handle even alone (poison) -> DEAD, by id,
-- with the reason. Reads no value back (nothing to decode), and clamps run_at
-- into the accepted range so the row can be read again (GET /api/jobs/{id});
-- a clamped value is kept, as text, in last_error. Pending or RUNNING rows
-- only: a settled row is no longer in any loop's way.
UPDATE scheduled_job
   SET status = 'DEAD', revision = revision + 1, pushed = false, worker = NULL,
       finished_at = $3,
       last_error = $2 || CASE
           WHEN run_at >= '2000-01-01 00:00:00+00' AND run_at < '2100-01-01 00:00:00+00' THEN ''
           ELSE ' (run_at was ' || run_at::text || ')' END,
       run_at = LEAST(GREATEST(run_at, '2000-01-01 00:00:00+00'::timestamptz),
                      '2099-12-31 23:59:59.999999+00'::timestamptz)
 WHERE id = $1 AND status IN ('SCHEDULED', 'QUEUED', 'FAILED', 'RUNNING');

-- name: claim
-- The claim is the conditional update: only a pending, due row becomes RUNNING,
-- so of two workers holding the same id only one gets it back. Rows are locked
-- in id order (as in complete/fail) so two batch statements never deadlock,
-- and tested after the lock (the latest version): see mark_pushed for why the
-- tests are not in the locking scan. A job of a paused category (job_category,
-- migration 0044) is never claimed: this statement reads the paused categories
-- itself (once, a scan of a table of a few rows), so a pause holds in every
-- process whatever it has cached. Due means due by $4, now plus the
-- fire-ahead: a job claimed early starts at its run_at, which is then its
-- started_at. The columns are Job's fields, in order.
WITH locked AS MATERIALIZED (
    SELECT id, status, run_at, category FROM scheduled_job
     WHERE id = ANY($1::bigint[])
     ORDER BY id FOR UPDATE
)
UPDATE scheduled_job j
   SET status = 'RUNNING', attempts = j.attempts + 1, revision = j.revision + 1,
       worker = $3, heartbeat_at = $2, started_at = GREATEST($2, j.run_at), finished_at = NULL
 WHERE j.id = ANY(ARRAY(
         SELECT id FROM locked
          WHERE status IN ('SCHEDULED', 'QUEUED', 'FAILED') AND run_at <= $4
            AND category <> ALL (ARRAY(SELECT category FROM job_category WHERE paused))))
RETURNING j.id, j.category, j.urgency, j.run_at, j.payload, j.status, j.attempts,
          j.max_attempts, j.revision, j.idempotency_key, j.created_at, j.started_at,
          j.finished_at, j.last_error, j.worker;

-- name: claimed_by
-- A row this worker's claim made RUNNING (a batch claim commits even when a
-- returned row then fails to decode): the executor's one-by-one fallback.
SELECT id, category, urgency, run_at, payload, status, attempts, max_attempts, revision,
       idempotency_key, created_at, started_at, finished_at, last_error, worker
  FROM scheduled_job
 WHERE id = $1 AND worker = $2 AND status = 'RUNNING';

-- name: heartbeat
-- SKIP LOCKED: a row locked now is being settled; one missed beat is harmless
-- (the reaper's timeout is many beats) and the beat never waits or deadlocks.
-- `worker` is set by the claim and cleared by every way out of RUNNING, so it
-- alone says "still running here" (a status test would steer the planner to
-- the partial RUNNING index and a scan of every running job).
WITH locked AS MATERIALIZED (
    SELECT id FROM scheduled_job
     WHERE id = ANY($1::bigint[]) AND worker = $3
     ORDER BY id
       FOR UPDATE SKIP LOCKED
)
UPDATE scheduled_job j SET heartbeat_at = $2
 WHERE j.id = ANY(ARRAY(SELECT id FROM locked)) AND j.worker = $3;

-- name: complete
-- RUNNING -> DONE only with the revision of this claim: a worker the reaper
-- gave up on cannot complete the job a second time. Every transition bumps the
-- revision, so "the claim's revision is still current" means "still RUNNING
-- under this claim" (no status test: see heartbeat). One statement marks the
-- batch DONE and logs it (atomic without an explicit transaction).
WITH locked AS MATERIALIZED (
    SELECT id FROM scheduled_job WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE
), done AS (
    UPDATE scheduled_job j
       SET status = 'DONE', revision = j.revision + 1, finished_at = $3, worker = NULL,
           last_error = NULL
     WHERE j.id = ANY(ARRAY(SELECT id FROM locked))
       AND (j.id, j.revision) IN (SELECT * FROM unnest($1::bigint[], $2::int[]))
    RETURNING j.id, j.attempts, j.started_at
), logged AS (
    INSERT INTO job_execution (job_id, attempt, worker, started_at, finished_at, outcome)
    SELECT id, attempts, $4, started_at, $3, 'DONE' FROM done
)
SELECT id FROM done;

-- name: fail
-- A retry is just a new run_at (not pushed yet); out of attempts, or a failure
-- the handler calls permanent ($8), -> DEAD. last_error is the text the API
-- shows ($3); the execution log keeps the operator's detail ($7). Same
-- revision rule and statement shape as complete.
WITH locked AS MATERIALIZED (
    SELECT id FROM scheduled_job WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE
), failed AS (
    UPDATE scheduled_job j
       SET status = CASE WHEN t.dead OR j.attempts >= j.max_attempts THEN 'DEAD' ELSE 'FAILED' END,
           run_at = CASE WHEN t.dead OR j.attempts >= j.max_attempts THEN j.run_at
                         ELSE t.retry_at END,
           finished_at = CASE WHEN t.dead OR j.attempts >= j.max_attempts
                              THEN $5::timestamptz END,
           revision = j.revision + 1, pushed = false, worker = NULL, last_error = t.err
      FROM unnest($1::bigint[], $2::int[], $3::text[], $4::timestamptz[], $7::text[],
                  $8::boolean[]) AS t(id, rev, err, retry_at, detail, dead)
     WHERE j.id = ANY(ARRAY(SELECT id FROM locked)) AND j.id = t.id AND j.revision = t.rev
    RETURNING j.id, j.category, j.urgency, j.run_at, j.revision, j.status, j.attempts,
              j.started_at, t.detail
), logged AS (
    INSERT INTO job_execution (job_id, attempt, worker, started_at, finished_at, outcome, error)
    SELECT id, attempts, $6, started_at, $5,
           CASE WHEN status = 'DEAD' THEN 'DEAD' ELSE 'FAILED' END, detail
      FROM failed
)
SELECT id, category, urgency, run_at, revision, status FROM failed;

-- name: defer
-- A claimed job its handler put back without running it (its destination is
-- busy): not an attempt, so the claim's attempt is given back, and the job is
-- due again at $3 (not pushed yet: the executor or the loader hands it to
-- Redis). Pending as before the claim: FAILED when an earlier attempt failed.
-- Same revision rule as complete; nothing is logged (nothing ran).
WITH locked AS MATERIALIZED (
    SELECT id FROM scheduled_job WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE
)
UPDATE scheduled_job j
   SET status = CASE WHEN j.attempts > 1 THEN 'FAILED' ELSE 'SCHEDULED' END,
       attempts = j.attempts - 1, run_at = t.run_at, revision = j.revision + 1,
       pushed = false, worker = NULL
  FROM unnest($1::bigint[], $2::int[], $3::timestamptz[]) AS t(id, rev, run_at)
 WHERE j.id = ANY(ARRAY(SELECT id FROM locked)) AND j.id = t.id AND j.revision = t.rev
RETURNING j.id, j.category, j.urgency, j.run_at, j.revision, j.status;

-- name: stale_running
-- RUNNING rows whose worker stopped heartbeating, ids only (the reaper reaps
-- them by id, so one row it cannot handle is isolated from the others).
-- An ordered index scan (not a bitmap scan) marks the entries of rows that left
-- RUNNING as dead as it passes them, so the next scans skip them instead of
-- re-reading every job that ran since the last vacuum.
SELECT id FROM scheduled_job
 WHERE status = 'RUNNING' AND heartbeat_at < $1
 ORDER BY heartbeat_at
 LIMIT $2;

-- name: reap
-- Those rows go back to the queue (or DEAD when that was the last attempt);
-- the lost attempt is logged. The tests are repeated on the locked rows: a row
-- that heartbeated or settled since stale_running is left alone.
WITH lost AS (
    UPDATE scheduled_job
       SET status = CASE WHEN attempts >= max_attempts THEN 'DEAD' ELSE 'QUEUED' END,
           finished_at = CASE WHEN attempts >= max_attempts THEN $3::timestamptz END,
           revision = revision + 1, pushed = false, last_error = 'worker lost: no heartbeat',
           worker = NULL
     WHERE id IN (SELECT id FROM scheduled_job
                   WHERE id = ANY($1::bigint[])
                   ORDER BY id
                   FOR UPDATE SKIP LOCKED)
       AND status = 'RUNNING' AND heartbeat_at < $2
    RETURNING id, category, urgency, run_at, revision, status, attempts, started_at
), logged AS (
    INSERT INTO job_execution (job_id, attempt, worker, started_at, finished_at, outcome, error)
    SELECT id, attempts, NULL, started_at, $3, 'LOST', 'worker lost: no heartbeat' FROM lost
)
SELECT id, category, urgency, run_at, revision, status FROM lost;

-- name: cancel
-- SCHEDULED/QUEUED (and FAILED, waiting for a retry, and WAITING for its
-- parents) -> CANCELLED; a copy of the id left in Redis is skipped by the
-- claim. The caller cancels the job's dependents next (cancel_dependents).
UPDATE scheduled_job
   SET status = 'CANCELLED', revision = revision + 1, finished_at = $2
 WHERE id = $1 AND status IN ('WAITING', 'SCHEDULED', 'QUEUED', 'FAILED')
RETURNING *;

-- name: cancel_by_key
-- The same, for the job a module enqueued under its own idempotency key (a
-- rental hold's expiry once the hold is paid or cancelled).
UPDATE scheduled_job
   SET status = 'CANCELLED', revision = revision + 1, finished_at = $3
 WHERE category = $1 AND idempotency_key = $2
   AND status IN ('WAITING', 'SCHEDULED', 'QUEUED', 'FAILED')
RETURNING id;

-- name: executions
-- The attempts of a job, in order.
SELECT attempt, worker, started_at, finished_at, outcome, error
  FROM job_execution WHERE job_id = $1 ORDER BY attempt;

-- name: job_prune_finished
-- Retention (core/maintenance/retention.py): DONE and CANCELLED jobs finished before $1, at
-- most $2, with their executions (same statement, by job_execution's key).
-- SCHEDULED/QUEUED/RUNNING/FAILED jobs are never pruned.
WITH gone AS (
    DELETE FROM scheduled_job
     WHERE ctid = ANY (ARRAY(SELECT ctid FROM scheduled_job
                              WHERE status IN ('DONE', 'CANCELLED') AND finished_at < $1
                              ORDER BY finished_at LIMIT $2 FOR UPDATE SKIP LOCKED))
    RETURNING id
), runs AS (
    DELETE FROM job_execution WHERE job_id = ANY (ARRAY(SELECT id FROM gone)) RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS scheduled_job, (SELECT count(*) FROM runs) AS job_execution;

-- name: job_prune_dead
-- Retention: DEAD jobs (kept longer, for the post-mortem) finished before $1.
WITH gone AS (
    DELETE FROM scheduled_job
     WHERE ctid = ANY (ARRAY(SELECT ctid FROM scheduled_job
                              WHERE status = 'DEAD' AND finished_at < $1
                              ORDER BY finished_at LIMIT $2 FOR UPDATE SKIP LOCKED))
    RETURNING id
), runs AS (
    DELETE FROM job_execution WHERE job_id = ANY (ARRAY(SELECT id FROM gone)) RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS scheduled_job, (SELECT count(*) FROM runs) AS job_execution;

-- name: custom_plans
-- For the rest of the transaction, plan each statement for its parameters'
-- values: a filtered page's generic plan walks the primary key and filters
-- (its estimate of "any status" makes that look cheap), reading the whole table
-- when nothing matches; planned for the value, it is the index made for it.
SET LOCAL plan_cache_mode = force_custom_plan;

-- name: jobs_page
-- GET /api/jobs, newest first: a backward range scan of the primary key from
-- the cursor ($1: the last id served, or the largest bigint for page one).
SELECT * FROM scheduled_job WHERE id < $1 ORDER BY id DESC LIMIT $2;

-- name: jobs_page_status
-- The same for one status: index scheduled_job_status_id (status, id).
SELECT * FROM scheduled_job WHERE status = $3 AND id < $1 ORDER BY id DESC LIMIT $2;

-- name: jobs_page_category
-- The same for one category: index scheduled_job_category_id (category, id).
SELECT * FROM scheduled_job WHERE category = $3 AND id < $1 ORDER BY id DESC LIMIT $2;

-- name: jobs_page_status_category
-- Both filters: one of the two indexes, the other filter applied to its rows
-- (migration 0016 says why there is no third index).
SELECT * FROM scheduled_job
 WHERE status = $3 AND category = $4 AND id < $1
 ORDER BY id DESC LIMIT $2;

-- name: retry
-- POST /api/jobs/{id}/retry: DEAD or FAILED -> SCHEDULED, due now, not pushed
-- (the loader or the dispatch after commit hands it to Redis). The attempts
-- already made stay counted (the execution log is keyed by attempt number);
-- the job gets a fresh budget of $3 attempts from here. Concurrent retries of
-- one job: the row lock orders them and only the first still sees DEAD/FAILED.
UPDATE scheduled_job
   SET status = 'SCHEDULED', run_at = $2, max_attempts = attempts + $3,
       revision = revision + 1, pushed = false, worker = NULL, finished_at = NULL
 WHERE id = $1 AND status IN ('FAILED', 'DEAD')
RETURNING *;

-- name: reschedule
-- PATCH /api/jobs/{id} {runAt}: a job no worker has claimed gets a new run_at.
-- The claim and this statement both lock the row and test its status, so one
-- of them wins: after a claim this matches nothing (409); after this, the
-- claim sees the new run_at and refuses a copy of the id Redis fires at the
-- old time. Not pushed again until the loader (or the dispatch after commit)
-- re-scores the id in Redis. A FAILED job keeps its status (it still waits for
-- a retry), a QUEUED one is SCHEDULED again (not in Redis at its new time yet).
-- A WAITING job keeps waiting for its parents (its new run_at is the earliest
-- it runs once they are DONE).
UPDATE scheduled_job
   SET run_at = $2, revision = revision + 1, pushed = false,
       status = CASE WHEN status IN ('FAILED', 'WAITING') THEN status ELSE 'SCHEDULED' END
 WHERE id = $1 AND status IN ('WAITING', 'SCHEDULED', 'QUEUED', 'FAILED')
RETURNING *;

-- name: insert_recurring
-- A new recurring job with its first occurrence.
INSERT INTO recurring_job (category, cron, timezone, payload, urgency, next_at, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING *;

-- name: recurring_page
-- The recurring jobs, newest first (primary key, backwards from the cursor $1).
SELECT * FROM recurring_job WHERE id < $1 ORDER BY id DESC LIMIT $2;

-- name: delete_recurring
-- DELETE /api/recurring-jobs/{id}: waits for a materialiser holding the row, so
-- the jobs it created are committed and visible to cancel_occurrences next.
DELETE FROM recurring_job WHERE id = $1 RETURNING id;

-- name: cancel_occurrences
-- The occurrences of a deleted recurring job that have not run yet are
-- cancelled with it (index uq_job_occurrence); a running one finishes.
UPDATE scheduled_job
   SET status = 'CANCELLED', revision = revision + 1, finished_at = $2
 WHERE recurring_id = $1 AND status IN ('SCHEDULED', 'QUEUED', 'FAILED')
RETURNING id;

-- name: due_recurring_ids
-- The materialiser's work: live (not parked) recurring jobs whose next occurrence
-- falls before the horizon, locked (SKIP LOCKED: two materialisers share the
-- work instead of waiting for each other). Ids only, so no value of a bad row
-- can fail the claim. Index recurring_job_next_at (a parked row is filtered).
SELECT id FROM recurring_job
 WHERE next_at < $1 AND parked_at IS NULL
 ORDER BY next_at
 LIMIT $2
   FOR UPDATE SKIP LOCKED;

-- name: recurring_by_id
-- The claimed recurring jobs, whole, in the order they were claimed.
SELECT * FROM recurring_job WHERE id = ANY($1::bigint[]) ORDER BY next_at, id;

-- name: park_recurring
-- A recurring job the materialiser cannot expand even alone (core.messaging.poison):
-- skipped from now on, with the reason. Reads none of the row's values.
UPDATE recurring_job SET parked_at = $2, last_error = $3 WHERE id = $1;

-- name: insert_occurrences
-- One job per occurrence: the unique key (recurring_id, occurs_at) makes a
-- second insert of an occurrence a no-op, whoever attempts it. Returns the
-- jobs this statement created (Job's fields).
INSERT INTO scheduled_job (category, urgency, run_at, payload, status, max_attempts,
                           created_at, recurring_id, occurs_at)
SELECT $2, $3, t.at, $4, 'SCHEDULED', $5, $6, $1, t.at
  FROM unnest($7::timestamptz[]) AS t(at)
 ORDER BY t.at
ON CONFLICT (recurring_id, occurs_at) WHERE recurring_id IS NOT NULL DO NOTHING
RETURNING *;

-- name: advance_recurring
-- Moves the cursor past the occurrences just created; only from the value this
-- materialiser read (a cursor never goes back).
UPDATE recurring_job SET next_at = $3 WHERE id = $1 AND next_at = $2;

-- name: retry_dead
-- POST /api/jobs/retry {status: DEAD, category?}: the next $4 DEAD jobs after
-- the id $3 (this request's cursor: each job is visited once per request, so
-- one that dies again meanwhile is not retried twice), optionally of category
-- $5, retried as `retry` does. SKIP LOCKED: two operators pressing it together
-- share the jobs instead of waiting for each other, and a row is updated only
-- by whoever locked it while it was DEAD, so each job is retried once. Index
-- scheduled_job_status_id (status, id): a range scan from the cursor.
WITH locked AS MATERIALIZED (
    SELECT id FROM scheduled_job
     WHERE status = 'DEAD' AND id > $3 AND ($5::text IS NULL OR category = $5)
     ORDER BY id
     LIMIT $4
       FOR UPDATE SKIP LOCKED
)
UPDATE scheduled_job j
   SET status = 'SCHEDULED', run_at = $1, max_attempts = j.attempts + $2,
       revision = j.revision + 1, pushed = false, worker = NULL, finished_at = NULL
 WHERE j.id = ANY(ARRAY(SELECT id FROM locked)) AND j.status = 'DEAD'
RETURNING *;

-- name: set_paused
-- POST /api/job-categories/{category}/pause and /resume.
INSERT INTO job_category (category, paused, updated_at) VALUES ($1, $2, $3)
ON CONFLICT (category) DO UPDATE SET paused = $2, updated_at = $3
RETURNING category, paused, per_second;

-- name: set_rate
-- PUT /api/job-categories/{category}/rate-limit: jobs per second, NULL for none.
INSERT INTO job_category (category, per_second, updated_at) VALUES ($1, $2, $3)
ON CONFLICT (category) DO UPDATE SET per_second = $2, updated_at = $3
RETURNING category, paused, per_second;

-- name: category_rules
-- What every executor reads at most once a second: the paused categories and
-- the rate limits (a few rows).
SELECT category, paused, per_second FROM job_category WHERE paused OR per_second IS NOT NULL;

-- name: category_overview
-- GET /api/job-categories: every category declared ($1), with jobs (a skip
-- scan of scheduled_job_category_id: one index probe per category, however
-- many jobs) or with a row in job_category; its pause and rate limit; its jobs
-- due (pending with run_at <= $2: index scheduled_job_pending), running
-- (scheduled_job_running) and dead (scheduled_job_status_id). Each count reads
-- only the rows it counts, never DONE or future jobs.
WITH RECURSIVE seen AS (
    (SELECT category FROM scheduled_job ORDER BY category LIMIT 1)
    UNION ALL
    SELECT (SELECT j.category FROM scheduled_job j WHERE j.category > s.category
             ORDER BY j.category LIMIT 1)
      FROM seen s
     WHERE s.category IS NOT NULL
), names AS (
    SELECT unnest($1::text[]) AS category
    UNION SELECT category FROM seen WHERE category IS NOT NULL
    UNION SELECT category FROM job_category
), due AS (
    SELECT category, count(*) AS n FROM scheduled_job
     WHERE status IN ('SCHEDULED', 'QUEUED', 'FAILED') AND run_at <= $2
     GROUP BY category
), running AS (
    SELECT category, count(*) AS n FROM scheduled_job WHERE status = 'RUNNING' GROUP BY category
), dead AS (
    SELECT category, count(*) AS n FROM scheduled_job WHERE status = 'DEAD' GROUP BY category
)
SELECT n.category, coalesce(c.paused, false) AS paused, c.per_second,
       coalesce(due.n, 0) AS due, coalesce(running.n, 0) AS running, coalesce(dead.n, 0) AS dead
  FROM names n
  LEFT JOIN job_category c ON c.category = n.category
  LEFT JOIN due ON due.category = n.category
  LEFT JOIN running ON running.category = n.category
  LEFT JOIN dead ON dead.category = n.category
 ORDER BY n.category;
