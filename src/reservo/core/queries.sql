-- Named queries of the platform (core). Loaded once by reservo.core.db.Queries.

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

-- name: prune_by_ctid
-- Retention (core/retention.py): one batch, at most $2, of a table's rows that a
-- module's `*_prunable` query finds (their ctids, oldest first, older than the
-- cutoff $1); the table and the query are filled in by prune_by_ctid there.
-- Every *_prune statement has this shape: ($1 cutoff, $2 batch size) -> one row
-- counting the deleted rows per table. FOR UPDATE SKIP LOCKED: a row a request
-- holds right now is left for the next run, so pruning never waits on the hot
-- path. The LIMIT on a line of its own: a comment ending the query must not
-- take it.
WITH gone AS (
    DELETE FROM {table}
     WHERE ctid = ANY (ARRAY({prunable}
                              LIMIT $2 FOR UPDATE SKIP LOCKED))
    RETURNING 1
)
SELECT count(*) AS {table} FROM gone;

-- name: idem_prunable
-- Retention: keys created before $1 (pruned by prune_by_ctid).
SELECT ctid FROM idempotency_key WHERE created_at < $1 ORDER BY created_at;

-- name: outbox_insert
-- An event to publish, written in the caller's transaction, with the trace
-- context and request id it was emitted in (NULL outside any).
INSERT INTO outbox (event_id, topic, key, payload, created_at, available_at, traceparent,
                    request_id)
VALUES ($1, $2, $3, $4, $5, $5, $6, $7);

-- name: outbox_claim
-- Lease a batch; SKIP LOCKED lets several relays share the backlog without
-- taking the same rows, and the lease returns rows of a crashed relay. A row
-- whose key has an earlier event that failed and waits for its retry stays
-- behind it, so a key's events go out in the order they were written (the
-- partial index outbox_failed_key makes that one probe of an empty index while
-- nothing fails).
UPDATE outbox o
   SET locked_until = $2::timestamptz + make_interval(secs => $3), attempts = o.attempts + 1
  FROM (SELECT p.id, p.created_at FROM outbox p
         WHERE p.status = 'PENDING' AND p.available_at <= $2
           AND (p.locked_until IS NULL OR p.locked_until < $2)
           AND NOT EXISTS (SELECT 1 FROM outbox f
                            WHERE f.status = 'PENDING' AND f.last_error IS NOT NULL
                              AND f.key = p.key AND f.id < p.id)
         ORDER BY p.id
         LIMIT $1
         FOR UPDATE SKIP LOCKED) c
 WHERE o.id = c.id AND o.created_at = c.created_at
RETURNING o.id, o.event_id, o.topic, o.key, o.payload, o.created_at, o.attempts,
          o.traceparent, o.request_id;

-- name: outbox_done
-- Events the transport acknowledged.
UPDATE outbox SET status = 'DONE', published_at = $2, locked_until = NULL, last_error = NULL
 WHERE id = ANY($1::bigint[]);

-- name: outbox_release
-- The transport was unavailable: hand the rows back without spending an attempt.
UPDATE outbox SET locked_until = NULL, attempts = greatest(attempts - 1, 0), available_at = $2
 WHERE id = ANY($1::bigint[]);

-- name: outbox_retry
-- A failed delivery: PENDING again at $3 (transient), or DEAD at once when $4
-- says the failure is permanent.
UPDATE outbox
   SET status = CASE WHEN $4::boolean THEN 'DEAD' ELSE 'PENDING' END,
       available_at = $3, locked_until = NULL, last_error = $2
 WHERE id = $1;

-- name: outbox_lag
-- Pending events and the age of the oldest (metrics).
SELECT count(*) AS pending,
       coalesce(extract(epoch FROM ($1::timestamptz - min(created_at))), 0)::float8 AS oldest_s
  FROM outbox WHERE status = 'PENDING';

-- name: outbox_dead_count
-- Events given up on (metrics).
SELECT count(*) FROM outbox WHERE status = 'DEAD';

