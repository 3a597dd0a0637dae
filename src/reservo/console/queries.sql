-- The console's read-only figures. Each reads through an index and caps its
-- counts, so the overview stays fast on the benchmark's tables (millions of
-- slots, bets and jobs). Every action goes through the modules' use cases;
-- the only writes here are the console's own signed-out sessions.

-- name: settling_matches
-- Matches whose settlement is running (partial index betting_match_settling),
-- with their settled bets and their still-pending legs (betting_selection_pending,
-- counted up to $2).
SELECT m.id, m.home, m.away, m.result_at, m.settled_bets,
       (SELECT count(*) FROM (SELECT 1 FROM betting_selection s
                               WHERE s.match_id = m.id AND s.status = 'PENDING'
                               LIMIT $2) p) AS pending
  FROM betting_match m
 WHERE m.settlement_status = 'SETTLING'
 ORDER BY m.id
 LIMIT $1;

-- name: jobs_due
-- Jobs whose time has come but which have not started (scheduled_job_pending,
-- counted up to $2), how late the oldest of them is, and the running ones
-- (scheduled_job_running, counted up to $2).
SELECT (SELECT count(*) FROM (SELECT 1 FROM scheduled_job
                               WHERE status IN ('SCHEDULED', 'QUEUED', 'FAILED')
                                 AND run_at <= $1
                               LIMIT $2) d) AS due,
       (SELECT min(run_at) FROM scheduled_job
         WHERE status IN ('SCHEDULED', 'QUEUED', 'FAILED')) AS oldest_pending,
       (SELECT count(*) FROM (SELECT 1 FROM scheduled_job WHERE status = 'RUNNING'
                               LIMIT $2) r) AS running;

-- name: latest_appointments
-- The newest appointments (primary key, backwards), with their slot's start.
SELECT a.id, a.slot_id, a.patient_id, a.status, a.created_at, lower(a.period) AS start_at,
       t.doctor_id
  FROM appointment a
  JOIN time_slot t ON t.id = a.slot_id
 ORDER BY a.id DESC
 LIMIT $1;

-- name: pending_legs
-- The pending legs of each match of $1 (betting_selection_pending), each counted
-- up to $2: the settlement's progress without counting over every bet.
SELECT m.id,
       (SELECT count(*) FROM (SELECT 1 FROM betting_selection s
                               WHERE s.match_id = m.id AND s.status = 'PENDING'
                               LIMIT $2) p) AS pending
  FROM unnest($1::bigint[]) AS m(id);

-- name: job_status_counts
-- Jobs per status, each counted up to $1 through index scheduled_job_status_id
-- (status, id): a capped index range per status, never a count of the table.
SELECT s.status,
       (SELECT count(*) FROM (SELECT 1 FROM scheduled_job j
                               WHERE j.status = s.status LIMIT $1) c) AS n
  FROM unnest($2::text[]) WITH ORDINALITY AS s(status, pos)
 ORDER BY s.pos;

-- name: dead_letters_waiting
-- Per consumer, its dead letters not replayed yet, counted up to $1: the
-- consumers by a skip scan of dead_letter_consumer_id (one index probe per
-- consumer, however many letters), then a capped walk of that index per
-- consumer (ordered by it, so the planner walks it rather than the table).
WITH RECURSIVE consumers AS (
    (SELECT consumer FROM dead_letter ORDER BY consumer LIMIT 1)
    UNION ALL
    SELECT (SELECT d.consumer FROM dead_letter d WHERE d.consumer > c.consumer
             ORDER BY d.consumer LIMIT 1)
      FROM consumers c
     WHERE c.consumer IS NOT NULL
)
SELECT c.consumer,
       (SELECT count(*) FROM (SELECT 1 FROM dead_letter d
                               WHERE d.consumer = c.consumer AND d.replayed_at IS NULL
                               ORDER BY d.consumer, d.id
                               LIMIT $1) w) AS waiting
  FROM consumers c
 WHERE c.consumer IS NOT NULL
 ORDER BY c.consumer;

