-- Named queries of the wallet module.

-- name: insert_account
-- A new customer account (balance 0).
INSERT INTO wallet_account (owner_id, currency, kind, shard, created_at)
VALUES ($1, $2, 'CUSTOMER', 0, $3)
RETURNING id, owner_id, currency, kind, balance;

-- name: ensure_system_accounts
-- The world account and the house sub-accounts of a currency, created once,
-- owned by nobody (NULL: no caller's sub ever matches it).
INSERT INTO wallet_account (owner_id, currency, kind, shard, created_at)
SELECT NULL::bigint, $1::text, k, s, $3::timestamptz
  FROM (SELECT 'WORLD' AS k, 0 AS s
        UNION ALL
        SELECT 'HOUSE', g FROM generate_series(0, $2::int - 1) AS g) AS sys
ON CONFLICT (kind, currency, shard) WHERE kind <> 'CUSTOMER' DO NOTHING;

-- name: system_account
-- The id of a system account (WORLD, HOUSE) of a currency and shard.
SELECT id FROM wallet_account WHERE kind = $1 AND currency = $2 AND shard = $3;

-- name: get_account
-- One account with its balance.
SELECT id, owner_id, currency, kind, balance FROM wallet_account WHERE id = $1;

-- name: lock_accounts
-- Always lock in ascending id order, whoever calls: two transfers between the
-- same accounts in opposite directions then queue instead of deadlocking.
SELECT id, owner_id, currency, kind, balance
  FROM wallet_account WHERE id = ANY($1::bigint[])
 ORDER BY id
   FOR UPDATE;

-- name: apply_transfer
-- Debit only when the funds are there (the CHECK is the last line of defence),
-- credit only when the debit happened, and write the transfer and its two
-- entries, all in one statement. No row returned means insufficient funds (or,
-- behind the domain's check_transfer, a TRANSFER touching a system account:
-- customers move only customers' money; WORLD and HOUSE move by deposits,
-- stakes, payouts and refunds).
WITH allowed AS (
    SELECT 1 FROM wallet_account s, wallet_account t
     WHERE s.id = $1 AND t.id = $2
       AND ($4 <> 'TRANSFER' OR (s.kind = 'CUSTOMER' AND t.kind = 'CUSTOMER'))
), debit AS (
    UPDATE wallet_account SET balance = balance - $3
     WHERE id = $1 AND (kind <> 'CUSTOMER' OR balance >= $3)
       AND EXISTS (SELECT 1 FROM allowed)
    RETURNING balance
), credit AS (
    UPDATE wallet_account SET balance = balance + $3
     WHERE id = $2 AND EXISTS (SELECT 1 FROM debit)
    RETURNING balance
), t AS (
    INSERT INTO wallet_transfer (kind, reference, from_account_id, to_account_id, amount, created_at)
    SELECT $4, $5, $1, $2, $3, $6 FROM debit
    RETURNING id, kind, reference, from_account_id, to_account_id, amount, created_at
), e AS (
    INSERT INTO wallet_entry (account_id, transfer_id, amount, balance_after, kind, reference, created_at)
    SELECT $1, t.id, -$3, debit.balance, $4, $5, $6 FROM t, debit
    UNION ALL
    SELECT $2, t.id, $3, credit.balance, $4, $5, $6 FROM t, credit
)
SELECT id, kind, reference, from_account_id, to_account_id, amount, created_at FROM t;

-- name: read_accounts
-- The batch's accounts without a lock (wallet/batch.py): owner, currency and
-- kind never change, and the balances are only the guess the batch plans on;
-- settle_transfers checks the plan against the locked balances.
SELECT id, owner_id, currency, kind, balance FROM wallet_account WHERE id = ANY($1::bigint[]);

-- name: transfer_ids
-- Ids for a batch's transfers, taken before any lock so the stored answers can
-- be rendered with them (a batch that refuses or rolls back leaves gaps, as any
-- sequence does).
SELECT nextval('wallet_transfer_id_seq') AS id FROM generate_series(1, $1::int);

-- name: settle_transfers
-- A batch of customer transfers planned on unlocked balances (wallet/batch.py),
-- in one statement: lock the accounts (ascending ids, as lock_accounts), and
-- only if every locked balance lies in the range ($2 <= balance < $3, NULL: no
-- bound) for which the plan's every funds check decides as planned, add each
-- account's delta ($4), write the transfers with their ids and entries in the
-- batch's order (entry ids follow it; balance_after = the locked balance plus
-- the account's running offset), and store every key's answer. The account
-- locks are thus held only from this statement to the commit. Returns the
-- locked balances and whether the plan held; when it did not, nothing was
-- written and the caller replans on those balances (it holds their locks).
-- The answers are idem_complete_many's update (core/queries.sql), folded in
-- to save a round trip under the locks.
WITH bounds AS (
    SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[])
                  AS b(id, lo, hi, delta)
), locked AS MATERIALIZED (
    SELECT id, balance FROM wallet_account WHERE id = ANY($1::bigint[])
     ORDER BY id
       FOR NO KEY UPDATE
), plan AS MATERIALIZED (
    SELECT count(*) = cardinality($1::bigint[])
           AND coalesce(bool_and((b.lo IS NULL OR l.balance >= b.lo)
                                 AND (b.hi IS NULL OR l.balance < b.hi)), true) AS holds
      FROM locked l JOIN bounds b ON b.id = l.id
), balances AS (
    UPDATE wallet_account a SET balance = a.balance + b.delta
      FROM bounds b
     WHERE a.id = b.id AND b.delta <> 0 AND (SELECT holds FROM plan)
), items AS (
    SELECT * FROM unnest($5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[],
                         $9::bigint[], $10::bigint[]) WITH ORDINALITY
                  AS i(id, source, target, amount, source_offset, target_offset, ord)
     WHERE (SELECT holds FROM plan)
), t AS (
    INSERT INTO wallet_transfer (id, kind, reference, from_account_id, to_account_id, amount, created_at)
    SELECT id, 'TRANSFER', NULL, source, target, amount, $11 FROM items ORDER BY ord
), e AS (
    INSERT INTO wallet_entry (account_id, transfer_id, amount, balance_after, kind, reference, created_at)
    SELECT account_id, transfer_id, amount, balance_after, 'TRANSFER', NULL, $11
      FROM (SELECT i.source AS account_id, i.id AS transfer_id, -i.amount AS amount,
                   s.balance + i.source_offset AS balance_after, i.ord, 0 AS side
              FROM items i JOIN locked s ON s.id = i.source
            UNION ALL
            SELECT i.target, i.id, i.amount, t.balance + i.target_offset, i.ord, 1
              FROM items i JOIN locked t ON t.id = i.target) AS sides
     ORDER BY ord, side
), answers AS (
    UPDATE idempotency_key k
       SET status = 'DONE', locked_until = NULL, response_status = v.status,
           response_body = v.body::json
      FROM unnest($13::text[], $14::text[], $15::int[], $16::text[]) AS v(caller, key, status, body)
     WHERE k.caller = v.caller AND k.endpoint = $12 AND k.key = v.key
       AND (SELECT holds FROM plan)
)
SELECT l.id, l.balance, (SELECT holds FROM plan) AS holds FROM locked l;

