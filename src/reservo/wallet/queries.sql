-- Named queries of the wallet module.

-- name: insert_account
-- A new customer account (balance 0).
INSERT INTO wallet_account (owner_id, currency, kind, shard, created_at)
VALUES ($1, $2, 'CUSTOMER', 0, $3)
RETURNING id, owner_id, currency, kind, balance, balance AS available;

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
-- The id of a system account (WORLD, HOUSE) of a currency and shard (the
-- partial index wallet_system_account: its predicate spelled out for generic plans).
SELECT id FROM wallet_account
 WHERE kind = $1 AND kind <> 'CUSTOMER' AND currency = $2 AND shard = $3;

-- name: system_account_with_room
-- The sub-account of a kind (WORLD, HOUSE) and currency a movement changing it
-- by $4 goes to: shard $3 while its balance stays within +-$5 after it, else
-- the lowest shard that does; none: open one (open_system_account). Numeric
-- arithmetic: the test itself must not overflow. A few rows of the partial
-- index wallet_system_account (`kind <> 'CUSTOMER'` spelled out so that a
-- generic plan, which cannot see $1, may use it).
SELECT id FROM wallet_account
 WHERE kind = $1 AND kind <> 'CUSTOMER' AND currency = $2
   AND balance::numeric + $4::numeric BETWEEN -$5::numeric AND $5::numeric
 ORDER BY shard <> $3, shard
 LIMIT 1;

-- name: open_system_account
-- One more sub-account of a kind (WORLD, HOUSE) and currency, every other one
-- being full to its range for a change of $4 (room $5). Two openers at once: one
-- wins, the other finds it. The room is looked at again here: an opener that found
-- none before another's new sub-account committed must not open a second one.
INSERT INTO wallet_account (owner_id, currency, kind, shard, created_at)
SELECT NULL::bigint, $2::text, $1::text, max(shard) + 1, $3::timestamptz
  FROM wallet_account WHERE kind = $1 AND kind <> 'CUSTOMER' AND currency = $2
HAVING NOT bool_or(balance::numeric + $4::numeric BETWEEN -$5::numeric AND $5::numeric)
ON CONFLICT (kind, currency, shard) WHERE kind <> 'CUSTOMER' DO NOTHING;

-- name: get_account
-- One account with its balance and what it may spend at $2: the balance less
-- its pending debits, but a pending transfer past its expiry reserves nothing
-- even before the expiry job voids it.
SELECT a.id, a.owner_id, a.currency, a.kind, a.balance,
       a.balance - a.pending_debits + coalesce((
           SELECT sum(p.amount) FROM wallet_pending_transfer p
            WHERE p.from_account_id = a.id AND p.status = 'PENDING' AND p.expires_at <= $2
       ), 0)::bigint AS available
  FROM wallet_account a WHERE a.id = $1;

-- name: lock_accounts
-- Always lock in ascending id order, whoever calls: two transfers between the
-- same accounts in opposite directions then queue instead of deadlocking.
SELECT id, owner_id, currency, kind, balance, pending_debits
  FROM wallet_account WHERE id = ANY($1::bigint[])
 ORDER BY id
   FOR UPDATE;

-- name: apply_transfer
-- Debit only when the funds are there: a customer's available money, its
-- balance less its pending debits (the CHECKs are the last line of defence),
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
     WHERE id = $1 AND (kind <> 'CUSTOMER' OR balance - pending_debits >= $3)
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

-- name: read_batch
-- What a batch reads before it locks anything, in one round trip (wallet/batch.py):
-- * its accounts ($1), without a lock: owner, currency and kind never change,
--   and the balances are only the guess the batch plans on (lock_balances
--   gives the balances the plan is checked against);
-- * $2 transfer ids (one per request: at most that many transfers), so the
--   answers can be rendered before the locks; unused ids (refusals, a
--   rollback) leave gaps, as any sequence does;
-- * what its keys ($3 callers, $4 keys, of endpoint $5) hold, as
--   idem_known_many (core/queries.sql): one row per key, ord its place in
--   the arrays, status NULL when the key is free.
-- A row is an account, an id or a key (its `what`).
SELECT 'account' AS what, id, owner_id, currency, kind, balance, pending_debits,
       NULL::bigint AS ord,
       NULL::bytea AS request_hash, NULL::text AS status, NULL::timestamptz AS locked_until,
       NULL::int AS response_status, NULL::json AS response_body
  FROM wallet_account WHERE id = ANY($1::bigint[])
