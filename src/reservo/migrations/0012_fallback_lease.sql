-- The result fallback resender leases its rows instead of holding their row locks
-- in a transaction while it publishes to Kafka: a claim stamps leased_until and
-- commits, the publishing happens outside any transaction, a short transaction
-- marks the outcome. Rows of a resender that died mid-publish come back when the
-- lease ends. NULL: not leased.
ALTER TABLE webhook_events_fallback ADD COLUMN leased_until timestamptz;
