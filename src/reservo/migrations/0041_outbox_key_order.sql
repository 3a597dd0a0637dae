-- The relay's claim keeps a key's events behind an earlier one of the same key
-- that failed and waits for its retry (core/queries.sql outbox_claim): this
-- partial index holds only such rows, so the check is one probe of an index that
-- is empty while nothing fails.
CREATE INDEX IF NOT EXISTS outbox_failed_key ON outbox (key, id)
 WHERE status = 'PENDING' AND last_error IS NOT NULL;
