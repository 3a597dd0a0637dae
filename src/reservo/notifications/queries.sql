-- Named queries of the notifications module: messages sent, contacts.

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

-- name: contact_put
-- A user's notification addresses (both replaced; NULL: the channel's default).
INSERT INTO contact (user_id, email, phone, updated_at) VALUES ($1, $2, $3, $4)
ON CONFLICT (user_id) DO UPDATE
   SET email = EXCLUDED.email, phone = EXCLUDED.phone, updated_at = EXCLUDED.updated_at
RETURNING user_id, email, phone;

-- name: contact_of_many
-- The addresses of a batch of notification recipients (no row: none set).
SELECT user_id, email, phone FROM contact WHERE user_id = ANY($1::bigint[]);
