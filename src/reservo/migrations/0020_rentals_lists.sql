-- Rentals, second release: a customer's bookings (GET /api/customers/{id}/bookings)
-- and the hold rate limit counted from the holds themselves.
--
-- Plain CREATE INDEX, as in 0014/0017: on a deployment whose booking table is
-- already large, create the same index first with CREATE INDEX CONCURRENTLY (same
-- name and definition, outside a transaction); IF NOT EXISTS then skips it here.

-- One index for both readers: the list walks it backward from its keyset cursor
-- (newest first: created_at, then id), and the hold rate limit reads the range
-- (customer_id = $1 AND created_at > now - window) of one customer, newest first,
-- at most `limit` entries. created_at and customer_id never change, so no status
-- update of a booking touches this index.
CREATE INDEX IF NOT EXISTS booking_customer_created ON booking (customer_id, created_at, id);

-- Its leading column did the same job alone; the new index covers every use.
DROP INDEX IF EXISTS booking_customer;
