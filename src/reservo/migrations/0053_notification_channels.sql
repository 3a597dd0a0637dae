-- Every channel a contact has (e-mail, SMS, push), each delivered and retried on
-- its own (notifications/consumer.py, notifications/deliveries.py).

-- 1. A user's Web Push subscriptions (the browser Push API's subscription: the
--    push service's endpoint, the browser's P-256 ECDH public key and its auth
--    secret, both base64url as the browser gives them). At most 5 per user (the
--    API's rule); a 404 or 410 from the push service deletes one.
CREATE TABLE IF NOT EXISTS push_subscription (
    id         bigserial   PRIMARY KEY,
    user_id    bigint      NOT NULL,
    endpoint   text        NOT NULL CHECK (length(endpoint) <= 2048),
    p256dh     text        NOT NULL,
    auth       text        NOT NULL,
    created_at timestamptz NOT NULL,
    CONSTRAINT push_subscription_once UNIQUE (user_id, endpoint)
);

-- 2. One notification row per (message, recipient, channel, target): the
--    channel's own delivery record, so a channel that is down retries its own
--    rows and nothing is sent twice on a channel. ``target`` names the one
--    address of a channel that has many (a push subscription's endpoint); ''
--    for e-mail and SMS. GONE: the push service said the subscription no
--    longer exists (404/410); nothing more to send, pruned as SENT is.
ALTER TABLE notification ADD COLUMN IF NOT EXISTS target text NOT NULL DEFAULT '';
ALTER TABLE notification DROP CONSTRAINT notification_once;
ALTER TABLE notification
    ADD CONSTRAINT notification_once UNIQUE (event_id, recipient, channel, target, event_created_at);
-- The status check under whatever name it got (0026 copied it with LIKE).
DO $$
DECLARE c record;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
              WHERE conrelid = 'notification'::regclass AND contype = 'c'
                AND pg_get_constraintdef(oid) LIKE '%status%'
    LOOP
        EXECUTE format('ALTER TABLE notification DROP CONSTRAINT %I', c.conname);
    END LOOP;
END $$;
ALTER TABLE notification
    ADD CONSTRAINT notification_status_check CHECK (status IN ('PENDING', 'SENT', 'GONE'));
