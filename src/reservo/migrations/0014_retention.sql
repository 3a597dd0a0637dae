-- Retention (reservo.core.maintenance.retention, run by the `maintenance` role): indexes that
-- let each prune statement find the oldest prunable rows in time order without
-- scanning the table. Each prune batch walks one of these in its time order and
-- stops after the batch, so a batch costs the same on a table of a thousand rows
-- or of a hundred million.
--
-- Plain CREATE INDEX: cheap on the empty or small tables of a new deployment. On a
-- deployment whose tables are already large, create the same indexes first with
-- CREATE INDEX CONCURRENTLY (same names and definitions, outside a transaction);
-- IF NOT EXISTS then makes this migration a no-op.

-- DONE outbox rows, by publication time. The status change to DONE already
-- updates the outbox_pending index (its predicate reads status), so this adds
-- one index entry per event, never a lost HOT update. PENDING and DEAD rows are
-- not in it: they are never pruned.
CREATE INDEX IF NOT EXISTS outbox_done_published ON outbox (published_at)
    WHERE status = 'DONE';

-- Inbox rows are inserted once and never updated: the entry is appended at the
-- right edge of the index.
CREATE INDEX IF NOT EXISTS inbox_processed_at ON inbox (processed_at);

-- Notifications by creation time, not a partial index on SENT/sent_at: marking a
-- notification SENT touches no indexed column, so that update can stay HOT (no
-- index work at all) at 500,000 notifications a minute. The prune walks this
-- index in creation order and keeps whatever is not SENT (a SENT row's sent_at
-- is never before its created_at, so the old SENT rows are all on that walk).
CREATE INDEX IF NOT EXISTS notification_created_at ON notification (created_at);

-- Finished jobs (DONE, CANCELLED, DEAD: the states nothing leaves), by finish
-- time. Settling a job already changes status (read by the partial pending and
-- running indexes), so this adds one entry per finished job. Executions are
-- deleted with their job through job_execution's primary key (job_id, attempt).
CREATE INDEX IF NOT EXISTS scheduled_job_finished ON scheduled_job (finished_at)
    WHERE status IN ('DONE', 'CANCELLED', 'DEAD');

-- Replayed dead letters only: the ones not replayed yet are never pruned.
CREATE INDEX IF NOT EXISTS dead_letter_replayed ON dead_letter (replayed_at)
    WHERE replayed_at IS NOT NULL;

-- Result webhooks resent from the fallback table (PENDING and FAILED are kept).
CREATE INDEX IF NOT EXISTS webhook_events_fallback_resent ON webhook_events_fallback (resent_at)
    WHERE status = 'RESENT';

CREATE INDEX IF NOT EXISTS webhook_events_rejected_received
    ON webhook_events_rejected (received_at);