UNION ALL
SELECT 'id', nextval('wallet_transfer_id_seq'), NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL
  FROM generate_series(1, $2::int)
UNION ALL
SELECT 'key', NULL, NULL, NULL, NULL, NULL, NULL, t.ord,
       k.request_hash, k.status, k.locked_until, k.response_status, k.response_body
  FROM unnest($3::text[], $4::text[]) WITH ORDINALITY AS t(caller, key, ord)
  LEFT JOIN LATERAL (
      SELECT * FROM idempotency_key i
       WHERE i.caller = t.caller AND i.endpoint = $5 AND i.key = t.key
       LIMIT 1
  ) k ON true;

-- name: lock_balances
-- The balances of a planned batch's accounts, locked (ascending ids, as
-- lock_accounts; NO KEY UPDATE: only balances change). Its own statement: the
-- write that follows then reads the rows after the locks, never an older
-- version (one statement locking and updating the same rows under concurrent
-- commits wrote a balance computed from a version older than the one it
-- locked and checked, in testing).
SELECT id, balance, pending_debits FROM wallet_account WHERE id = ANY($1::bigint[])
 ORDER BY id
   FOR NO KEY UPDATE;

-- name: write_transfers
-- A planned batch of customer transfers on the balances lock_balances returned
-- (wallet/batch.py): each account's new balance written once, each transfer
-- with its id and two entries in the batch's order (entry ids follow it, so an
-- account's newest entry holds its balance), and every key's answer: a free key
-- (digest given) inserted DONE once, as idem_store_many (core/queries.sql) in
-- (caller, key) order, never claimed first (nobody could see the claim: it
-- would commit with its answer); a claim taken over (digest NULL) completed as
-- idem_complete_many. No ON CONFLICT: a key another transaction wrote since the
-- batch read it fails the whole statement (unique violation), so no transfer
-- commits without its own stored answer.
WITH balances AS (
    UPDATE wallet_account a SET balance = b.balance
      FROM unnest($1::bigint[], $2::bigint[]) AS b(id, balance)
     WHERE a.id = b.id
), items AS (
    SELECT * FROM unnest($3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[],
                         $7::bigint[], $8::bigint[]) WITH ORDINALITY
                  AS i(id, source, target, amount, source_after, target_after, ord)
), t AS (
    INSERT INTO wallet_transfer (id, kind, reference, from_account_id, to_account_id, amount, created_at)
    SELECT id, 'TRANSFER', NULL, source, target, amount, $9 FROM items ORDER BY ord
), e AS (
    INSERT INTO wallet_entry (account_id, transfer_id, amount, balance_after, kind, reference, created_at)
    SELECT account_id, transfer_id, amount, balance_after, 'TRANSFER', NULL, $9
      FROM (SELECT source AS account_id, id AS transfer_id, -amount AS amount,
                   source_after AS balance_after, ord, 0 AS side FROM items
            UNION ALL
            SELECT target, id, amount, target_after, ord, 1 FROM items) AS sides
     ORDER BY ord, side
), answers AS (
    SELECT * FROM unnest($11::text[], $12::text[], $13::int[], $14::text[], $15::bytea[])
                  AS v(caller, key, status, body, digest)
), stored AS (
    INSERT INTO idempotency_key (caller, endpoint, key, request_hash, status, response_status,
                                 response_body, created_at)
    SELECT caller, $10, key, digest, 'DONE', status, body::json, $9
      FROM answers WHERE digest IS NOT NULL
     ORDER BY caller, key
), completed AS (
    UPDATE idempotency_key k
       SET status = 'DONE', locked_until = NULL, response_status = v.status,
           response_body = v.body::json
      FROM answers v
     WHERE v.digest IS NULL AND k.caller = v.caller AND k.endpoint = $10 AND k.key = v.key
)
SELECT count(*)::int AS transfers FROM items;

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

-- name: statement_bounds
-- The CSV statement's limits for this read transaction: each cursor fetch is
-- a statement under $1 (ms), and a transaction left idle (the process stuck)
-- is ended by the server after $2 (ms). Transaction-local (is_local true).
SELECT set_config('statement_timeout', $1::text, true),
       set_config('idle_in_transaction_session_timeout', $2::text, true);

