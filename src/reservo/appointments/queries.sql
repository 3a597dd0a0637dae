-- Named queries of the appointments module.

-- name: insert_doctor
-- A new doctor, returned as the API shows it.
INSERT INTO doctor (name, timezone, specialty) VALUES ($1, $2, $3)
RETURNING id, name, timezone, specialty;

-- name: get_doctor
-- One doctor by id (its zone expands the working hours).
SELECT id, name, timezone, specialty FROM doctor WHERE id = $1;

-- name: insert_slots
-- A slot that exists, or overlaps one of the doctor's slots (ex_doctor_slot_overlap),
-- is skipped: a schedule can be re-run, and a second schedule never interleaves.
INSERT INTO time_slot (doctor_id, start_at, end_at, capacity, opens_at, overbook_limit,
                       prepaid_amount, prepaid_currency, hold_minutes, min_notice_minutes,
                       max_per_patient_day)
SELECT $1, s, e, $4, o, $6, $7, $8, $9, $10, $11
  FROM unnest($2::timestamptz[], $3::timestamptz[], $5::timestamptz[]) AS t(s, e, o)
ON CONFLICT DO NOTHING;

-- name: available_slots_json
-- Slot lists, one row per ($1[i], $2[i], $3[i]) in that order (the lists missed in
-- one turn of an API process are read in one statement: one round trip and one
-- statement's overhead for all): doctor $1[i]'s slots starting in [$2[i], $3[i]),
-- after $4, open at $4 and not full, in time order, as the API's JSON, byte for byte what
-- orjson writes of SlotOut (camelCase, instants in UTC as Python's isoformat()
-- writes them), built by PostgreSQL: one text value instead of 40 decoded rows.
-- Every value is an integer or a fixed-format instant, so no escaping is needed.
-- next_open: when the list changes next without any write: the next of the
-- day's slots opens for booking, or a hold of a prepaid slot ends (0054); NULL
-- if neither. A hold past its end at $4 is counted free even before a job
-- flipped it (the booking flips it first): `lapsed`, looked up only for prepaid
-- slots, in the partial index of live holds.
SELECT l.body, l.first_start, l.next_open
  FROM unnest($1::bigint[], $2::timestamptz[], $3::timestamptz[])
       WITH ORDINALITY AS w(wanted_doctor, day_start, day_end, n)
 CROSS JOIN LATERAL (
       SELECT '[' || coalesce(string_agg(format(
                  '{"id":%s,"doctorId":%s,"startAt":"%s","endAt":"%s","capacity":%s,"bookedCount":%s,"available":%s,"overbookedCount":%s}',
                  id, doctor_id,
                  to_char(start_at AT TIME ZONE 'UTC', CASE WHEN date_trunc('second', start_at) = start_at
                      THEN 'YYYY-MM-DD"T"HH24:MI:SS"+00:00"' ELSE 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"' END),
                  to_char(end_at AT TIME ZONE 'UTC', CASE WHEN date_trunc('second', end_at) = end_at
                      THEN 'YYYY-MM-DD"T"HH24:MI:SS"+00:00"' ELSE 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"' END),
                  capacity, booked_count - lapsed, capacity - booked_count + lapsed, overbooked_count),
                  ',' ORDER BY start_at)
                  FILTER (WHERE booked_count - lapsed < capacity AND opens_at <= $4), '') || ']' AS body,
              min(start_at) FILTER (WHERE booked_count - lapsed < capacity AND opens_at <= $4)
                  AS first_start,
              least(min(opens_at) FILTER (WHERE opens_at > $4), min(next_hold_end)) AS next_open
         FROM time_slot t
         LEFT JOIN LATERAL (
             SELECT count(*) FILTER (WHERE h.hold_expires_at <= $4)::int AS lapsed,
                    min(h.hold_expires_at) FILTER (WHERE h.hold_expires_at > $4) AS next_hold_end
               FROM appointment h
              WHERE t.prepaid_amount IS NOT NULL AND h.slot_id = t.id AND h.status = 'HELD'
         ) held ON true
        WHERE t.doctor_id = w.wanted_doctor AND t.start_at >= w.day_start AND t.start_at < w.day_end
          AND t.start_at > $4
 ) l
 ORDER BY w.n;

-- name: book
-- Check and write in one statement: the row lock makes a concurrent booking wait
-- and re-evaluate booked_count < capacity against the committed value. The
-- booking window is the stored opens_at (set when the slot was generated). A
-- patient blocked by the no-show policy books nothing (one primary-key probe).
-- A prepaid slot (0054) gives a HELD seat, counted like a booked one, priced and
-- ending $3 + its hold minutes. first_hold_end: when a slot left full by this
-- booking has a seat again at the latest (its earliest other hold ends; the new
-- appointment's own end is added by the caller), NULL when none or not full.
-- $4 (0057): the booking is a patient's, bound by the slot's minimum notice;
-- max_per_patient_day returned so the caller checks the daily limit (NULL: none).
WITH slot AS (
    UPDATE time_slot SET booked_count = booked_count + 1
     WHERE id = $1 AND booked_count < capacity AND start_at > $3 AND opens_at <= $3
       AND (NOT $4::boolean OR start_at >= $3 + make_interval(mins => min_notice_minutes))
       AND NOT EXISTS (SELECT 1 FROM patient_block b
                        WHERE b.patient_id = $2 AND b.blocked_until > $3)
    RETURNING id, doctor_id, start_at, end_at, capacity, booked_count, prepaid_amount,
              prepaid_currency, hold_minutes, max_per_patient_day
)
INSERT INTO appointment (slot_id, patient_id, status, period, created_at, hold_expires_at,
                         price_amount, price_currency)
SELECT slot.id, $2, CASE WHEN slot.prepaid_amount IS NULL THEN 'BOOKED' ELSE 'HELD' END,
       tstzrange(slot.start_at, slot.end_at, '[)'), $3,
       $3 + make_interval(mins => slot.hold_minutes), slot.prepaid_amount, slot.prepaid_currency
  FROM slot
RETURNING id, slot_id, patient_id, status, lower(period) AS start_at,
          upper(period) AS end_at, created_at, overbooked, hold_expires_at, price_amount,
          price_currency, overpaid_refund,
          (SELECT doctor_id FROM slot) AS doctor_id,
          (SELECT max_per_patient_day FROM slot) AS max_per_patient_day,
          (SELECT capacity - booked_count FROM slot) AS remaining,
          (SELECT min(h.hold_expires_at) FROM appointment h
            WHERE h.slot_id = $1 AND h.status = 'HELD'
              AND (SELECT capacity - booked_count FROM slot) = 0) AS first_hold_end;

-- name: overbook
-- A staff booking beyond capacity: the same statement as book on the other
-- counter (overbooked_count < overbook_limit), so ordinary bookings never see
-- it; $4 the calling doctor (NULL for an admin) must be the slot's.
WITH slot AS (
    UPDATE time_slot SET overbooked_count = overbooked_count + 1
     WHERE id = $1 AND overbooked_count < overbook_limit AND start_at > $3 AND opens_at <= $3
       AND ($4::bigint IS NULL OR doctor_id = $4::bigint)
       AND NOT EXISTS (SELECT 1 FROM patient_block b
                        WHERE b.patient_id = $2 AND b.blocked_until > $3)
    RETURNING id, doctor_id, start_at, end_at
)
INSERT INTO appointment (slot_id, patient_id, status, period, created_at, overbooked)
SELECT slot.id, $2, 'BOOKED', tstzrange(slot.start_at, slot.end_at, '[)'), $3, true FROM slot
RETURNING id, slot_id, patient_id, status, lower(period) AS start_at,
          upper(period) AS end_at, created_at, overbooked,
          (SELECT doctor_id FROM slot) AS doctor_id;

-- name: slot_state
-- Only used to explain why a conditional booking or a waitlist join wrote nothing.
SELECT s.start_at, s.opens_at, s.capacity, s.booked_count, s.doctor_id,
       s.min_notice_minutes,
       EXISTS (SELECT 1 FROM appointment a
                WHERE a.slot_id = s.id AND a.patient_id = $2
                  AND a.status IN ('BOOKED', 'HELD')) AS mine,
       (SELECT b.blocked_until FROM patient_block b
         WHERE b.patient_id = $2 AND b.blocked_until > $3) AS blocked_until
  FROM time_slot s WHERE s.id = $1;

-- name: get_appointment
-- One appointment with its period and its slot's doctor.
SELECT a.id, a.slot_id, a.patient_id, a.status, lower(a.period) AS start_at,
       upper(a.period) AS end_at, a.created_at, a.overbooked, s.doctor_id,
       a.hold_expires_at, a.price_amount, a.price_currency, a.overpaid_refund
  FROM appointment a JOIN time_slot s ON s.id = a.slot_id
 WHERE a.id = $1;

-- name: cancel
-- The capacity is released only when this statement flipped BOOKED (or a live
-- HELD, 0054) -> CANCELLED: an overbooked seat to the overbooked counter, an
-- ordinary one to booked_count. A hold past its end is not cancelled here: it
-- expires (the caller flips it, releasing its seat once).
WITH appt AS (
    UPDATE appointment SET status = 'CANCELLED', cancelled_at = $2, hold_expires_at = NULL
     WHERE id = $1 AND lower(period) > $2
       AND (status = 'BOOKED' OR (status = 'HELD' AND hold_expires_at > $2))
    RETURNING id, slot_id, patient_id, status, lower(period) AS start_at,
              upper(period) AS end_at, created_at, lineage_id, overbooked, price_amount,
              price_currency, overpaid_refund
), released AS (
    UPDATE time_slot SET booked_count = booked_count - (NOT appt.overbooked)::int,
                         overbooked_count = overbooked_count - appt.overbooked::int
      FROM appt WHERE time_slot.id = appt.slot_id
    RETURNING time_slot.doctor_id
)
SELECT appt.*, released.doctor_id FROM appt, released;

-- name: set_reminder_job
-- Remember the reminder job of a booking (cancelled with it).
UPDATE appointment SET reminder_job_id = $2 WHERE id = $1;

-- name: reminder_job_of
-- The reminder job of an appointment, to cancel it.
SELECT reminder_job_id FROM appointment WHERE id = $1;

-- name: mark_reminded
-- At most one reminder per appointment, and none once it is cancelled.
UPDATE appointment a SET reminder_sent_at = $2
  FROM time_slot s
 WHERE a.id = $1 AND s.id = a.slot_id AND a.status = 'BOOKED' AND a.reminder_sent_at IS NULL
RETURNING a.id, a.slot_id, a.patient_id, a.status, lower(a.period) AS start_at,
          upper(a.period) AS end_at, a.created_at, s.doctor_id, a.lineage_id;

-- name: patient_appointments
-- A patient's appointments soonest first, after a keyset position (start, id):
-- an index range scan of appointment_patient_start, never a sort or an OFFSET.
SELECT a.id, a.slot_id, a.patient_id, a.status, lower(a.period) AS start_at,
       upper(a.period) AS end_at, a.created_at, a.overbooked, s.doctor_id,
       a.hold_expires_at, a.price_amount, a.price_currency, a.overpaid_refund
  FROM appointment a JOIN time_slot s ON s.id = a.slot_id
 WHERE a.patient_id = $1 AND (lower(a.period), a.id) > ($3::timestamptz, $4::bigint)
   AND ($2::text IS NULL
        OR CASE WHEN a.status = 'HELD' AND a.hold_expires_at <= $6 THEN 'EXPIRED'
                ELSE a.status END = $2::text)
 ORDER BY lower(a.period), a.id
 LIMIT $5;

-- name: agenda_slots
-- Every slot of a doctor's local day (full, past or not open yet), in time order.
SELECT id, doctor_id, start_at, end_at, opens_at, capacity, booked_count, overbook_limit,
       overbooked_count
  FROM time_slot
 WHERE doctor_id = $1 AND start_at >= $2 AND start_at < $3
 ORDER BY start_at;

-- name: agenda_appointments
-- The appointments (cancelled ones too) of the agenda's slots.
SELECT id, slot_id, patient_id, status, overbooked, hold_expires_at
  FROM appointment WHERE slot_id = ANY($1::bigint[])
 ORDER BY slot_id, id;

-- name: cancel_for_reschedule
-- The first step of a reschedule: the old appointment leaves BOOKED (and its row
-- stays locked until the new one is booked in the same transaction).
UPDATE appointment SET status = 'CANCELLED', cancelled_at = $2
 WHERE id = $1 AND status = 'BOOKED' AND lower(period) > $2
RETURNING id, slot_id, patient_id, status, lower(period) AS start_at,
          upper(period) AS end_at, created_at, overbooked;

-- name: lock_slots
-- Both slots of a reschedule locked in id order, so two reschedules crossing the
-- same two slots in opposite directions wait for each other instead of deadlocking.
SELECT id FROM time_slot WHERE id = ANY($1::bigint[]) ORDER BY id FOR NO KEY UPDATE;

-- name: release_seat
-- The seat of an appointment that just left BOOKED in this transaction, of the
-- kind it held ($2: overbooked).
UPDATE time_slot SET booked_count = booked_count - (NOT $2::boolean)::int,
                     overbooked_count = overbooked_count - $2::boolean::int
 WHERE id = $1 RETURNING doctor_id;

-- name: set_rescheduled_from
-- Link a reschedule's new appointment to the one it replaced, and to the first
-- appointment of the chain (its events' key). Returns that first appointment.
UPDATE appointment
   SET rescheduled_from = $2,
       lineage_id = (SELECT coalesce(lineage_id, id) FROM appointment WHERE id = $2)
 WHERE id = $1
RETURNING lineage_id;

-- name: join_waitlist
-- Only a full, open, future slot has a waitlist, and not for a patient holding a
-- seat in it nor one blocked by the no-show policy. FOR SHARE: a transaction freeing a seat (it locks the slot row)
-- either commits first, and this sees the seat (slot_available, no row), or
-- waits for this entry and gives the seat to it.
WITH slot AS (
    SELECT id FROM time_slot
     WHERE id = $1 AND booked_count >= capacity AND start_at > $3 AND opens_at <= $3
       FOR SHARE
)
INSERT INTO waitlist_entry (slot_id, patient_id, created_at)
SELECT slot.id, $2, $3 FROM slot
 WHERE NOT EXISTS (SELECT 1 FROM appointment a
                    WHERE a.slot_id = $1 AND a.patient_id = $2
                      AND a.status IN ('BOOKED', 'HELD'))
   AND NOT EXISTS (SELECT 1 FROM patient_block b
                    WHERE b.patient_id = $2 AND b.blocked_until > $3)
RETURNING id, slot_id, patient_id;

-- name: waitlist_position
-- 1 for the next patient to get a freed seat.
SELECT count(*) FROM waitlist_entry WHERE slot_id = $1 AND id <= $2;

-- name: leave_waitlist
-- A patient leaves a slot's waitlist; no row when they were not on it.
DELETE FROM waitlist_entry WHERE slot_id = $1 AND patient_id = $2 RETURNING id;

-- name: waitlist_of_slot
-- Slot $1's waitlist in line order (waitlist_entry_slot_order), the first $2.
SELECT id, patient_id, created_at FROM waitlist_entry
 WHERE slot_id = $1
 ORDER BY id
 LIMIT $2;

-- name: slot_exists
-- Whether a slot exists: leaving a waitlist found no entry, 404 or not_waiting.
SELECT EXISTS (SELECT 1 FROM time_slot WHERE id = $1);

-- name: first_waiting
-- The next patient in line for a seat that was just freed (the slot row is locked
-- by the freeing transaction), and whether they can still take it (busy at that
-- time, or blocked by the no-show policy at $2).
SELECT w.id, w.patient_id, s.doctor_id, s.start_at, s.end_at,
       EXISTS (SELECT 1 FROM appointment a
                WHERE a.slot_id = w.slot_id AND a.patient_id = w.patient_id
                  AND a.status IN ('BOOKED', 'HELD')) AS holds_it,
       EXISTS (SELECT 1 FROM appointment a
                WHERE a.patient_id = w.patient_id AND a.status IN ('BOOKED', 'HELD')
                  AND a.period && tstzrange(s.start_at, s.end_at, '[)')) AS busy,
       EXISTS (SELECT 1 FROM patient_block b
                WHERE b.patient_id = w.patient_id AND b.blocked_until > $2) AS blocked
  FROM waitlist_entry w JOIN time_slot s ON s.id = w.slot_id
 WHERE w.slot_id = $1
 ORDER BY w.id
 LIMIT 1;

-- name: drop_waiting
-- The promoted waitlist entry leaves the list.
DELETE FROM waitlist_entry WHERE id = $1;

-- name: insert_repeating_schedule
-- A new repeating schedule, returned with its doctor's zone.
INSERT INTO doctor_schedule (doctor_id, first_day, weekdays, start_time, end_time,
                             slot_minutes, capacity, overbook_limit, prepaid_amount,
                             prepaid_currency, hold_minutes, min_notice_minutes,
                             max_per_patient_day, generated_until, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
RETURNING id, doctor_id, first_day, weekdays, start_time, end_time, slot_minutes, capacity,
          overbook_limit, prepaid_amount, prepaid_currency, hold_minutes, min_notice_minutes,
          max_per_patient_day, generated_until,
          (SELECT timezone FROM doctor WHERE id = $1) AS timezone;

-- name: due_schedule_ids
-- Repeating schedules not generated up to their doctor's horizon yet ($4: a bound
-- no zone's local horizon exceeds, for the index), not parked, locked by this
-- worker; other workers skip them. Ids only, so no value of a bad row can fail
-- the claim; a doctor's zone PostgreSQL does not know (local date NULL) makes
-- its schedules due, and the worker parks them.
SELECT s.id
  FROM doctor_schedule s JOIN doctor d ON d.id = s.doctor_id
 WHERE s.generated_until < $4::date
   AND s.parked_at IS NULL
   AND coalesce(s.generated_until < local_date_or_null($1::timestamptz, d.timezone) + $2::int,
                true)
 ORDER BY s.id
 LIMIT $3
   FOR UPDATE OF s SKIP LOCKED;

-- name: schedules_by_id
-- The claimed schedules with what extending them needs; zone_known is false when
-- PostgreSQL does not know the doctor's zone.
SELECT s.id, s.doctor_id, d.timezone, s.first_day, s.weekdays, s.start_time, s.end_time,
       s.slot_minutes, s.capacity, s.overbook_limit, s.prepaid_amount, s.prepaid_currency,
       s.hold_minutes, s.min_notice_minutes, s.max_per_patient_day, s.generated_until,
       local_date_or_null($2::timestamptz, d.timezone) IS NOT NULL AS zone_known
  FROM doctor_schedule s JOIN doctor d ON d.id = s.doctor_id
 WHERE s.id = ANY($1::bigint[])
 ORDER BY s.id;

-- name: park_schedule
-- A schedule the worker cannot extend even alone (core.messaging.poison): skipped from now
-- on, with the reason. Reads none of the row's values.
UPDATE doctor_schedule SET parked_at = $2, last_error = $3 WHERE id = $1;

-- name: set_generated_until
-- Only forward: a late worker never moves it back.
UPDATE doctor_schedule SET generated_until = $2 WHERE id = $1 AND generated_until < $2;

-- name: mark_no_show
-- BOOKED -> NO_SHOW once the slot started, by the slot's doctor ($2; NULL for an
-- admin). Conditional like cancel (which needs the slot not started): of a
-- no-show and a cancel racing on the row, the second finds it no longer BOOKED.
-- The seat leaves the slot's counter with the BOOKED status (the slot has
-- started: nobody can book it), so the counters keep counting BOOKED ones.
WITH appt AS (
    UPDATE appointment a SET status = 'NO_SHOW', no_show_at = $3
      FROM time_slot s
     WHERE a.id = $1 AND s.id = a.slot_id AND a.status = 'BOOKED' AND lower(a.period) <= $3
       AND ($2::bigint IS NULL OR s.doctor_id = $2::bigint)
    RETURNING a.id, a.slot_id, a.patient_id, a.status, lower(a.period) AS start_at,
              upper(a.period) AS end_at, a.created_at, a.overbooked, s.doctor_id,
              a.lineage_id
), released AS (
    UPDATE time_slot SET booked_count = booked_count - (NOT appt.overbooked)::int,
                         overbooked_count = overbooked_count - appt.overbooked::int
      FROM appt WHERE time_slot.id = appt.slot_id
    RETURNING time_slot.id
)
SELECT appt.* FROM appt, released;

-- name: lock_patient_policy
-- The patient's policy row, created if missing and locked: no-shows of one
-- patient marked at once are counted one after the other (each then sees the
-- others' committed no-shows). Returns when the admin last cleared them.
INSERT INTO patient_block (patient_id) VALUES ($1)
ON CONFLICT (patient_id) DO UPDATE SET patient_id = EXCLUDED.patient_id
RETURNING cleared_at;

-- name: apply_no_show_policy
-- Blocks the patient (row locked by lock_patient_policy) for $4 days from their
-- last no-show when they have at least $3 no-shows of slots starting after $2
-- (90 days ago) and marked after $5 (the admin's last clearing, NULL: none);
-- never shortens a block. Walks appointment_patient_start.
UPDATE patient_block b
   SET blocked_until = greatest(b.blocked_until, n.last_at + make_interval(days => $4::int))
  FROM (SELECT count(*) AS n, max(lower(a.period)) AS last_at FROM appointment a
         WHERE a.patient_id = $1 AND lower(a.period) > $2 AND a.status = 'NO_SHOW'
           AND ($5::timestamptz IS NULL OR a.no_show_at > $5::timestamptz)) n
 WHERE b.patient_id = $1 AND n.n >= $3
RETURNING b.blocked_until;

-- name: clear_no_shows
-- An admin's override: the block ends now and the no-shows marked so far stop
-- counting.
INSERT INTO patient_block (patient_id, blocked_until, cleared_at) VALUES ($1, NULL, $2)
ON CONFLICT (patient_id) DO UPDATE SET blocked_until = NULL, cleared_at = $2;

-- name: no_show_standing
-- What the console shows of a patient: no-shows counted by the policy at $2
-- (slots starting within 90 days, marked after the last clearing), all their
-- no-shows, and the block in force.
SELECT count(*) FILTER (WHERE lower(a.period) > $2::timestamptz - interval '90 days'
                          AND (b.cleared_at IS NULL OR a.no_show_at > b.cleared_at)) AS counted,
       count(*) AS total,
       (SELECT blocked_until FROM patient_block WHERE patient_id = $1
           AND blocked_until > $2) AS blocked_until
  FROM appointment a LEFT JOIN patient_block b ON b.patient_id = a.patient_id
 WHERE a.patient_id = $1 AND a.status = 'NO_SHOW';

-- name: put_calendar_link
-- The owner's link: a new one replaces the row, so the previous URL stops working.
INSERT INTO calendar_link (owner_kind, owner_id, token_sha256, created_at)
VALUES ($1, $2, $3, $4)
ON CONFLICT (owner_kind, owner_id)
DO UPDATE SET token_sha256 = EXCLUDED.token_sha256, created_at = EXCLUDED.created_at;

-- name: calendar_link_owner
-- Whose feed a URL's secret opens (by its SHA-256); no row for an unknown or a
-- replaced link.
SELECT owner_kind, owner_id FROM calendar_link WHERE token_sha256 = $1;

-- name: calendar_feed
-- A feed in one statement, of a patient ($3 = 'patient': their appointments
-- starting from $2 on) or of a doctor ($3 = 'doctor': the doctor's slots starting
-- from $2 on, uq_doctor_start, then each slot's appointments; a chain moved to
-- another doctor leaves its last appointment here as cancelled). The branch of
-- the other kind is a one-time filter, false: never run. Every row carries the
-- owner's current link (hash and creation; NULL without one); per reschedule
-- chain, its latest appointment (a cancelled one only if cancelled since $2),
-- with the chain's first appointment (root: the event's UID) and the number of
-- moves before it (depth). A chain is walked back by primary key, always to a
-- lower id (a reschedule's new appointment is a new row), and is a few moves
-- long. With no appointment, one row with NULL event columns.
WITH RECURSIVE owned AS (
    SELECT a.id
      FROM appointment a
     WHERE $3::text = 'patient' AND a.patient_id = $1 AND lower(a.period) >= $2
    UNION ALL
    SELECT a.id
      FROM time_slot s
      JOIN appointment a ON a.slot_id = s.id
     WHERE $3::text = 'doctor' AND s.doctor_id = $1 AND s.start_at >= $2
), mine AS (
    SELECT a.id, a.rescheduled_from, a.status, lower(a.period) AS start_at,
           upper(a.period) AS end_at, a.created_at, a.cancelled_at, a.patient_id,
           s.doctor_id, d.name AS doctor_name, a.hold_expires_at, a.settled_at
      FROM owned o
      JOIN appointment a ON a.id = o.id
      JOIN time_slot s ON s.id = a.slot_id
      JOIN doctor d ON d.id = s.doctor_id
     WHERE a.status <> 'CANCELLED' OR a.cancelled_at >= $2
), chain AS (
    SELECT id AS member, id AS root, rescheduled_from AS prev, 0 AS depth FROM mine
    UNION ALL
    SELECT c.member, p.id, p.rescheduled_from, c.depth + 1
      FROM chain c JOIN appointment p ON p.id = c.prev AND p.id < c.root
), events AS (
    SELECT DISTINCT ON (r.root) r.root, r.depth, m.*
      FROM (SELECT DISTINCT ON (member) member, root, depth
              FROM chain ORDER BY member, depth DESC) r
      JOIN mine m ON m.id = r.member
     ORDER BY r.root, r.depth DESC
)
SELECT l.token_sha256, l.created_at AS link_created_at, e.*
  FROM (SELECT 1) AS one
  LEFT JOIN calendar_link l ON l.owner_kind = $3::text AND l.owner_id = $1
  LEFT JOIN events e ON true
 ORDER BY e.start_at, e.id;

-- Prepaid appointments (0054): holds, their expiry, payments and refunds. Every
-- flip of a HELD row is conditional on status = 'HELD' and releases (or keeps)
-- the seat in the same statement, so of a payment, an expiry and a cancel racing
-- on one row, the first to lock it wins and the others find nothing to flip.

-- name: expire_holds_of
-- Before a booking or a cancel gives up: flip the holds past their end at $3 of
-- slot $1 or of patient $2 (the partial index appointment_held_expiry holds only
-- live holds), and give their seats back, per slot in one UPDATE (a slot row is
-- updated once per statement), so an expired hold never refuses anyone even
-- before its job ran.
WITH appt AS (
    UPDATE appointment SET status = 'EXPIRED'
     WHERE status = 'HELD' AND hold_expires_at <= $3 AND (slot_id = $1 OR patient_id = $2)
    RETURNING id, slot_id, patient_id, status, lower(period) AS start_at,
              upper(period) AS end_at, created_at, lineage_id, overbooked, hold_expires_at,
              price_amount, price_currency
), released AS (
    UPDATE time_slot s SET booked_count = s.booked_count - g.n
      FROM (SELECT slot_id, count(*)::int AS n FROM appt GROUP BY slot_id) g
     WHERE s.id = g.slot_id
    RETURNING s.id, s.doctor_id
)
SELECT appt.*, released.doctor_id FROM appt JOIN released ON released.id = appt.slot_id;

-- name: expire_hold
-- The per-hold expiry job: HELD -> EXPIRED only once its end $2 has come (a
-- payment that locked the row first made it BOOKED: nothing to do), and the seat
-- back in the same statement.
WITH appt AS (
    UPDATE appointment SET status = 'EXPIRED'
     WHERE id = $1 AND status = 'HELD' AND hold_expires_at <= $2
    RETURNING id, slot_id, patient_id, status, lower(period) AS start_at,
              upper(period) AS end_at, created_at, lineage_id, overbooked, hold_expires_at,
              price_amount, price_currency
), released AS (
    UPDATE time_slot SET booked_count = booked_count - 1
      FROM appt WHERE time_slot.id = appt.slot_id
    RETURNING time_slot.doctor_id
)
SELECT appt.*, released.doctor_id FROM appt, released;

-- name: sweep_holds
-- The safety net behind the jobs: a batch of holds past their end, skipping rows
-- a payment, a cancel or another sweeper holds; seats back per slot.
WITH due AS (
    SELECT id FROM appointment
     WHERE status = 'HELD' AND hold_expires_at <= $1
     ORDER BY hold_expires_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), appt AS (
    UPDATE appointment a SET status = 'EXPIRED'
      FROM due WHERE a.id = due.id
    RETURNING a.id, a.slot_id, a.patient_id, a.status, lower(a.period) AS start_at,
              upper(a.period) AS end_at, a.created_at, a.lineage_id, a.overbooked,
              a.hold_expires_at, a.price_amount, a.price_currency
), released AS (
    UPDATE time_slot s SET booked_count = s.booked_count - g.n
      FROM (SELECT slot_id, count(*)::int AS n FROM appt GROUP BY slot_id) g
     WHERE s.id = g.slot_id
    RETURNING s.id, s.doctor_id
)
SELECT appt.*, released.doctor_id FROM appt JOIN released ON released.id = appt.slot_id;

-- name: first_hold_end
-- When slot $1 has a seat again at the latest: its earliest hold's end (NULL:
-- none), the bound of the gate's full mark.
SELECT min(hold_expires_at) FROM appointment WHERE slot_id = $1 AND status = 'HELD';

-- name: insert_payment
-- The gateway may deliver a webhook many times: the second insert is a no-op.
-- No row either for an appointment that does not exist (the caller tells).
INSERT INTO appointment_payment (appointment_id, provider_txn_id, type, amount, created_at)
SELECT $1, $2, 'PAYMENT', $3, $4 WHERE EXISTS (SELECT 1 FROM appointment WHERE id = $1)
ON CONFLICT ON CONSTRAINT uq_appointment_payment_txn DO NOTHING
RETURNING id;

-- name: confirm_hold
-- Compare-and-set: only a live HELD whose price the payment $2 covers becomes
-- BOOKED (never on a payment of nothing).
WITH appt AS (
    UPDATE appointment SET status = 'BOOKED', hold_expires_at = NULL, settled_at = $3
     WHERE id = $1 AND status = 'HELD' AND hold_expires_at > $3 AND price_amount <= $2 AND $2 > 0
    RETURNING id, slot_id, patient_id, status, lower(period) AS start_at,
              upper(period) AS end_at, created_at, lineage_id, overbooked, hold_expires_at,
              price_amount, price_currency
)
SELECT appt.*, s.doctor_id FROM appt JOIN time_slot s ON s.id = appt.slot_id;

-- name: set_overpaid_refund
-- The excess of the payment that just confirmed appointment $1 (0: paid exactly).
UPDATE appointment SET overpaid_refund = $2 WHERE id = $1;

-- name: settle_payment
-- What the payment $1 settled: the price due, the part that goes back, the outcome.
UPDATE appointment_payment SET amount_due = $2, refund_due = $3, outcome = $4 WHERE id = $1;

-- name: refund_recorded
-- Whether the gateway's refund transaction is recorded already.
SELECT EXISTS (SELECT 1 FROM appointment_payment WHERE provider_txn_id = $1);

-- name: insert_refund
-- Record a refund once per gateway transaction id.
INSERT INTO appointment_payment (appointment_id, provider_txn_id, type, amount, gateway_ref,
                                 created_at)
VALUES ($1, $2, 'REFUND', $3, $4, $5)
ON CONFLICT ON CONSTRAINT uq_appointment_payment_txn DO NOTHING
RETURNING id;

-- Booking rules and series (0057).

-- name: lock_patient_day
-- The daily limit's lock of (doctor $1, patient $2, local day $3): taken before
-- the day's appointments are counted, held to the commit, so bookings of one
-- patient's day count one after the other. Always the last lock a booking
-- takes after its slot rows, never before one (no cycle with a series, which
-- locks all its slots first).
INSERT INTO appointment_day_lock (doctor_id, patient_id, day, locked_at)
VALUES ($1, $2, $3, $4)
ON CONFLICT (doctor_id, patient_id, day) DO UPDATE SET locked_at = EXCLUDED.locked_at;

-- name: count_patient_day
-- The patient's $2 live appointments (BOOKED, or HELD not past its end at $5)
-- with doctor $1 starting in [$3, $4): one local day, by appointment_patient_start.
SELECT count(*)::int
  FROM appointment a JOIN time_slot s ON s.id = a.slot_id
 WHERE a.patient_id = $2 AND lower(a.period) >= $3 AND lower(a.period) < $4
   AND s.doctor_id = $1
   AND (a.status = 'BOOKED' OR (a.status = 'HELD' AND a.hold_expires_at > $5));

-- name: insert_series
-- A new series of patient $1; its appointments are linked by set_series.
INSERT INTO appointment_series (patient_id, created_at) VALUES ($1, $2) RETURNING id;

-- name: set_series
-- The appointments $2 a series $1 booked.
UPDATE appointment SET series_id = $1 WHERE id = ANY($2::bigint[]);

-- name: get_series
-- A series' patient (no row: no such series).
SELECT patient_id FROM appointment_series WHERE id = $1;

-- name: series_appointments
-- The appointments of series $1, in time order.
SELECT a.id, a.slot_id, a.patient_id, a.status, lower(a.period) AS start_at,
       upper(a.period) AS end_at, a.created_at, a.overbooked, s.doctor_id,
       a.hold_expires_at, a.price_amount, a.price_currency, a.overpaid_refund
  FROM appointment a JOIN time_slot s ON s.id = a.slot_id
 WHERE a.series_id = $1
 ORDER BY lower(a.period), a.id;

-- name: lock_slots_for_series
-- A series' slots locked in id order before any is booked (as a reschedule
-- locks its two), with what its daily limits need.
SELECT id, doctor_id, start_at, max_per_patient_day
  FROM time_slot WHERE id = ANY($1::bigint[]) ORDER BY id FOR NO KEY UPDATE;

-- name: slot_change_marks
-- Where the change feed (appointments/change_feed.py) starts: the newest outbox
-- id and the newest slot id (0 when none), and the snapshot they were read in.
SELECT coalesce((SELECT max(id) FROM outbox), 0) AS event_id,
       coalesce((SELECT max(id) FROM time_slot), 0) AS slot_id,
       txid_current_snapshot()::text AS snapshot;

-- name: slot_changes_since
-- The doctors whose slot lists changed since the last poll: every event of the
-- module's topics $6 (each names its doctor; a move also changed its old
-- appointment's doctor's list) and every slot generated, among the rows after
-- the look-back's marks ($1 an outbox id, $2 a slot id) that the last poll did
-- not see: after its marks ($3, $4), or committed since its snapshot $5 (a lower
-- id taken by a transaction that committed later). With the next marks and this
-- snapshot. A row's 32-bit xmin is widened to the 64-bit id the snapshot counts
-- in: the current epoch, or the one before when it is past the next id's low
-- half. Two primary-key range scans of what was written since the look-back.
WITH snap AS (
    SELECT txid_current_snapshot() AS now_snap,
           txid_snapshot_xmax(txid_current_snapshot()) AS nx
), events AS (
    SELECT o.id, o.topic, o.payload FROM outbox o, snap
     WHERE o.id > $1
       AND (o.id > $3 OR NOT txid_visible_in_snapshot(
               (((snap.nx >> 32) - (o.xmin::text::bigint > (snap.nx & 4294967295))::int) << 32)
                   + o.xmin::text::bigint,
               $5::text::txid_snapshot))
), slots AS (
    SELECT t.id, t.doctor_id FROM time_slot t, snap
     WHERE t.id > $2
       AND (t.id > $4 OR NOT txid_visible_in_snapshot(
               (((snap.nx >> 32) - (t.xmin::text::bigint > (snap.nx & 4294967295))::int) << 32)
                   + t.xmin::text::bigint,
               $5::text::txid_snapshot))
), changed AS (
    SELECT (payload->>'doctorId')::bigint AS doctor_id FROM events WHERE topic = ANY($6)
    UNION
    SELECT s.doctor_id FROM events e
      JOIN appointment a ON a.id = (e.payload->>'rescheduledFrom')::bigint
      JOIN time_slot s ON s.id = a.slot_id
     WHERE e.topic = ANY($6) AND e.payload ? 'rescheduledFrom'
    UNION
    SELECT doctor_id FROM slots
)
SELECT greatest((SELECT max(id) FROM events), $3) AS event_id,
       greatest((SELECT max(id) FROM slots), $4) AS slot_id,
       (SELECT now_snap::text FROM snap) AS snapshot,
       coalesce((SELECT array_agg(doctor_id) FROM changed WHERE doctor_id IS NOT NULL),
                '{}') AS doctors;
