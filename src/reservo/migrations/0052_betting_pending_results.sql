-- Betting: no accepted result is dropped.
--
-- A result whose matchExternalId no match has yet (providers report before an
-- operator creates the match) is kept here, and applied in the transaction that
-- creates the match (POST /api/matches); a result that conflicts with the one a
-- match settled on is parked as a dead letter (consumer betting.settlement). One
-- row per provider event: two reports before one match are both kept, the
-- first (by id, the order the consumer took them) is applied and the other is
-- then an identical no-op or a parked conflict.
CREATE TABLE betting_pending_result (
    id                bigserial   PRIMARY KEY,
    provider_event_id text        NOT NULL,
    match_external_id text        NOT NULL,
    payload           jsonb       NOT NULL,  -- the webhook body, as the consumer got it
    received_at       timestamptz NOT NULL,
    CONSTRAINT betting_pending_result_event UNIQUE (provider_event_id)
);
-- The match's creation takes the results kept for it: one probe by external id.
CREATE INDEX betting_pending_result_match ON betting_pending_result (match_external_id, id);

-- The inbox's outcomes are now APPLIED, AWAITING_MATCH (kept above), SAME_RESULT
-- (the settled result reported again: nothing to do) and PARKED (a dead letter).
-- Rows of the former UNKNOWN_MATCH and DUPLICATE_MATCH record events that were
-- dropped; the consumer decides them again when they come back (the provider, or
-- an admin posting the result by hand). The dropped results for unknown matches
-- whose body the fallback table still holds (retention keeps RESENT rows for
-- hours), for a match that still does not exist, are recovered now: kept here.
INSERT INTO betting_pending_result (provider_event_id, match_external_id, payload, received_at)
SELECT provider_event_id, match_external_id, payload, received_at
  FROM (SELECT DISTINCT ON (i.provider_event_id)
               i.provider_event_id, i.match_external_id, f.payload, i.received_at
          FROM betting_result_inbox i
          JOIN webhook_events_fallback f ON f.provider_event_id = i.provider_event_id
         WHERE i.outcome = 'UNKNOWN_MATCH'
           AND NOT EXISTS (SELECT 1 FROM betting_match m WHERE m.external_id = i.match_external_id)
         ORDER BY i.provider_event_id, f.created_at) dropped
 ORDER BY received_at, provider_event_id
ON CONFLICT DO NOTHING;
UPDATE betting_result_inbox i SET outcome = 'AWAITING_MATCH'
  FROM betting_pending_result e
 WHERE e.provider_event_id = i.provider_event_id AND i.outcome = 'UNKNOWN_MATCH';