-- name: statement_csv
-- The CSV statement: account $1's entries created in [$2, $3), oldest first by
-- id, the ledger's order (an account's entries are written under its lock, so
-- ids follow its balance). Read through a server-side cursor in chunks:
-- wallet_entry_statement walked forward, no sort, nothing buffered.
SELECT id, created_at, kind, amount, balance_after, transfer_id, reference
  FROM wallet_entry
 WHERE account_id = $1 AND created_at >= $2 AND created_at < $3
 ORDER BY id;

-- name: reserve
-- A pending transfer's reservation on its (locked) source: its pending debits
-- grow by $2 only while the available money covers it. No row: insufficient funds.
UPDATE wallet_account SET pending_debits = pending_debits + $2
 WHERE id = $1 AND balance - pending_debits >= $2
RETURNING id;

-- name: insert_pending
-- A pending transfer, under an id of wallet_transfer_id_seq (its post writes
-- the wallet_transfer row under the same id).
INSERT INTO wallet_pending_transfer (id, from_account_id, to_account_id, amount, expires_at, created_at)
VALUES (nextval('wallet_transfer_id_seq'), $1, $2, $3, $4, $5)
RETURNING id, from_account_id, to_account_id, amount, status, posted_amount, expires_at, created_at;

-- name: get_pending
-- A pending transfer (any status) with its source's owner, unlocked.
SELECT p.id, p.from_account_id, p.to_account_id, p.amount, p.status, p.posted_amount,
       p.expires_at, p.created_at, a.owner_id
  FROM wallet_pending_transfer p JOIN wallet_account a ON a.id = p.from_account_id
 WHERE p.id = $1;

-- name: resolve_pending
-- The one transition out of PENDING: to $2 (POSTED with $3 posted, or VOIDED),
-- only while it is PENDING and, by $5: false (a post) not past its expiry at
-- $4, true (the expiry job) past it, NULL (a void) either way. Under
-- READ COMMITTED a racing transition waits for this row and re-reads it, so
-- exactly one of them wins. Its source's pending debits shrink with it.
WITH p AS (
    UPDATE wallet_pending_transfer
       SET status = $2, posted_amount = $3, resolved_at = $4
     WHERE id = $1 AND status = 'PENDING'
       AND ($5::boolean IS NULL OR (expires_at <= $4) = $5)
    RETURNING id, from_account_id, to_account_id, amount, status, posted_amount, expires_at,
              created_at
), released AS (
    UPDATE wallet_account a SET pending_debits = a.pending_debits - p.amount
      FROM p WHERE a.id = p.from_account_id
)
SELECT * FROM p;

-- name: release_expired
-- Every PENDING transfer out of the (locked) accounts $1 past its expiry at
-- $2, voided now: an expired pending transfer never reserves money, even
-- before its expiry job runs. Returns each account's released total.
WITH p AS (
    UPDATE wallet_pending_transfer
       SET status = 'VOIDED', resolved_at = $2
     WHERE from_account_id = ANY($1::bigint[]) AND status = 'PENDING' AND expires_at <= $2
    RETURNING from_account_id, amount
), per_account AS (
    SELECT from_account_id AS id, sum(amount)::bigint AS released FROM p GROUP BY from_account_id
), released AS (
    UPDATE wallet_account a SET pending_debits = a.pending_debits - r.released
      FROM per_account r WHERE a.id = r.id
)
SELECT id, released FROM per_account;

-- name: post_entries
-- A posted pending transfer's movement (its source and target locked, the
-- reservation already released): $3 from $1 to $2, the wallet_transfer row
-- under the pending one's id $4 and its two entries. The debit is
-- conditional on the available money as every other one.
WITH debit AS (
    UPDATE wallet_account SET balance = balance - $3
     WHERE id = $1 AND balance - pending_debits >= $3
    RETURNING balance
), credit AS (
    UPDATE wallet_account SET balance = balance + $3
     WHERE id = $2 AND EXISTS (SELECT 1 FROM debit)
    RETURNING balance
), t AS (
    INSERT INTO wallet_transfer (id, kind, reference, from_account_id, to_account_id, amount, created_at)
    SELECT $4::bigint, 'TRANSFER', NULL, $1::bigint, $2::bigint, $3::bigint, $5::timestamptz
      FROM debit
    RETURNING id
), e AS (
    INSERT INTO wallet_entry (account_id, transfer_id, amount, balance_after, kind, reference, created_at)
    SELECT $1::bigint, t.id, -$3::bigint, debit.balance, 'TRANSFER', NULL, $6::timestamptz
      FROM t, debit
    UNION ALL
    SELECT $2::bigint, t.id, $3::bigint, credit.balance, 'TRANSFER', NULL, $6::timestamptz
      FROM t, credit
)
SELECT id FROM t;

