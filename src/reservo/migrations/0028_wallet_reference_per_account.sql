-- A deposit's reference was unique across all accounts (UNIQUE (kind, reference)),
-- so a 409 duplicate_reference told one owner that another owner's account had
-- used that reference. A reference is now unique per credited account and kind:
-- two owners may use the same reference; the same account still cannot (409, or
-- the stored answer for a retry with the same Idempotency-Key). A bet's payout or
-- refund (reference bet:<id>) always credits the bet's own account, so "paid at
-- most once per bet" holds as before.
ALTER TABLE wallet_transfer DROP CONSTRAINT wallet_transfer_reference_once;
ALTER TABLE wallet_transfer
    ADD CONSTRAINT wallet_transfer_reference_once UNIQUE (to_account_id, kind, reference);
