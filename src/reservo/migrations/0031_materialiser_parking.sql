-- The materialisers (repeating schedules, recurring jobs) park a row they cannot
-- expand, instead of failing their whole batch on it every run.

-- 1. Where a parked row says why. parked_at NULL: the row is live; set, the
--    loop skips it until an operator fixes the row and clears it (both columns).
--    Nullable, no default: adding them rewrites nothing.
ALTER TABLE doctor_schedule ADD COLUMN IF NOT EXISTS parked_at timestamptz;
ALTER TABLE doctor_schedule ADD COLUMN IF NOT EXISTS last_error text;
ALTER TABLE recurring_job ADD COLUMN IF NOT EXISTS parked_at timestamptz;
ALTER TABLE recurring_job ADD COLUMN IF NOT EXISTS last_error text;

-- 2. A local date that never fails a statement: NULL when PostgreSQL does not
--    know the zone (a doctor written before the zone rule, or a tz database
--    older than Python's). The due-schedules scan computes it for every
--    candidate row; with a plain AT TIME ZONE one such row failed the scan,
--    so no schedule was extended at all. The row comes back with the NULL and
--    the worker parks it. The EXCEPTION block costs a subtransaction per call,
--    which writes nothing (no transaction id is taken).
CREATE OR REPLACE FUNCTION local_date_or_null(at timestamptz, zone text) RETURNS date
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN (at AT TIME ZONE zone)::date;
EXCEPTION WHEN invalid_parameter_value THEN
    RETURN NULL;
END
$$;