-- name: pay_many
-- A chunk of payouts/refunds from one house sub-account, applied in one
-- statement: the house row is updated once for the whole chunk. A reference
-- already paid is skipped (ON CONFLICT), so a redelivered chunk pays nothing twice.
-- Entries get their running balance_after from window sums over the chunk.
-- Callers lock the accounts (lock_accounts) first.
WITH items AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[])
                  AS t(kind, reference, account_id, amount)
     WHERE amount > 0
), ins AS (
    INSERT INTO wallet_transfer (kind, reference, from_account_id, to_account_id, amount, created_at)
    SELECT kind, reference, $1, account_id, amount, $6 FROM items
    ON CONFLICT ON CONSTRAINT wallet_transfer_reference_once DO NOTHING
    RETURNING id, kind, reference, to_account_id, amount
), per_account AS (
    SELECT to_account_id, sum(amount)::bigint AS total FROM ins GROUP BY to_account_id
), customers AS (
    UPDATE wallet_account a SET balance = a.balance + p.total
      FROM per_account p WHERE a.id = p.to_account_id
    RETURNING a.id, a.balance - p.total AS before
), house AS (
    UPDATE wallet_account SET balance = balance - (SELECT coalesce(sum(amount), 0) FROM ins)
     WHERE id = $1 AND EXISTS (SELECT 1 FROM ins)
    RETURNING balance + (SELECT coalesce(sum(amount), 0) FROM ins) AS before
), entries AS (
    INSERT INTO wallet_entry (account_id, transfer_id, amount, balance_after, kind, reference, created_at)
    SELECT ins.to_account_id, ins.id, ins.amount,
           c.before + sum(ins.amount) OVER (PARTITION BY ins.to_account_id ORDER BY ins.id),
           ins.kind, ins.reference, $6
      FROM ins JOIN customers c ON c.id = ins.to_account_id
    UNION ALL
    SELECT $1, ins.id, -ins.amount,
           h.before - sum(ins.amount) OVER (ORDER BY ins.id),
           ins.kind, ins.reference, $6
      FROM ins, house h
)
SELECT count(*)::int AS applied, coalesce(sum(amount), 0)::bigint AS total FROM ins;

-- name: statement
-- An account's ledger entries, newest first, below entry $2 (keyset).
SELECT id, transfer_id, amount, balance_after, kind, reference, created_at
  FROM wallet_entry
 WHERE account_id = $1 AND ($2::bigint IS NULL OR id < $2)
 ORDER BY id DESC
 LIMIT $3;

-- name: currencies
-- A currency never changes, so it is read without a lock.
SELECT id, currency FROM wallet_account WHERE id = ANY($1::bigint[]);
