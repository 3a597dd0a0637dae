-- Appointments, second release: the booking window and slots that never overlap.

-- The booking window: a slot is bookable from opens_at on (07:00 local of the day
-- 14 days before its local date, by default). Stored per slot when the slot is
-- generated, so the booking statement decides it with one comparison and no
-- time-zone arithmetic. Existing slots are backfilled with the defaults
-- (RESERVO_APPOINTMENTS_HORIZON_DAYS=14, RESERVO_APPOINTMENTS_OPENING_TIME=07:00);
-- slots generated later use the settings of the process that generates them.
ALTER TABLE time_slot ADD COLUMN IF NOT EXISTS opens_at timestamptz;
UPDATE time_slot s
   SET opens_at = ((((s.start_at AT TIME ZONE d.timezone)::date - 14) + time '07:00')
                   AT TIME ZONE d.timezone)
  FROM doctor d
 WHERE d.id = s.doctor_id AND s.opens_at IS NULL;
ALTER TABLE time_slot ALTER COLUMN opens_at SET NOT NULL;

-- A doctor's slots never overlap, whatever their lengths (two schedules with 15-
-- and 20-minute slots used to interleave). Existing overlaps are looked for first:
-- sweeping each affected doctor's slots in start order, a slot that starts before
-- the end of the slots kept so far is dropped when it never held an appointment
-- (not even a cancelled one); one that did is reported and the migration stops,
-- since only a person can decide which of two booked slots should go.
DO $$
DECLARE
    r record;
    cur_doctor bigint;
    kept_end timestamptz;
    removed integer := 0;
    conflicts integer := 0;
BEGIN
    FOR r IN
        SELECT s.id, s.doctor_id, s.start_at, s.end_at,
               EXISTS (SELECT 1 FROM appointment a WHERE a.slot_id = s.id) AS used
          FROM time_slot s
         WHERE s.doctor_id IN (
                 SELECT doctor_id FROM (
                     SELECT doctor_id, start_at,
                            max(end_at) OVER (PARTITION BY doctor_id ORDER BY start_at, id
                                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                              AS prev_end
                       FROM time_slot) w
                  WHERE start_at < prev_end)
         ORDER BY s.doctor_id, s.start_at, s.id
    LOOP
        IF cur_doctor IS DISTINCT FROM r.doctor_id THEN
            cur_doctor := r.doctor_id;
            kept_end := NULL;
        END IF;
        IF kept_end IS NOT NULL AND r.start_at < kept_end THEN
            IF r.used THEN
                conflicts := conflicts + 1;
                RAISE WARNING 'slot % of doctor % overlaps an earlier slot and holds appointments',
                    r.id, r.doctor_id;
            ELSE
                DELETE FROM time_slot WHERE id = r.id;
                removed := removed + 1;
                CONTINUE;
            END IF;
        END IF;
        kept_end := greatest(kept_end, r.end_at);
    END LOOP;
    IF conflicts > 0 THEN
        RAISE EXCEPTION '% overlapping slot(s) hold appointments; move or cancel them, then migrate again',
            conflicts;
    END IF;
    IF removed > 0 THEN
        RAISE NOTICE 'removed % empty slot(s) that overlapped another slot of their doctor', removed;
    END IF;
END $$;

ALTER TABLE time_slot ADD CONSTRAINT ex_doctor_slot_overlap
    EXCLUDE USING gist (doctor_id WITH =, tstzrange(start_at, end_at, '[)') WITH &&);
