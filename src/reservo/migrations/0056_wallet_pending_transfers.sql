-- Wallet, fourth release: two-phase transfers (POST /api/transfers with
-- "pending": true, then /post or /void; the expiry job voids one left alone).
--
-- Expand-only: a 0.3.0 process keeps working against this schema during a
-- rolling upgrade. It never reads or writes the new column or table; its
-- debits check `balance` only, so on an account holding a pending transfer
-- (only a new process makes one) a debit it would let past `available` fails
-- on wallet_available_non_negative instead (money is never spent twice).
--
-- pending_debits: the sum of the account's PENDING transfers out, maintained
-- by conditional UPDATEs under the account's row lock (create adds, post,
-- void and expiry subtract). A default with a constant: a catalogue change, no
-- table rewrite. The CHECK binds only an account holding a pending debit, so it
-- leaves every other rule on balances to wallet_balance_non_negative.
-- NOT VALID: no scan of the accounts under the ALTER's lock (every existing row
-- has pending_debits 0, which satisfies it); every write from now on is checked.
-- The ALTERs take wallet_account's ACCESS EXCLUSIVE lock for a catalogue change
-- only; the migration runner's short lock_timeout makes the migration fail and
-- be retried rather than queue every transfer behind it.
ALTER TABLE wallet_account ADD COLUMN IF NOT EXISTS pending_debits bigint NOT NULL DEFAULT 0;
ALTER TABLE wallet_account DROP CONSTRAINT IF EXISTS wallet_available_non_negative;
ALTER TABLE wallet_account ADD CONSTRAINT wallet_available_non_negative
    CHECK (pending_debits >= 0 AND (pending_debits = 0 OR balance >= pending_debits)) NOT VALID;

-- A pending transfer: its id is taken from wallet_transfer_id_seq, and a post
-- writes the wallet_transfer row (and its two entries) under the same id, so a
-- transfer keeps one id from PENDING to POSTED. Status moves only from PENDING,
-- by one conditional UPDATE (WHERE status = 'PENDING'), so each pending one is
-- resolved exactly once whoever races (post, void, the expiry job).
CREATE TABLE IF NOT EXISTS wallet_pending_transfer (
    id              bigint      PRIMARY KEY,
    from_account_id bigint      NOT NULL REFERENCES wallet_account (id),
    to_account_id   bigint      NOT NULL REFERENCES wallet_account (id),
    amount          bigint      NOT NULL CHECK (amount > 0),
    status          text        NOT NULL DEFAULT 'PENDING'
                                CHECK (status IN ('PENDING', 'POSTED', 'VOIDED')),
    posted_amount   bigint      CHECK (posted_amount > 0 AND posted_amount <= amount),
    expires_at      timestamptz NOT NULL,
    created_at      timestamptz NOT NULL,
    resolved_at     timestamptz,
    CONSTRAINT wallet_pending_distinct CHECK (from_account_id <> to_account_id),
    CONSTRAINT wallet_pending_posted CHECK ((status = 'POSTED') = (posted_amount IS NOT NULL))
);
-- The account's list (GET /api/accounts/{id}/pending-transfers, keyset on id)
-- and what an expired one still holds (read with each account).
CREATE INDEX IF NOT EXISTS wallet_pending_by_account
    ON wallet_pending_transfer (from_account_id, id) WHERE status = 'PENDING';
