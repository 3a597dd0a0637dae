-- Job categories an operator pauses and throttles (POST /api/job-categories/
-- {category}/pause, /resume, PUT .../rate-limit). A row exists only for a
-- category someone paused or limited; no row is "running, unlimited".
--
-- PostgreSQL, not Redis: a pause must hold in every worker process and
-- survive a Redis flush. The executors' claim statement reads the paused
-- categories itself (one scan of this tiny table per claim), so a job of a
-- paused category is never claimed whatever a process has cached; executors
-- also read the table at most once a second to stop taking such jobs from
-- Redis. The rate limit's state (a token bucket) lives in Redis; its rate
-- lives here.
CREATE TABLE job_category (
    category   text        PRIMARY KEY CHECK (category ~ '^[a-z][a-z0-9._-]{0,63}$'),
    paused     boolean     NOT NULL DEFAULT false,
    -- Jobs started per second across every worker process; NULL: no limit.
    per_second double precision CHECK (per_second IS NULL
                                       OR (per_second >= 0.001 AND per_second <= 100000)),
    updated_at timestamptz NOT NULL
);
