-- Named queries of the notifications module: messages sent, contacts.

-- name: notification_recorded_before
-- Which deliveries of a batch (message ids as text, $1, recipients $2, channels
-- $3, targets $4, and their events' creation times, $5: the partition key)
-- already have a row: their positions in the arrays (1-based) and status. A
-- first delivery finds none; a redelivered event finds its deliveries and sends
-- nothing twice on a channel. $6/$7 bound the times so only those days'
-- partitions are probed.
SELECT m.ord::int, n.status
  FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[], $5::timestamptz[])
       WITH ORDINALITY AS m(event_id, recipient, channel, target, created, ord)
  JOIN notification n ON n.event_id = m.event_id AND n.recipient = m.recipient
                     AND n.channel = m.channel AND n.target = m.target
                     AND n.event_created_at = m.created
 WHERE n.event_created_at BETWEEN $6 AND $7;

-- name: notification_record_sent
-- The deliveries their channels accepted, written once, after the sends (no row
-- is written before a send: a delivery whose send or record a crash cut off is
-- sent again on redelivery). One that had failed before (its PENDING row)
-- becomes SENT. $9: each message's event creation time (the partition key).
INSERT INTO notification (event_id, topic, recipient, channel, target, subject, body, status,
                          sent_at, event_created_at)
SELECT e, t, r, ch, tg, s, b, 'SENT', $8, c
  FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[],
              $7::text[], $9::timestamptz[]) AS m(e, t, r, ch, tg, s, b, c)
ON CONFLICT ON CONSTRAINT notification_once
DO UPDATE SET status = 'SENT', sent_at = EXCLUDED.sent_at, last_error = NULL
 WHERE notification.status = 'PENDING';

-- name: notification_failed
-- Deliveries whose send failed: kept PENDING with the reason ($8), counting the
-- failed attempts (one already SENT or GONE stays so); their retry jobs take
-- them from here. $9: the events' creation times (the partition key).
INSERT INTO notification (event_id, topic, recipient, channel, target, subject, body, attempts,
                          last_error, event_created_at)
SELECT e, t, r, ch, tg, s, b, 1, err, c
  FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[],
              $7::text[], $8::text[], $9::timestamptz[]) AS m(e, t, r, ch, tg, s, b, err, c)
ON CONFLICT ON CONSTRAINT notification_once
DO UPDATE SET attempts = notification.attempts + 1, last_error = EXCLUDED.last_error
 WHERE notification.status = 'PENDING';

-- name: notification_gone
-- Push deliveries whose subscription the push service says is gone (404/410):
-- nothing more to send. sent_at ($8) is when the delivery ended, for retention.
INSERT INTO notification (event_id, topic, recipient, channel, target, subject, body, status,
                          last_error, sent_at, event_created_at)
SELECT e, t, r, ch, tg, s, b, 'GONE', 'the push subscription is gone', $8, c
  FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[],
              $7::text[], $9::timestamptz[]) AS m(e, t, r, ch, tg, s, b, c)
ON CONFLICT ON CONSTRAINT notification_once
DO UPDATE SET status = 'GONE', sent_at = EXCLUDED.sent_at, last_error = EXCLUDED.last_error
 WHERE notification.status = 'PENDING';

-- name: notification_delivery
-- A retry job's delivery (deliveries.py): its message and state.
SELECT topic, subject, body, status, attempts
  FROM notification
 WHERE event_id = $1 AND recipient = $2 AND channel = $3 AND target = $4
   AND event_created_at = $5;

-- name: notification_retried
-- A retry's outcome: SENT or GONE ($6, with sent_at $7), or still PENDING with
-- one more attempt and its reason ($8). Only a PENDING row changes.
UPDATE notification
   SET status = $6,
       sent_at = CASE WHEN $6 = 'PENDING' THEN NULL ELSE $7::timestamptz END,
       attempts = attempts + CASE WHEN $6 = 'PENDING' THEN 1 ELSE 0 END,
       last_error = $8
 WHERE event_id = $1 AND recipient = $2 AND channel = $3 AND target = $4
   AND event_created_at = $5 AND status = 'PENDING'
RETURNING attempts;

-- name: notification_prune
-- Retention: SENT (or GONE) notifications ended before $1, walked in creation order (index
-- notification_created_at; sent_at >= created_at), only of events created
-- before $1's day (as inbox_prune). PENDING ones are never pruned. Deleted by
-- id (one sequence: unique), as outbox_prune.
WITH gone AS (
    DELETE FROM notification
     WHERE id = ANY (ARRAY(SELECT id FROM notification
                            WHERE created_at < $1 AND status <> 'PENDING' AND sent_at < $1
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
                  AND status <> 'PENDING' AND sent_at >= $3);

-- name: contact_put
-- A user's notification addresses (both replaced; NULL: the channel's default).
INSERT INTO contact (user_id, email, phone, updated_at) VALUES ($1, $2, $3, $4)
ON CONFLICT (user_id) DO UPDATE
   SET email = EXCLUDED.email, phone = EXCLUDED.phone, updated_at = EXCLUDED.updated_at
RETURNING user_id, email, phone;

-- name: contact_of_many
-- The addresses of a batch of notification recipients (no row: none set), with
-- their push subscriptions as [endpoint, p256dh, auth] rows.
SELECT c.user_id, c.email, c.phone,
       coalesce((SELECT array_agg(ARRAY[s.endpoint, s.p256dh, s.auth] ORDER BY s.id)
                   FROM push_subscription s WHERE s.user_id = c.user_id),
                '{}') AS push
  FROM contact c WHERE c.user_id = ANY($1::bigint[]);

-- name: push_subscriptions_put
-- A user's push subscriptions become exactly $2 (endpoints, distinct) with their
-- keys $3/$4: the others are deleted, a known endpoint takes the new keys.
WITH gone AS (
    DELETE FROM push_subscription WHERE user_id = $1 AND NOT (endpoint = ANY ($2::text[]))
)
INSERT INTO push_subscription (user_id, endpoint, p256dh, auth, created_at)
SELECT $1, e, k, a, $5 FROM unnest($2::text[], $3::text[], $4::text[]) AS s(e, k, a)
ON CONFLICT ON CONSTRAINT push_subscription_once
DO UPDATE SET p256dh = EXCLUDED.p256dh, auth = EXCLUDED.auth;

-- name: push_subscription_delete
-- The push service answered 404/410 for it: the browser unsubscribed.
DELETE FROM push_subscription WHERE user_id = $1 AND endpoint = $2;
