-- Named queries of the appointments module.

-- name: insert_doctor
INSERT INTO doctor (name, timezone, specialty) VALUES ($1, $2, $3)
RETURNING id, name, timezone, specialty;

-- name: get_doctor
SELECT id, name, timezone, specialty FROM doctor WHERE id = $1;

-- name: insert_slots
-- A slot that exists, or overlaps one of the doctor's slots (ex_doctor_slot_overlap),
-- is skipped: a schedule can be re-run, and a second schedule never interleaves.
INSERT INTO time_slot (doctor_id, start_at, end_at, capacity, opens_at)
SELECT $1, s, e, $4, o
  FROM unnest($2::timestamptz[], $3::timestamptz[], $5::timestamptz[]) AS t(s, e, o)
ON CONFLICT DO NOTHING;

-- name: list_available_slots
SELECT id, doctor_id, start_at, end_at, capacity, booked_count
  FROM time_slot
 WHERE doctor_id = $1 AND start_at >= $2 AND start_at < $3 AND start_at > $4
   AND booked_count < capacity AND opens_at <= $4
 ORDER BY start_at;

-- name: book
-- Check and write in one statement: the row lock makes a concurrent booking wait
-- and re-evaluate booked_count < capacity against the committed value. The
-- booking window is the stored opens_at (set when the slot was generated).
WITH slot AS (
    UPDATE time_slot SET booked_count = booked_count + 1
     WHERE id = $1 AND booked_count < capacity AND start_at > $3 AND opens_at <= $3
    RETURNING id, doctor_id, start_at, end_at, capacity, booked_count
)
INSERT INTO appointment (slot_id, patient_id, status, period, created_at)
SELECT slot.id, $2, 'BOOKED', tstzrange(slot.start_at, slot.end_at, '[)'), $3 FROM slot
RETURNING id, slot_id, patient_id, status, lower(period) AS start_at,
          upper(period) AS end_at, created_at,
          (SELECT doctor_id FROM slot) AS doctor_id,
          (SELECT capacity - booked_count FROM slot) AS remaining;

-- name: slot_state
-- Only used to explain a refusal after the conditional update said no.
SELECT s.start_at, s.opens_at, s.capacity, s.booked_count,
       EXISTS (SELECT 1 FROM appointment a
                WHERE a.slot_id = s.id AND a.patient_id = $2 AND a.status = 'BOOKED') AS mine
  FROM time_slot s WHERE s.id = $1;

-- name: get_appointment
SELECT a.id, a.slot_id, a.patient_id, a.status, lower(a.period) AS start_at,
       upper(a.period) AS end_at, a.created_at, s.doctor_id
  FROM appointment a JOIN time_slot s ON s.id = a.slot_id
 WHERE a.id = $1;

-- name: cancel
-- The capacity is released only when this statement flipped BOOKED -> CANCELLED.
WITH appt AS (
    UPDATE appointment SET status = 'CANCELLED', cancelled_at = $2
     WHERE id = $1 AND status = 'BOOKED' AND lower(period) > $2
    RETURNING id, slot_id, patient_id, status, lower(period) AS start_at,
              upper(period) AS end_at, created_at
), released AS (
    UPDATE time_slot SET booked_count = booked_count - 1
      FROM appt WHERE time_slot.id = appt.slot_id
    RETURNING time_slot.doctor_id
)
SELECT appt.*, released.doctor_id FROM appt, released;

-- name: set_reminder_job
UPDATE appointment SET reminder_job_id = $2 WHERE id = $1;

-- name: reminder_job_of
SELECT reminder_job_id FROM appointment WHERE id = $1;

-- name: mark_reminded
-- At most one reminder per appointment, and none once it is cancelled.
UPDATE appointment a SET reminder_sent_at = $2
  FROM time_slot s
 WHERE a.id = $1 AND s.id = a.slot_id AND a.status = 'BOOKED' AND a.reminder_sent_at IS NULL
RETURNING a.id, a.slot_id, a.patient_id, a.status, lower(a.period) AS start_at,
          upper(a.period) AS end_at, a.created_at, s.doctor_id;