-- name: list_pending
-- An account's live pending transfers out (not past their expiry at $2),
-- oldest first, after id $3 (keyset on wallet_pending_by_account).
SELECT id, from_account_id, to_account_id, amount, status, posted_amount, expires_at, created_at
  FROM wallet_pending_transfer
 WHERE from_account_id = $1 AND status = 'PENDING' AND expires_at > $2
   AND ($3::bigint IS NULL OR id > $3)
 ORDER BY id
 LIMIT $4;

-- name: paid_of_references
-- The payouts and refunds paid under these (account, reference) pairs (parallel
-- arrays), through wallet_transfer_reference_once: what a resettlement reverses.
SELECT t.to_account_id AS account_id, t.reference, t.kind, t.amount
  FROM unnest($1::bigint[], $2::text[]) AS u(account_id, reference)
 CROSS JOIN LATERAL (
       SELECT to_account_id, reference, kind, amount FROM wallet_transfer
        WHERE to_account_id = u.account_id AND kind IN ('PAYOUT', 'REFUND')
          AND reference = u.reference) t;

-- name: reverse_many
-- pay_many the other way: take back a chunk of payouts/refunds (REVERSAL, under
-- the reference of what it reverses) into one house sub-account. No balance
-- guard on the customers: a winner who already spent the payout goes below zero
-- (every debit the customer makes then refuses, see apply_transfer). A
-- reference already reversed is skipped, so a retried chunk reverses nothing twice.
-- Callers lock the accounts (lock_accounts) first.
WITH items AS (
    SELECT * FROM unnest($2::text[], $3::bigint[], $4::bigint[])
                  AS t(reference, account_id, amount)
     WHERE amount > 0
), ins AS (
    INSERT INTO wallet_transfer (kind, reference, from_account_id, to_account_id, amount, created_at)
    SELECT 'REVERSAL', reference, account_id, $1, amount, $5 FROM items
    ON CONFLICT ON CONSTRAINT wallet_transfer_reference_once DO NOTHING
    RETURNING id, reference, from_account_id, amount
), per_account AS (
    SELECT from_account_id, sum(amount)::bigint AS total FROM ins GROUP BY from_account_id
), customers AS (
    UPDATE wallet_account a SET balance = a.balance - p.total
      FROM per_account p WHERE a.id = p.from_account_id
    RETURNING a.id, a.balance + p.total AS before
), house AS (
    UPDATE wallet_account SET balance = balance + (SELECT coalesce(sum(amount), 0) FROM ins)
     WHERE id = $1 AND EXISTS (SELECT 1 FROM ins)
    RETURNING balance - (SELECT coalesce(sum(amount), 0) FROM ins) AS before
), entries AS (
    INSERT INTO wallet_entry (account_id, transfer_id, amount, balance_after, kind, reference, created_at)
    SELECT ins.from_account_id, ins.id, -ins.amount,
           c.before - sum(ins.amount) OVER (PARTITION BY ins.from_account_id ORDER BY ins.id),
           'REVERSAL', ins.reference, $5
      FROM ins JOIN customers c ON c.id = ins.from_account_id
    UNION ALL
    SELECT $1, ins.id, ins.amount,
           h.before + sum(ins.amount) OVER (ORDER BY ins.id),
           'REVERSAL', ins.reference, $5
      FROM ins, house h
)
SELECT count(*)::int AS applied, coalesce(sum(amount), 0)::bigint AS total FROM ins;

-- name: negative_accounts
-- GET /api/accounts?negative=true: customer accounts below zero (a reversal
-- took back a payout already spent), by id after $1.
-- A sequential read of the accounts: an operator's list, rare (no index to keep
-- up on every balance change).
SELECT id, owner_id, currency, kind, balance, balance - pending_debits AS available
  FROM wallet_account
 WHERE kind = 'CUSTOMER' AND balance < 0 AND id > $1
 ORDER BY id
 LIMIT $2;
