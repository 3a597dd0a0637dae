-- Named queries of core/http: the Idempotency-Key store (core/http/idempotency.py).

-- name: idem_insert
-- Claim an Idempotency-Key (IN_PROGRESS until $5); no row when it is taken.
INSERT INTO idempotency_key (caller, endpoint, key, request_hash, status, locked_until, created_at)
VALUES ($1, $2, $3, $4, 'IN_PROGRESS', $5, $6)
ON CONFLICT (caller, endpoint, key) DO NOTHING
RETURNING caller;

-- name: idem_complete_many
-- Store the answers of many claimed keys of one endpoint ($1) at once.
UPDATE idempotency_key k
   SET status = 'DONE', locked_until = NULL, response_status = v.status,
       response_body = v.body::json
  FROM unnest($2::text[], $3::text[], $4::int[], $5::text[]) AS v(caller, key, status, body)
 WHERE k.caller = v.caller AND k.endpoint = $1 AND k.key = v.key;

-- name: idem_known_many
-- What many keys of one endpoint ($3) already hold, read without claiming them
-- (IdempotencyStore.known_many): one row per key, in the order given; status
-- NULL when the key is free. One primary-key lookup per key (the LIMIT keeps
-- the subquery from being flattened into a join): as a plain join, the plan
-- cached while the table was new (a hash join over a sequential scan) read the
-- whole table for every batch as it grew.
SELECT k.request_hash, k.status, k.locked_until, k.response_status, k.response_body
  FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(caller, key, ord)
  LEFT JOIN LATERAL (
      SELECT * FROM idempotency_key i
       WHERE i.caller = t.caller AND i.endpoint = $3 AND i.key = t.key
       LIMIT 1
  ) k ON true
 ORDER BY t.ord;

-- name: idem_store_many
-- The answers of many free keys of one endpoint ($1), written DONE at once in
-- the business transaction (IdempotencyStore.store_many): one write per key
-- instead of a claim and then its completion. Inserted in (caller, key) order,
-- so two such transactions never deadlock on keys. A key
-- another transaction wrote since it was read is left alone (after waiting for
-- that transaction): its (caller, key) is missing from the rows returned.
INSERT INTO idempotency_key (caller, endpoint, key, request_hash, status, response_status,
                             response_body, created_at)
SELECT t.caller, $1, t.key, t.request_hash, 'DONE', t.status, t.body::json, $7
  FROM unnest($2::text[], $3::text[], $4::bytea[], $5::int[], $6::text[])
       AS t(caller, key, request_hash, status, body)
 ORDER BY t.caller, t.key
ON CONFLICT (caller, endpoint, key) DO NOTHING
RETURNING caller, key;

-- name: idem_get
-- The stored state of an Idempotency-Key: its request hash and answer.
SELECT request_hash, status, locked_until, response_status, response_body
  FROM idempotency_key
 WHERE caller = $1 AND endpoint = $2 AND key = $3;

-- name: idem_keys_since
-- One page of an endpoint's keys claimed since a time, in (created_at, caller,
-- key) order after the last one read: a keyset walk on the created_at index.
SELECT caller, key, created_at
  FROM idempotency_key
 WHERE endpoint = $1 AND (created_at, caller, key) > ($2, $3, $4)
 ORDER BY created_at, caller, key
 LIMIT $5;

-- name: idem_take_over
-- A crashed request left its claim behind; take it over only if nobody else did.
UPDATE idempotency_key
   SET locked_until = $5
 WHERE caller = $1 AND endpoint = $2 AND key = $3
   AND status = 'IN_PROGRESS' AND locked_until = $4
RETURNING caller;

-- name: idem_complete
-- Store the answer of a claimed key, to replay it to a retry.
UPDATE idempotency_key
   SET status = 'DONE', locked_until = NULL, response_status = $4, response_body = $5
 WHERE caller = $1 AND endpoint = $2 AND key = $3;

-- name: idem_release
-- Free a key whose request failed, so a retry runs again.
DELETE FROM idempotency_key
 WHERE caller = $1 AND endpoint = $2 AND key = $3 AND status = 'IN_PROGRESS';

-- name: idem_prunable
-- Retention: keys created before $1 (pruned by prune_by_ctid).
SELECT ctid FROM idempotency_key WHERE created_at < $1 ORDER BY created_at;
