-- Named queries of the rentals module. Every state change is a conditional
-- UPDATE or an INSERT a constraint may refuse; nothing is decided from a SELECT.

-- name: insert_car
INSERT INTO car (plate, model, city, daily_price, host_id, created_at)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING id, plate, model, city, daily_price, host_id;

-- name: get_car
SELECT id, plate, model, city, daily_price, host_id FROM car WHERE id = $1;

-- name: search_available
-- Cars of a city with no booking that occupies any part of $2 (the stored
-- period a new booking would take, buffer included). A HOLD past its expiry
-- does not count even before its status flips.
SELECT c.id, c.plate, c.model, c.city, c.daily_price, c.host_id
  FROM car c
 WHERE c.city = $1
   AND NOT EXISTS (
       SELECT 1 FROM booking b
        WHERE b.car_id = c.id
          AND b.status IN ('HOLD', 'CONFIRMED', 'ON_TRIP')
          AND b.period && $2::tstzrange
          AND (b.status <> 'HOLD' OR b.hold_expires_at > $3))
 ORDER BY c.daily_price, c.id
 LIMIT $4;

-- name: expire_overlapping
-- Before inserting, flip the stale holds the new period overlaps, in the same
-- transaction, so an expired hold never makes a customer see car_unavailable.
UPDATE booking b SET status = 'EXPIRED', updated_at = $3
  FROM car c
 WHERE b.car_id = $1 AND c.id = b.car_id
   AND b.status = 'HOLD' AND b.hold_expires_at <= $3
   AND b.period && $2::tstzrange
RETURNING b.id, b.car_id, b.customer_id, lower(b.period) AS from_at, b.return_at,
          b.status, b.deposit_amount, b.refund_amount, b.hold_expires_at, b.created_at,
          c.host_id;

-- name: insert_hold
-- A plain INSERT: ex_car_period refuses it when an active booking overlaps.
INSERT INTO booking (car_id, customer_id, period, return_at, status, deposit_amount,
                     hold_expires_at, created_at, updated_at)
VALUES ($1, $2, $3::tstzrange, $4, 'HOLD', $5, $6, $7, $7)
RETURNING id, car_id, customer_id, lower(period) AS from_at, return_at, status,
          deposit_amount, refund_amount, hold_expires_at, created_at;

-- name: get_booking
SELECT b.id, b.car_id, b.customer_id, lower(b.period) AS from_at, b.return_at, b.status,
       b.deposit_amount, b.refund_amount, b.hold_expires_at, b.created_at, c.host_id
  FROM booking b JOIN car c ON c.id = b.car_id
 WHERE b.id = $1;

-- name: insert_deposit
-- The gateway may deliver a webhook many times: the second insert is a no-op.
INSERT INTO payment (booking_id, provider_txn_id, type, amount, created_at)
VALUES ($1, $2, 'DEPOSIT', $3, $4)
ON CONFLICT ON CONSTRAINT uq_payment_provider_txn DO NOTHING
RETURNING id;

-- name: confirm
-- Compare-and-set: only a live HOLD whose deposit is covered becomes CONFIRMED.
UPDATE booking b SET status = 'CONFIRMED', hold_expires_at = NULL, updated_at = $3
  FROM car c
 WHERE b.id = $1 AND c.id = b.car_id
   AND b.status = 'HOLD' AND b.hold_expires_at > $3 AND b.deposit_amount <= $2
RETURNING b.id, b.car_id, b.customer_id, lower(b.period) AS from_at, b.return_at,
          b.status, b.deposit_amount, b.refund_amount, b.hold_expires_at, b.created_at,
          c.host_id;

-- name: cancel
-- Lock the row first so `previous` is the status this UPDATE replaced (a
-- concurrent cancel waits here and then finds nothing to cancel).
WITH previous AS (
    SELECT id, status FROM booking WHERE id = $1 FOR UPDATE
)
UPDATE booking b SET status = 'CANCELLED', hold_expires_at = NULL, updated_at = $2,
                     cancelled_by = $3
  FROM previous p, car c
 WHERE b.id = p.id AND c.id = b.car_id
   AND (p.status = 'CONFIRMED' OR (p.status = 'HOLD' AND b.hold_expires_at > $2))
RETURNING b.id, b.car_id, b.customer_id, lower(b.period) AS from_at, b.return_at,
          b.status, b.deposit_amount, b.refund_amount, b.created_at, c.host_id,
          p.status AS previous_status, NULL::timestamptz AS hold_expires_at;

-- name: set_refund
UPDATE booking SET refund_amount = $2 WHERE id = $1;

-- name: transition
-- Pickup (CONFIRMED -> ON_TRIP) and return (ON_TRIP -> COMPLETED).
UPDATE booking b SET status = $3, updated_at = $4
  FROM car c
 WHERE b.id = $1 AND c.id = b.car_id AND b.status = $2
RETURNING b.id, b.car_id, b.customer_id, lower(b.period) AS from_at, b.return_at,
          b.status, b.deposit_amount, b.refund_amount, b.hold_expires_at, b.created_at,
          c.host_id;

-- name: expire_one
-- The per-hold expiry job: a no-op once the hold was paid, cancelled or expired.
UPDATE booking b SET status = 'EXPIRED', updated_at = $2
  FROM car c
 WHERE b.id = $1 AND c.id = b.car_id AND b.status = 'HOLD' AND b.hold_expires_at <= $2
RETURNING b.id, b.car_id, b.customer_id, lower(b.period) AS from_at, b.return_at,
          b.status, b.deposit_amount, b.refund_amount, b.hold_expires_at, b.created_at,
          c.host_id;

-- name: sweep
-- The safety net: a batch of expired holds, skipping rows another sweeper or
-- a booking transaction holds, so instances never wait on each other.
WITH due AS (
    SELECT id FROM booking
     WHERE status = 'HOLD' AND hold_expires_at <= $1
     ORDER BY hold_expires_at
     LIMIT $2
     FOR UPDATE SKIP LOCKED
)
UPDATE booking b SET status = 'EXPIRED', updated_at = $1
  FROM due, car c
 WHERE b.id = due.id AND c.id = b.car_id
RETURNING b.id, b.car_id, b.customer_id, lower(b.period) AS from_at, b.return_at,
          b.status, b.deposit_amount, b.refund_amount, b.hold_expires_at, b.created_at,
          c.host_id;

-- name: refund_recorded
SELECT EXISTS (SELECT 1 FROM payment WHERE provider_txn_id = $1);

-- name: insert_refund
INSERT INTO payment (booking_id, provider_txn_id, type, amount, gateway_ref, created_at)
VALUES ($1, $2, 'REFUND', $3, $4, $5)
ON CONFLICT ON CONSTRAINT uq_payment_provider_txn DO NOTHING
RETURNING id;
