-- Betting, second release: suspended markets and the two lists
-- (GET /api/matches?status=..., GET /api/accounts/{id}/bets).
--
-- Plain CREATE INDEX, as in 0014: on a deployment whose betting tables are already
-- large, create the same indexes first with CREATE INDEX CONCURRENTLY (same names
-- and definitions, outside a transaction); IF NOT EXISTS then skips them here.

-- An admin suspends a match's markets (PATCH /api/matches/{id}); a bet on it is
-- refused (409 market_suspended) until it is reopened. A constant default: no
-- table rewrite.
ALTER TABLE betting_match ADD COLUMN IF NOT EXISTS suspended boolean NOT NULL DEFAULT false;

-- The match lists, soonest first: keyset on (starts_at, id). UPCOMING and STARTED
-- walk the not-yet-settled matches (UPCOMING from now on, STARTED up to now), so
-- neither reads the settled history; SETTLED walks only settled matches. A match
-- changes index twice in its life (its result, its settlement); every other update
-- of the row (odds, suspension, settlement progress) leaves the indexed columns
-- alone and can stay HOT.
CREATE INDEX IF NOT EXISTS betting_match_unsettled_starts ON betting_match (starts_at, id)
    WHERE settlement_status <> 'SETTLED';
CREATE INDEX IF NOT EXISTS betting_match_settled_starts ON betting_match (starts_at, id)
    WHERE settlement_status = 'SETTLED';

-- An account's bets, newest first: keyset on id. Deliberately not on status:
-- settling a bet changes only status, payout and settled_at, none indexed, so
-- every settlement update stays HOT (fillfactor 90, see 0007); an index reading
-- status would add an index insertion per settled bet. The status filter reads
-- this index (see docs/OPERATIONS.md, "Wallet and betting").
CREATE INDEX IF NOT EXISTS betting_bet_account ON betting_bet (account_id, id);