-- name: outbox_prune
-- Retention: DONE events published before $1 (index outbox_done_published).
-- PENDING rows (still to deliver) and DEAD ones (to replay) are never pruned.
-- Only rows created before $1's day (UTC): the day partitions from then on are
-- not wholly past the cutoff yet, and are dropped whole once they are
-- (reservo.core.partitions); what is left to batches is the default partition
-- and the old days a drop had to leave (a row still pending). The bound on
-- created_at prunes the newer partitions from both scans. Deleted by id (one
-- sequence: unique), looked up in each remaining partition's primary key; not
-- by ctid, which is unique only within one partition, and not by a join, which
-- the planner answered with a hash of the whole default partition per batch.
WITH gone AS (
    DELETE FROM outbox
     WHERE id = ANY (ARRAY(SELECT id FROM outbox
                            WHERE status = 'DONE' AND published_at < $1
                              AND created_at < date_trunc('day', $1::timestamptz, 'UTC')
                            ORDER BY published_at LIMIT $2 FOR UPDATE SKIP LOCKED))
       AND created_at < date_trunc('day', $1::timestamptz, 'UTC')
    RETURNING 1
)
SELECT count(*) AS outbox FROM gone;

-- name: outbox_partition_blocked
-- True when the outbox's day partition [$1, $2) holds a row its drop must not
-- take with it: a PENDING event (still to deliver), a DONE one published at or
-- after the cutoff $3 (still within retention), or more DEAD events than a
-- drop re-inserts into the default partition under its lock (1,000; the rest
-- of the day then goes by batches). Each test walks a small partial index.
SELECT EXISTS (SELECT 1 FROM outbox
                WHERE created_at >= $1 AND created_at < $2 AND status = 'PENDING')
    OR EXISTS (SELECT 1 FROM outbox
                WHERE created_at >= $1 AND created_at < $2 AND status = 'DONE'
                  AND published_at >= $3)
    OR (SELECT count(*) FROM (SELECT 1 FROM outbox
                               WHERE created_at >= $1 AND created_at < $2
                                 AND status = 'DEAD' LIMIT 1001) d) > 1000;

-- name: partition_list
-- The day partitions of table $1 with their bounds, oldest first (migration 0025).
SELECT name, lower_bound, upper_bound FROM history_partitions($1);

-- name: partition_add
-- Creates table $1's partition for day $2 (UTC) unless it exists; true when created.
SELECT history_partition_add($1, $2::date);

-- name: partition_lock_timeout
-- How long the partition DDL of this transaction waits for a lock before giving up.
SELECT set_config('lock_timeout', $1::text || 'ms', true);

