-- Named queries of core/messaging: the outbox, the inbox, dead letters, the backlog.

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
-- (reservo.core.maintenance.partitions); what is left to batches is the default partition
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

-- name: dead_letter_local_replaying
-- The in-process letter of an event for a consumer: no row when none is parked;
-- true while it is being replayed (dead_letter_take_for_replay stamped it).
SELECT replayed_at IS NOT NULL FROM dead_letter
 WHERE consumer = $1 AND event_id = $2 AND partition IS NULL;

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
-- default partition only. The day partitions go whole (reservo.core.maintenance.partitions)
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

-- name: dead_letter_prunable
-- Retention (prune_by_ctid): dead letters replayed before $1. One not replayed yet
-- is never pruned.
SELECT ctid FROM dead_letter WHERE replayed_at < $1 ORDER BY replayed_at;
