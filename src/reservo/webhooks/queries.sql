-- Named queries of the webhooks module (outgoing webhooks).

-- name: endpoint_insert
-- A new endpoint, ENABLED, with its first secret.
INSERT INTO webhook_endpoint (url, events, description, secret, created_at)
VALUES ($1, $2, $3, $4, $5)
RETURNING *;

-- name: endpoint_list
-- Every endpoint, oldest first.
SELECT * FROM webhook_endpoint ORDER BY id;

-- name: endpoint_get
-- One endpoint, or nothing.
SELECT * FROM webhook_endpoint WHERE id = $1;

-- name: endpoint_update
-- NULL leaves a field as it is. Enabling again forgets the failures so far (the
-- five days of failures count from the next one).
UPDATE webhook_endpoint
   SET events = COALESCE($2, events),
       description = COALESCE($3, description),
       status = COALESCE($4, status),
       failing_since = CASE WHEN $4 = 'ENABLED' THEN NULL ELSE failing_since END
 WHERE id = $1
RETURNING *;

-- name: endpoint_delete
-- Its deliveries go with it (ON DELETE CASCADE); their jobs find nothing to do.
DELETE FROM webhook_endpoint WHERE id = $1 RETURNING id;

-- name: endpoint_rotate
-- The secret being replaced keeps signing until $3.
UPDATE webhook_endpoint
   SET previous_secret = secret, previous_until = $3, secret = $2
 WHERE id = $1
RETURNING id;

-- name: endpoint_failed
-- An attempt failed: the endpoint fails since its first failure without a
-- success after it; after $3 of that it is disabled.
UPDATE webhook_endpoint
   SET failing_since = COALESCE(failing_since, $2),
       status = CASE WHEN COALESCE(failing_since, $2) <= $2 - $3::interval
                     THEN 'DISABLED' ELSE status END
 WHERE id = $1
RETURNING status;

-- name: endpoint_succeeded
-- An attempt succeeded: the endpoint fails no more.
UPDATE webhook_endpoint SET failing_since = NULL
 WHERE id = $1 AND failing_since IS NOT NULL;

-- name: fan_out
-- A batch of events ($1 ids, $2 types, $3 bodies, $4 creation times) becomes
-- one delivery per enabled endpoint subscribed to its type; an event's body is
-- kept once, and only when someone subscribed. A (endpoint, event) already
-- delivered to inserts nothing: the rows returned are the new deliveries.
WITH subs AS MATERIALIZED (
    SELECT t.id, t.type, t.body, t.created_at, e.id AS endpoint_id
      FROM unnest($1::uuid[], $2::text[], $3::bytea[], $4::timestamptz[])
           AS t(id, type, body, created_at)
      JOIN webhook_endpoint e ON e.status = 'ENABLED' AND e.events @> ARRAY[t.type]
), kept AS (
    INSERT INTO webhook_event (event_id, event_type, body, created_at)
    SELECT DISTINCT ON (id) id, type, body, created_at FROM subs
    ON CONFLICT (event_id) DO NOTHING
)
INSERT INTO webhook_delivery (endpoint_id, event_id, retry_until, next_attempt_at, created_at)
SELECT endpoint_id, id, $5::timestamptz + $6::interval, $5, $5 FROM subs
ON CONFLICT (endpoint_id, event_id) DO NOTHING
RETURNING id, turn, endpoint_id;

-- name: delivery_for_attempt
-- Everything one attempt needs, read before the call (no transaction held).
SELECT d.id, d.status, d.turn, d.attempts, d.retry_until, d.event_id,
       e.id AS endpoint_id, e.url, e.status AS endpoint_status, e.secret,
       e.previous_secret, e.previous_until, v.body
  FROM webhook_delivery d
  JOIN webhook_endpoint e ON e.id = d.endpoint_id
  JOIN webhook_event v ON v.event_id = d.event_id
 WHERE d.id = $1;

-- name: delivery_succeeded
-- A 2xx: the turn being tried is DELIVERED (nothing for a turn overtaken).
UPDATE webhook_delivery
   SET status = 'DELIVERED', attempts = attempts + 1, last_status_code = $3,
       last_error = NULL, delivered_at = $4, next_attempt_at = NULL
 WHERE id = $1 AND turn = $2 AND status = 'PENDING'
RETURNING endpoint_id;

-- name: delivery_failed
-- $5 the next attempt's time, NULL: given up (FAILED). A retry is a new turn.
UPDATE webhook_delivery
   SET attempts = attempts + 1, last_status_code = $3, last_error = $4,
       next_attempt_at = $5,
       status = CASE WHEN $5::timestamptz IS NULL THEN 'FAILED' ELSE 'PENDING' END,
       turn = turn + CASE WHEN $5::timestamptz IS NULL THEN 0 ELSE 1 END
 WHERE id = $1 AND turn = $2 AND status = 'PENDING'
RETURNING turn, status, endpoint_id;

-- name: delivery_given_up
-- The endpoint was disabled: nothing is sent, the delivery is FAILED.
UPDATE webhook_delivery
   SET status = 'FAILED', last_error = $3, next_attempt_at = NULL
 WHERE id = $1 AND turn = $2 AND status = 'PENDING';

-- name: delivery_redeliver
-- A DELIVERED or FAILED delivery is queued again now, for a fresh retry
-- window; a PENDING one is queued already. Two requests at once queue it once:
-- the second waits for the first's row lock, then finds it PENDING.
UPDATE webhook_delivery
   SET status = 'PENDING', turn = turn + 1, next_attempt_at = $2,
       retry_until = $2::timestamptz + $3::interval
 WHERE id = $1 AND status <> 'PENDING'
RETURNING id, turn, endpoint_id;

-- name: delivery_get
-- One delivery with its event's type.
SELECT d.*, v.event_type
  FROM webhook_delivery d JOIN webhook_event v ON v.event_id = d.event_id
 WHERE d.id = $1;

-- name: delivery_list
-- An endpoint's deliveries newest first, optionally of one status.
SELECT d.*, v.event_type
  FROM webhook_delivery d JOIN webhook_event v ON v.event_id = d.event_id
 WHERE d.endpoint_id = $1 AND ($2::text IS NULL OR d.status = $2)
 ORDER BY d.id DESC
 LIMIT $3;

-- name: delivery_prune
-- Retention: finished deliveries (DELIVERED, FAILED) created before $1, oldest
-- first; PENDING ones are never pruned.
WITH gone AS (
    DELETE FROM webhook_delivery
     WHERE id = ANY (ARRAY(SELECT id FROM webhook_delivery
                            WHERE created_at < $1 AND status <> 'PENDING'
                            ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED))
    RETURNING 1
)
SELECT count(*) AS webhook_delivery FROM gone;

-- name: event_prune
-- Retention: kept event bodies older than $1 no delivery refers to any more.
WITH gone AS (
    DELETE FROM webhook_event
     WHERE event_id = ANY (ARRAY(
               SELECT v.event_id FROM webhook_event v
                WHERE v.created_at < $1
                  AND NOT EXISTS (SELECT 1 FROM webhook_delivery d WHERE d.event_id = v.event_id)
                ORDER BY v.created_at LIMIT $2 FOR UPDATE SKIP LOCKED))
    RETURNING 1
)
SELECT count(*) AS webhook_event FROM gone;
