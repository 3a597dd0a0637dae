-- A deposit payment above the deposit is its own outcome, shown on the booking.
-- The excess always went back (a refund event in the webhook's transaction, 0029),
-- but the webhook answered `confirmed` and the booking showed nothing of it: an
-- overpayment looked kept. Now:
--
-- payment.outcome  'overpaid': confirmed, and refund_due (> 0) is the excess
--                  returned; 'confirmed' is a payment of exactly the deposit.
-- booking.overpaid_refund  the excess of the payment that confirmed the booking
--                  (0: paid exactly), shown as overpaidRefund; NULL while no
--                  payment confirmed it, and for bookings confirmed before 0029
--                  (nothing recorded what their payment settled).
--
-- The CHECK is replaced in one ALTER (one scan of payment); the column is
-- nullable without a default (no rewrite). The backfills touch the payments that
-- confirmed with an excess and the bookings confirmed since 0029.
ALTER TABLE payment
    DROP CONSTRAINT IF EXISTS payment_outcome_check,
    ADD CONSTRAINT payment_outcome_check
        CHECK (outcome IN ('confirmed', 'overpaid', 'underpaid', 'not_payable'));
UPDATE payment SET outcome = 'overpaid' WHERE outcome = 'confirmed' AND refund_due > 0;

ALTER TABLE booking
    ADD COLUMN IF NOT EXISTS overpaid_refund bigint
        CONSTRAINT chk_booking_overpaid_refund CHECK (overpaid_refund >= 0);
UPDATE booking b SET overpaid_refund = p.refund_due
  FROM payment p
 WHERE p.booking_id = b.id AND p.type = 'DEPOSIT' AND p.outcome IN ('confirmed', 'overpaid')
   AND b.overpaid_refund IS NULL;
