-- Named queries of the rentals module. Every state change is a conditional
-- UPDATE or an INSERT a constraint may refuse; nothing is decided from a SELECT.

-- name: insert_car
-- A new car of a host.
INSERT INTO car (plate, model, city, daily_price, host_id, created_at)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING id, plate, model, city, daily_price, host_id;

-- name: get_car
-- One car by id.
SELECT id, plate, model, city, daily_price, host_id FROM car WHERE id = $1;

-- name: search_available
-- Cars of a city with no booking that occupies any part of $2 (the stored
-- period a new booking would take, buffer included). A HOLD past its expiry
-- does not count even before its status flips. Keyset page: the cars after
-- ($5, $6) in (daily_price, id) order, (0, 0) for the first page (a price is
-- positive), walked on car_city (city, daily_price, id).
SELECT c.id, c.plate, c.model, c.city, c.daily_price, c.host_id
  FROM car c
 WHERE c.city = $1
   AND (c.daily_price, c.id) > ($5::bigint, $6::bigint)
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
          b.status, b.deposit_amount, b.refund_amount, b.overpaid_refund, b.hold_expires_at,
          b.created_at, c.host_id;

-- name: insert_hold
-- A plain INSERT: ex_car_period refuses it when an active booking overlaps.
INSERT INTO booking (car_id, customer_id, period, return_at, status, deposit_amount,
                     hold_expires_at, created_at, updated_at)
VALUES ($1, $2, $3::tstzrange, $4, 'HOLD', $5, $6, $7, $7)
RETURNING id, car_id, customer_id, lower(period) AS from_at, return_at, status,
          deposit_amount, refund_amount, overpaid_refund, hold_expires_at, created_at;

-- name: get_booking
-- One booking with its period start and its car's host.
SELECT b.id, b.car_id, b.customer_id, lower(b.period) AS from_at, b.return_at, b.status,
       b.deposit_amount, b.refund_amount, b.overpaid_refund, b.hold_expires_at, b.created_at,
       c.host_id, b.hold_extended_at
  FROM booking b JOIN car c ON c.id = b.car_id
 WHERE b.id = $1;

-- name: insert_deposit
-- The gateway may deliver a webhook many times: the second insert is a no-op.
INSERT INTO payment (booking_id, provider_txn_id, type, amount, created_at)
VALUES ($1, $2, 'DEPOSIT', $3, $4)
ON CONFLICT ON CONSTRAINT uq_payment_provider_txn DO NOTHING
RETURNING id;

-- name: confirm
-- Compare-and-set: only a live HOLD whose deposit the payment $2 covers becomes
-- CONFIRMED; a payment of nothing never does (even for a deposit of 0 stored
-- before every deposit was at least 1).
UPDATE booking b SET status = 'CONFIRMED', hold_expires_at = NULL, updated_at = $3
  FROM car c
 WHERE b.id = $1 AND c.id = b.car_id
   AND b.status = 'HOLD' AND b.hold_expires_at > $3 AND b.deposit_amount <= $2 AND $2 > 0
RETURNING b.id, b.car_id, b.customer_id, lower(b.period) AS from_at, b.return_at,
          b.status, b.deposit_amount, b.refund_amount, b.overpaid_refund, b.hold_expires_at,
          b.created_at, c.host_id;

-- name: settle_deposit
-- What the deposit payment $1 settled (0029): the deposit due, the part of it
-- that goes back (an excess, or all of it), and the outcome.
UPDATE payment SET amount_due = $2, refund_due = $3, outcome = $4 WHERE id = $1;

-- name: set_overpaid_refund
-- The excess of the payment that just confirmed booking $1 (0: paid exactly),
-- returned by a refund event of the same transaction (0051).
UPDATE booking SET overpaid_refund = $2 WHERE id = $1;

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
          b.status, b.deposit_amount, b.refund_amount, b.overpaid_refund, b.created_at,
          c.host_id, p.status AS previous_status, NULL::timestamptz AS hold_expires_at;

-- name: set_refund
-- The refund a cancellation owes, decided by the refund policy.
UPDATE booking SET refund_amount = $2 WHERE id = $1;

-- name: transition
-- A status flip from $2 to $3: the return (ON_TRIP -> COMPLETED); the pickup has
-- its own, with its time rule (pick_up).
UPDATE booking b SET status = $3, updated_at = $4
  FROM car c
 WHERE b.id = $1 AND c.id = b.car_id AND b.status = $2
RETURNING b.id, b.car_id, b.customer_id, lower(b.period) AS from_at, b.return_at,
          b.status, b.deposit_amount, b.refund_amount, b.overpaid_refund, b.hold_expires_at,
          b.created_at, c.host_id;

-- name: pick_up
-- Pickup (CONFIRMED -> ON_TRIP), only once the trip starts by $3 (now plus the
-- pickup lead time): a trip started months early, then returned, would take a
-- booking still ahead off the car's calendar.
UPDATE booking b SET status = 'ON_TRIP', updated_at = $2
  FROM car c
 WHERE b.id = $1 AND c.id = b.car_id AND b.status = 'CONFIRMED' AND lower(b.period) <= $3
RETURNING b.id, b.car_id, b.customer_id, lower(b.period) AS from_at, b.return_at,
          b.status, b.deposit_amount, b.refund_amount, b.overpaid_refund, b.hold_expires_at,
          b.created_at, c.host_id;