-- name: partition_lock
-- ACCESS EXCLUSIVE on table $1 for the rest of the transaction (a retirement's first step).
SELECT history_partition_lock($1);

-- name: partition_retire
-- Detaches and drops partition $2 of table $1, re-inserting its rows whose
-- column $3 is one of $4 (they land in the default partition). NULL: gone already.
SELECT history_partition_retire($1, $2, $3, $4::text[]);

-- name: inbox_claim
-- Apply an event once per consumer: no row when it was applied before. $3 is
-- the event's creation time (the partition key, the same on every delivery).
INSERT INTO inbox (consumer, event_id, event_created_at) VALUES ($1, $2, $3)
ON CONFLICT DO NOTHING
RETURNING event_id;

-- name: inbox_claim_many
-- A batch of events in one statement ($2 ids, $3 their creation times); returns
-- the ids not applied before (an id twice in the batch is inserted, and
-- returned, once).
INSERT INTO inbox (consumer, event_id, event_created_at)
SELECT $1, e, t FROM unnest($2::uuid[], $3::timestamptz[]) AS u(e, t)
ON CONFLICT DO NOTHING
RETURNING event_id;

-- name: notification_sent_before
-- Which messages of a batch (ids as text, $1, with their recipients, $2, and
-- their events' creation times, $3: the partition key) were already sent: their
-- positions in the arrays (1-based). A first delivery finds none; a redelivered
-- event finds its messages and sends nothing twice. $4/$5 bound the times so
-- only those days' partitions are probed.
SELECT m.ord::int
  FROM unnest($1::uuid[], $2::bigint[], $3::timestamptz[])
       WITH ORDINALITY AS m(event_id, recipient, created, ord)
  JOIN notification n ON n.event_id = m.event_id AND n.recipient = m.recipient
                     AND n.event_created_at = m.created
 WHERE n.status = 'SENT' AND n.event_created_at BETWEEN $4 AND $5;

-- name: notification_record_sent
-- The messages the channel accepted, written once, after the sends (no row is
-- written before a send: a message whose send or record a crash cut off is sent
-- again on redelivery, as it would be from a PENDING row). A message that had
-- failed before (its PENDING row) becomes SENT. $8: each message's event
-- creation time (the partition key).
INSERT INTO notification (event_id, topic, recipient, channel, subject, body, status, sent_at,
                          event_created_at)
SELECT e, t, r, $4, s, b, 'SENT', $7, c
  FROM unnest($1::uuid[], $2::text[], $3::bigint[], $5::text[], $6::text[],
              $8::timestamptz[]) AS m(e, t, r, s, b, c)
ON CONFLICT ON CONSTRAINT notification_once
DO UPDATE SET status = 'SENT', sent_at = EXCLUDED.sent_at, last_error = NULL
 WHERE notification.status <> 'SENT';

-- name: notification_failed
-- A send that failed: the message is kept PENDING with the reason, counting the
-- failed attempts (a message already SENT stays SENT). $8: the event's creation
-- time (the partition key).
INSERT INTO notification (event_id, topic, recipient, channel, subject, body, attempts, last_error,
                          event_created_at)
VALUES ($1, $2, $3, $4, $5, $6, 1, $7, $8)
ON CONFLICT ON CONSTRAINT notification_once
DO UPDATE SET attempts = notification.attempts + 1, last_error = EXCLUDED.last_error;

-- name: dead_letter_insert
-- Kafka consumer gave up on a record: park it (once per consumer and record).
INSERT INTO dead_letter
       (consumer, topic, partition, record_offset, event_id, key, value, error, attempts, parked_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (consumer, topic, partition, record_offset) DO NOTHING;

-- name: dead_letter_park_local
-- The in-process transport parks an event a consumer rejected (once per consumer and event).
INSERT INTO dead_letter (consumer, topic, event_id, key, value, error, attempts, parked_at)
VALUES ($1, $2, $3, $4, $5, $6, 1, $7)
ON CONFLICT (consumer, event_id) WHERE partition IS NULL DO NOTHING;

-- name: backlog
-- What /readyz shows of work waiting: outbox events pending and those being
-- retried (capped counts: cheap even with a large backlog), the age of the oldest
-- pending event, and the dead letters no one has replayed yet.
SELECT (SELECT count(*) FROM (SELECT 1 FROM outbox WHERE status = 'PENDING' LIMIT 100000) p)
           AS pending,
       (SELECT count(*) FROM (SELECT 1 FROM outbox WHERE status = 'PENDING' AND attempts > 0
                               LIMIT 100000) r) AS retrying,
       coalesce((SELECT extract(epoch FROM ($1::timestamptz - created_at)) FROM outbox
                  WHERE status = 'PENDING' ORDER BY id LIMIT 1), 0)::float8 AS oldest_s,
       (SELECT count(*) FROM outbox WHERE status = 'DEAD') AS dead_events,
       (SELECT count(*) FROM dead_letter WHERE replayed_at IS NULL) AS dead_letters;

-- name: custom_plans
-- For the rest of the transaction, plan each statement for its parameters'
-- values. dead_letter_page's `$1 IS NULL OR consumer = $1` has one good plan
-- per value (the consumer's index, or the primary key); the generic plan a
-- prepared statement gets after five runs walks the primary key and filters,
-- reading every letter when the consumer has few.
SET LOCAL plan_cache_mode = force_custom_plan;

-- name: dead_letter_page
-- Newest first, optionally of one consumer; keyset on id (index dead_letter_consumer_id).
SELECT id, consumer, topic, event_id, error, attempts, parked_at, replayed_at
  FROM dead_letter
 WHERE ($1::text IS NULL OR consumer = $1) AND ($2::bigint IS NULL OR id < $2)
 ORDER BY id DESC
 LIMIT $3;

-- name: dead_letter_get
-- One dead letter with the record it parked (the console's inspect page).
SELECT id, consumer, topic, event_id, error, attempts, parked_at, replayed_at, key, value
  FROM dead_letter
 WHERE id = $1;

-- name: dead_letter_take_for_replay
-- Claim a dead letter for a replay (one replay at a time); NULL when it is already replayed.
UPDATE dead_letter SET replayed_at = $2
 WHERE id = $1 AND replayed_at IS NULL
RETURNING consumer, topic, value;

-- name: dead_letter_exists
-- Whether a dead letter exists: a replay found nothing to take, done or 404.
SELECT EXISTS (SELECT 1 FROM dead_letter WHERE id = $1);

-- name: dead_letter_replay_failed
-- The replay failed: the letter stays parked, with the new error and one more attempt.
UPDATE dead_letter SET replayed_at = NULL, error = $2, attempts = attempts + 1 WHERE id = $1;

-- name: inbox_prune
-- Retention: inbox rows processed before $1 (index inbox_processed_at), of the
-- default partition only. The day partitions go whole (reservo.core.partitions)
-- and a day a drop had to leave is left whole too: it is held by a row applied
-- within retention or by a PENDING event, and dropped once that is over. So
-- batches see the rows no day covered. A row whose event the outbox still holds
-- PENDING stays (the relay delivers it again; one probe of the outbox's
-- (event_id, created_at) key). Settings make the cutoff older than any
-- redelivery of the event can be (see retention_inbox_hours). By ctid: one
-- table, the default partition.
WITH gone AS (
    DELETE FROM inbox_default
     WHERE ctid = ANY (ARRAY(SELECT ctid FROM inbox_default i
                              WHERE processed_at < $1
                                AND NOT EXISTS (SELECT 1 FROM outbox o
                                                 WHERE o.event_id = i.event_id
                                                   AND o.created_at = i.event_created_at
                                                   AND o.status = 'PENDING')
                              ORDER BY processed_at LIMIT $2 FOR UPDATE OF i SKIP LOCKED))
    RETURNING 1
)
SELECT count(*) AS inbox FROM gone;

-- name: inbox_partition_blocked
-- True when the inbox's day partition [$1, $2) (events created that day) must
-- stay: one of its rows was applied at or after the cutoff $3 (a redelivery may
-- still come, as when rows went by batches), or the outbox still holds a
-- PENDING event of that day (the relay delivers it again). Two index probes.
SELECT EXISTS (SELECT 1 FROM inbox
                WHERE event_created_at >= $1 AND event_created_at < $2
                  AND processed_at >= $3)
    OR EXISTS (SELECT 1 FROM outbox
                WHERE created_at >= $1 AND created_at < $2 AND status = 'PENDING');

-- name: notification_prune
-- Retention: SENT notifications sent before $1, walked in creation order (index
-- notification_created_at; sent_at >= created_at), only of events created
-- before $1's day (as inbox_prune). PENDING ones are never pruned. Deleted by
-- id (one sequence: unique), as outbox_prune.
WITH gone AS (
    DELETE FROM notification
     WHERE id = ANY (ARRAY(SELECT id FROM notification
                            WHERE created_at < $1 AND status = 'SENT' AND sent_at < $1
                              AND event_created_at < date_trunc('day', $1::timestamptz, 'UTC')
                            ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED))
       AND event_created_at < date_trunc('day', $1::timestamptz, 'UTC')
    RETURNING 1
)
SELECT count(*) AS notification FROM gone;

-- name: notification_partition_blocked
-- True when the notification day partition [$1, $2) must stay: a row of it was
-- recorded or sent at or after the cutoff $3 (a redelivery may still come), or
-- the outbox still holds a PENDING event of that day. PENDING notifications do
-- not hold it: the drop moves them to the default partition. sent_at has no
-- index (marking a row SENT stays HOT), so that test reads the day's rows: a
-- pause of the notifications consumer only, the table's one writer.
SELECT EXISTS (SELECT 1 FROM notification
                WHERE event_created_at >= $1 AND event_created_at < $2
                  AND created_at >= $3)
    OR EXISTS (SELECT 1 FROM outbox
                WHERE created_at >= $1 AND created_at < $2 AND status = 'PENDING')
    OR EXISTS (SELECT 1 FROM notification
                WHERE event_created_at >= $1 AND event_created_at < $2
                  AND status = 'SENT' AND sent_at >= $3);

-- name: dead_letter_prunable
-- Retention (prune_by_ctid): dead letters replayed before $1. One not replayed yet
-- is never pruned.
SELECT ctid FROM dead_letter WHERE replayed_at < $1 ORDER BY replayed_at;

-- name: contact_put
-- A user's notification addresses (both replaced; NULL: the channel's default).
INSERT INTO contact (user_id, email, phone, updated_at) VALUES ($1, $2, $3, $4)
ON CONFLICT (user_id) DO UPDATE
   SET email = EXCLUDED.email, phone = EXCLUDED.phone, updated_at = EXCLUDED.updated_at
RETURNING user_id, email, phone;

-- name: contact_of_many
-- The addresses of a batch of notification recipients (no row: none set).
SELECT user_id, email, phone FROM contact WHERE user_id = ANY($1::bigint[]);

-- name: primary_wal_position
-- Where the primary's WAL ends now, in bytes (the read replicas' yardstick).
SELECT pg_current_wal_lsn() - '0/0'::pg_lsn;

-- name: replica_replay_position
-- Whether this server is a standby, and how much WAL it has replayed, in bytes.
SELECT pg_is_in_recovery() AS in_recovery,
       pg_last_wal_replay_lsn() - '0/0'::pg_lsn AS replayed;