-- name: session_revoked
-- Whether the console session $1 was signed out (primary key lookup; every
-- console request asks before trusting its cookie).
SELECT EXISTS (SELECT 1 FROM console_session_revoked WHERE session_id = $1);

-- name: revoke_session
-- Signs the console session $1 out until its expiry $2, and deletes the
-- revocations of sessions expired by $3 (console_session_revoked_expires_at):
-- their cookies are refused by their own exp already.
WITH expired AS (
    DELETE FROM console_session_revoked WHERE expires_at <= $3
)
INSERT INTO console_session_revoked (session_id, expires_at)
VALUES ($1, $2)
ON CONFLICT (session_id) DO NOTHING;

-- name: find_doctors
-- Doctors whose name matches the ILIKE pattern $1 (the operator's text with its
-- wildcards escaped), in name order after the keyset position ($2, $3):
-- doctor_name_trgm for a selective text, a walk of doctor_name_id otherwise.
SELECT id, name, timezone, specialty
  FROM doctor
 WHERE name ILIKE $1 AND (name, id) > ($2::text, $3::bigint)
 ORDER BY name, id
 LIMIT $4;

-- name: doctors_by_id
-- The doctors of $1 (primary key): their names and zones, for an agenda's
-- heading, its default day and a patient's list.
SELECT id, name, timezone, specialty FROM doctor WHERE id = ANY($1::bigint[]);

-- name: find_cars
-- Cars whose model or city matches the ILIKE pattern $1 (car_model_trgm,
-- car_city_trgm), in model order after the keyset position ($2, $3).
SELECT id, plate, model, city, daily_price
  FROM car
 WHERE (model ILIKE $1 OR city ILIKE $1) AND (model, id) > ($2::text, $3::bigint)
 ORDER BY model, id
 LIMIT $4;

-- name: find_matches
-- Matches whose home team, away team or external id matches the ILIKE pattern
-- $1 (a bitmap OR of the three trigram indexes), latest kick-off first, before
-- the keyset position ($2, $3).
SELECT id, external_id, home, away, starts_at, result_status, home_score, away_score,
       settlement_status, settled_bets
  FROM betting_match
 WHERE (home ILIKE $1 OR away ILIKE $1 OR external_id ILIKE $1)
   AND (starts_at, id) < ($2::timestamptz, $3::bigint)
 ORDER BY starts_at DESC, id DESC
 LIMIT $4;

-- name: find_contacts
-- The users whose contact e-mail matches the ILIKE pattern $1
-- (contact_email_trgm), by user id after $2.
SELECT user_id
  FROM contact
 WHERE email ILIKE $1 AND user_id > $2
 ORDER BY user_id
 LIMIT $3;

-- name: people
-- What reservo holds about each user of $1, in that order: the contact (primary
-- key), whether they have appointments (appointment_patient_start) and bookings
-- (booking_customer_created): one index probe each, no count.
SELECT u.id AS user_id, c.email, c.phone,
       EXISTS (SELECT 1 FROM appointment a WHERE a.patient_id = u.id) AS patient,
       EXISTS (SELECT 1 FROM booking b WHERE b.customer_id = u.id) AS customer
  FROM unnest($1::bigint[]) WITH ORDINALITY AS u(id, pos)
  LEFT JOIN contact c ON c.user_id = u.id
 ORDER BY u.pos;

-- name: wallet_accounts_of
-- The customer wallet accounts of each owner of $1 (wallet_account_owner), at
-- most $2 per owner, oldest first.
SELECT a.owner_id, a.id, a.currency, a.balance
  FROM unnest($1::bigint[]) AS u(id)
 CROSS JOIN LATERAL (SELECT w.owner_id, w.id, w.currency, w.balance
                       FROM wallet_account w
                      WHERE w.owner_id = u.id AND w.kind = 'CUSTOMER'
                      ORDER BY w.id
                      LIMIT $2) a
 ORDER BY a.owner_id, a.id;
