-- Wallet: accounts with integer balances and a double-entry ledger.

-- CUSTOMER accounts belong to a user and never go below zero. HOUSE accounts
-- (several sub-accounts per currency, so stakes do not queue behind one hot row)
-- and the WORLD account (money entering through deposits) may: their balances
-- are the operator's position, not anybody's spendable money.
CREATE TABLE wallet_account (
    id         bigserial   PRIMARY KEY,
    owner_id   bigint      NOT NULL,
    currency   text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    kind       text        NOT NULL DEFAULT 'CUSTOMER'
                           CHECK (kind IN ('CUSTOMER', 'HOUSE', 'WORLD')),
    shard      integer     NOT NULL DEFAULT 0,
    balance    bigint      NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL,
    CONSTRAINT wallet_balance_non_negative CHECK (kind <> 'CUSTOMER' OR balance >= 0)
);
-- One house sub-account per (currency, shard) and one world account per currency.
CREATE UNIQUE INDEX wallet_system_account ON wallet_account (kind, currency, shard)
    WHERE kind <> 'CUSTOMER';

-- Every movement of money. A business reference (the bet a payout is for) can be
-- used once per kind: a payout for bet 123 exists at most once.
CREATE TABLE wallet_transfer (
    id              bigserial   PRIMARY KEY,
    kind            text        NOT NULL
                                CHECK (kind IN ('DEPOSIT', 'TRANSFER', 'STAKE', 'PAYOUT', 'REFUND')),
    reference       text,
    from_account_id bigint      NOT NULL REFERENCES wallet_account (id),
    to_account_id   bigint      NOT NULL REFERENCES wallet_account (id),
    amount          bigint      NOT NULL CHECK (amount > 0),
    created_at      timestamptz NOT NULL,
    CONSTRAINT wallet_transfer_distinct CHECK (from_account_id <> to_account_id),
    CONSTRAINT wallet_transfer_reference_once UNIQUE (kind, reference)
);

-- Two entries per transfer (one negative, one positive), each with the balance
-- of its account right after it: the statement is a read of this table.
CREATE TABLE wallet_entry (
    id            bigserial   PRIMARY KEY,
    account_id    bigint      NOT NULL,
    transfer_id   bigint      NOT NULL,
    amount        bigint      NOT NULL CHECK (amount <> 0),
    balance_after bigint      NOT NULL,
    kind          text        NOT NULL,
    reference     text,
    created_at    timestamptz NOT NULL
);
-- The statement's keyset: newest first per account.
CREATE INDEX wallet_entry_statement ON wallet_entry (account_id, id DESC);
CREATE INDEX wallet_entry_transfer ON wallet_entry (transfer_id);
