-- Betting, fourth release: result corrections and voids (POST
-- /api/matches/{id}/resettle and /void, a results webhook with "correction").
--
-- Expand-only: new columns with constant defaults (no table rewrite), a wider
-- kind check, and two balance checks loosened. A 0.3.x process never reads or
-- writes the new columns; it pays generation 1 under the reference it always
-- used ("bet:<id>"), which is generation 1's reference here too.
-- settlement_generation: how many times the match was settled (1 the first
-- time); a correction or a void reopens it under the next one. result_sequence:
-- the provider's `sequence` of the correction that brought the result, so an
-- older correction arriving later is refused (stale_correction).
-- voided_reason: why an admin voided the match.
ALTER TABLE betting_match
    ADD COLUMN IF NOT EXISTS settlement_generation integer NOT NULL DEFAULT 1,
    ADD COLUMN IF NOT EXISTS result_sequence bigint,
    ADD COLUMN IF NOT EXISTS voided_reason text;

-- A bet's generation: bumped each time a correction reopens it after it was
-- settled. Its payout is keyed by (bet, generation) in the wallet's reference
-- ("bet:<id>" for 1, "bet:<id>:g<n>" after), so each generation pays once.
ALTER TABLE betting_bet ADD COLUMN IF NOT EXISTS generation integer NOT NULL DEFAULT 1;

-- REVERSAL: a payout or refund taken back from its account when its bet is
-- resettled (the ledger keeps both rows). NOT VALID: every existing row passes.
ALTER TABLE wallet_transfer DROP CONSTRAINT IF EXISTS wallet_transfer_kind_check;
ALTER TABLE wallet_transfer ADD CONSTRAINT wallet_transfer_kind_check
    CHECK (kind IN ('DEPOSIT', 'TRANSFER', 'STAKE', 'PAYOUT', 'REFUND', 'REVERSAL')) NOT VALID;

-- A reversal takes a payout back even from an account that spent it: the
-- account goes below zero (it then owes the house). Every debit a customer
-- makes is still refused below zero by its own conditional UPDATE (apply_transfer,
-- reserve, the batch plan: balance - pending_debits >= amount), which a negative
-- balance never passes; these checks would refuse the reversal itself.
ALTER TABLE wallet_account DROP CONSTRAINT IF EXISTS wallet_balance_non_negative;
ALTER TABLE wallet_account DROP CONSTRAINT IF EXISTS wallet_available_non_negative;
ALTER TABLE wallet_account ADD CONSTRAINT wallet_available_non_negative
    CHECK (pending_debits >= 0) NOT VALID;
