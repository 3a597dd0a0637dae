-- A job's run_at lies in the range every accepted instant lies in
-- (reservo.core.http.schemas.Instant: [2000-01-01Z, 2100-01-01Z)). The API refuses
-- others with 422; the database repeats the rule so that no writer (an older
-- version, a script, a bulk import) can store a row the workers cannot read:
-- year 1 minus an offset is year 0, which Python cannot decode, and one such row
-- first in the loader's run_at order stalled every later job behind it.

-- 1. Legacy pending rows outside the range never run: parked (DEAD), saying why,
--    with run_at clamped into the range so the row stays readable.
UPDATE scheduled_job
   SET status = 'DEAD',
       revision = revision + 1,
       pushed = false,
       worker = NULL,
       finished_at = now(),
       last_error = 'parked by migration 0010: run_at ' || run_at::text
                    || ' is outside the accepted range [2000-01-01Z, 2100-01-01Z)',
       run_at = LEAST(GREATEST(run_at, '2000-01-01 00:00:00+00'::timestamptz),
                      '2099-12-31 23:59:59.999999+00'::timestamptz)
 WHERE status IN ('SCHEDULED', 'QUEUED', 'FAILED')
   AND NOT (run_at >= '2000-01-01 00:00:00+00' AND run_at < '2100-01-01 00:00:00+00');

-- 2. Rows already out of the pending states keep their status; only run_at is
--    clamped (the original value is kept in last_error).
UPDATE scheduled_job
   SET last_error = coalesce(last_error || '; ', '') || 'run_at ' || run_at::text
                    || ' clamped into the accepted range by migration 0010',
       run_at = LEAST(GREATEST(run_at, '2000-01-01 00:00:00+00'::timestamptz),
                      '2099-12-31 23:59:59.999999+00'::timestamptz)
 WHERE NOT (run_at >= '2000-01-01 00:00:00+00' AND run_at < '2100-01-01 00:00:00+00');

-- 3. The rule itself, for new writes at once, then validated against every
--    existing row now that the clean-up above left none outside it.
ALTER TABLE scheduled_job ADD CONSTRAINT ck_job_run_at_range
    CHECK (run_at >= '2000-01-01 00:00:00+00' AND run_at < '2100-01-01 00:00:00+00') NOT VALID;
ALTER TABLE scheduled_job VALIDATE CONSTRAINT ck_job_run_at_range;