-- name: expire_one
-- The per-hold expiry job: a no-op once the hold was paid, cancelled or expired,
-- and while its (possibly extended) expiry is still ahead: an extension that
-- committed first moved hold_expires_at, and this UPDATE, waiting on the row
-- lock, re-reads it before flipping anything.
UPDATE booking b SET status = 'EXPIRED', updated_at = $2
  FROM car c
 WHERE b.id = $1 AND c.id = b.car_id AND b.status = 'HOLD' AND b.hold_expires_at <= $2
RETURNING b.id, b.car_id, b.customer_id, lower(b.period) AS from_at, b.return_at,
          b.status, b.deposit_amount, b.refund_amount, b.overpaid_refund, b.hold_expires_at,
          b.created_at, c.host_id;

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
          b.status, b.deposit_amount, b.refund_amount, b.overpaid_refund, b.hold_expires_at,
          b.created_at, c.host_id;

-- name: refund_recorded
-- Whether the gateway's refund transaction is recorded already.
SELECT EXISTS (SELECT 1 FROM payment WHERE provider_txn_id = $1);

-- name: insert_refund
-- Record a refund once per gateway transaction id.
INSERT INTO payment (booking_id, provider_txn_id, type, amount, gateway_ref, created_at)
VALUES ($1, $2, 'REFUND', $3, $4, $5)
ON CONFLICT ON CONSTRAINT uq_payment_provider_txn DO NOTHING
RETURNING id;

-- name: lock_customer_holds
-- Serialises one customer's hold transactions until commit, so the count below
-- sees every hold a concurrent request of theirs created (READ COMMITTED: the
-- next statement's snapshot is taken after the lock, i.e. after the previous
-- holder committed). The two-key form keeps this key space apart from the
-- single-key locks (migrations); hashint8 folds the id into int4 (a collision
-- only makes two customers' holds wait for each other).
SELECT pg_advisory_xact_lock(1380273748, hashint8($1));

-- name: recent_holds
-- The customer's holds created after $2 (now - window), newest first, at most $3
-- (the limit): booking_customer_created, backward; reads no more than the limit.
SELECT created_at FROM booking
 WHERE customer_id = $1 AND created_at > $2
 ORDER BY created_at DESC
 LIMIT $3;

-- name: customer_bookings
-- A customer's bookings, newest first, strictly after the keyset ($2, $3) =
-- (created_at, id) of the previous page's last item: a backward walk of
-- booking_customer_created that stops after $4 rows.
SELECT id, car_id, customer_id, lower(period) AS from_at, return_at, status,
       deposit_amount, refund_amount, overpaid_refund, hold_expires_at, created_at,
       hold_extended_at
  FROM booking
 WHERE customer_id = $1 AND (created_at, id) < ($2, $3)
 ORDER BY created_at DESC, id DESC
 LIMIT $4;

-- name: customer_bookings_by_status
-- The same, of one effective status $5 at $6: a HOLD past its expiry counts as
-- EXPIRED (domain.effective_status) even before a job flipped it. A filter on the
-- same index walk (status is not in the index: it changes with every transition,
-- and one customer's bookings are few); see docs/OPERATIONS.md, Rentals.
SELECT id, car_id, customer_id, lower(period) AS from_at, return_at, status,
       deposit_amount, refund_amount, overpaid_refund, hold_expires_at, created_at,
       hold_extended_at
  FROM booking
 WHERE customer_id = $1 AND (created_at, id) < ($2, $3)
   AND CASE WHEN status = 'HOLD' AND hold_expires_at <= $6 THEN 'EXPIRED'
            ELSE status END = $5::text
 ORDER BY created_at DESC, id DESC
 LIMIT $4;

-- name: car_calendar
-- What blocks car $1 during $2 (the asked window): its live bookings whose stored
-- period (buffer included) overlaps it, in time order; the exclusion constraint's
-- GiST index (ex_car_period) finds them. A HOLD past its expiry at $3 does not
-- block (as in search_available) and is left out.
SELECT id, lower(period) AS from_at, return_at, upper(period) AS buffer_until, status
  FROM booking
 WHERE car_id = $1
   AND status IN ('HOLD', 'CONFIRMED', 'ON_TRIP')
   AND period && $2::tstzrange
   AND (status <> 'HOLD' OR hold_expires_at > $3)
 ORDER BY lower(period), id;

-- name: car_is_free
-- Would a hold of car $1 for the stored period $2 be accepted at $3: the
-- exclusion constraint's overlap rule, minus the holds expired by $3 (the hold
-- path flips those before inserting).
SELECT NOT EXISTS (
    SELECT 1 FROM booking
     WHERE car_id = $1
       AND status IN ('HOLD', 'CONFIRMED', 'ON_TRIP')
       AND period && $2::tstzrange
       AND (status <> 'HOLD' OR hold_expires_at > $3));

-- name: extend_hold
-- The one extension of a live HOLD (third release): hold_expires_at moves $3
-- later, only while the hold has not expired at $2 (the server clock, compared
-- here and nowhere before) and was never extended. The expiry job and the
-- sweeper flip a HOLD only when hold_expires_at <= now: whichever of the two
-- statements takes the row lock first wins, and the other re-reads the row
-- after it (an extended hold is not expired; an expired one is not a HOLD).
UPDATE booking b SET hold_expires_at = b.hold_expires_at + $3::interval,
                     hold_extended_at = $2, updated_at = $2
  FROM car c
 WHERE b.id = $1 AND c.id = b.car_id
   AND b.status = 'HOLD' AND b.hold_expires_at > $2 AND b.hold_extended_at IS NULL
RETURNING b.id, b.car_id, b.customer_id, lower(b.period) AS from_at, b.return_at,
          b.status, b.deposit_amount, b.refund_amount, b.overpaid_refund, b.hold_expires_at,
          b.created_at, c.host_id, b.hold_extended_at;
