-- Every deposit webhook is recorded with what it settled, so a payment that did
-- not match the deposit is visible in the table and never silently kept.
--
-- amount      (existing) what the provider says it received;
-- amount_due  the booking's deposit when the webhook arrived;
-- refund_due  the part of `amount` that goes back to the customer: the excess of
--             a payment that confirmed, or all of a payment that confirmed
--             nothing (below the deposit, or the booking no longer a live HOLD);
--             the refund itself is a REFUND row, written when the gateway did it;
-- outcome     'confirmed', 'underpaid' (below the deposit, zero included: the
--             hold stays a HOLD) or 'not_payable' (the booking was no longer a
--             live HOLD).
-- All three are NULL on REFUND rows and on deposits recorded before 0029.
-- Adding nullable columns without a default rewrites nothing.
ALTER TABLE payment
    ADD COLUMN amount_due bigint CHECK (amount_due >= 0),
    ADD COLUMN refund_due bigint CHECK (refund_due >= 0 AND refund_due <= amount),
    ADD COLUMN outcome    text   CHECK (outcome IN ('confirmed', 'underpaid', 'not_payable'));
