-- Named queries of the betting module.

-- name: insert_match
-- A new match with its odds.
INSERT INTO betting_match (external_id, home, away, starts_at, odds, created_at)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING *;

-- name: get_match
-- One match with how many of its legs are still pending.
SELECT m.*,
       (SELECT count(*) FROM betting_selection s
         WHERE s.match_id = m.id AND s.status = 'PENDING') AS pending_bets
  FROM betting_match m WHERE m.id = $1;

-- name: match_by_external_id
-- starts_at: the result webhook refuses a final result before kick-off; the
-- result: a second report of it is compared with it.
SELECT id, starts_at, settlement_status, result_status, home_score, away_score, result_event_id
  FROM betting_match WHERE external_id = $1;

-- name: lock_match_results
-- Serialises, until commit, everything that decides where a match's results go:
-- the settlement consumer taking a result and the creation of the match (which
-- applies the results kept for it). Taken before either reads: READ COMMITTED's
-- next statement then sees what the previous holder committed, so a result is
-- never kept for a match whose creation has already taken the kept ones.
-- Two keys ("RSLT", the external id's hash): apart from the single-key locks of
-- migrations; a hash collision only makes two matches' results wait.
SELECT pg_advisory_xact_lock(1381190740, hashtext($1));

-- name: matches_for_bet
-- The matches a bet is checked against, share-locked until the bet commits: a
-- change of odds or suspension (update_match) waits for bets already checked, and
-- a bet that comes after it reads the changed row (READ COMMITTED re-reads a row
-- it had to wait for), so no bet commits at odds the match no longer offers.
-- FOR SHARE, not FOR KEY SHARE: the latter does not conflict with an UPDATE that
-- leaves the key alone. Shared locks do not conflict with each other, so bets on
-- one match do not queue behind each other; ascending id anyway, like every lock.
SELECT id, starts_at, odds, result_status, suspended FROM betting_match
 WHERE id = ANY($1::bigint[])
 ORDER BY id
   FOR SHARE;

-- name: update_match
-- PATCH /api/matches/{id}: new odds ($2) and/or suspension ($3), NULL keeping the
-- current value, only while the match is open: not started at $4 (server clock)
-- and without a result. No row: unknown (404) or closed (409 match_closed).
UPDATE betting_match
   SET odds = coalesce($2::jsonb, odds), suspended = coalesce($3::boolean, suspended)
 WHERE id = $1 AND result_status IS NULL AND starts_at > $4
RETURNING *;

-- name: matches_upcoming
-- Not started at $1 and no result, soonest first, after the key ($2, $3). Walks
-- betting_match_unsettled_starts from max(now, key): no sort, no settled match read.
SELECT * FROM betting_match
 WHERE settlement_status <> 'SETTLED' AND result_status IS NULL
   AND starts_at > $1 AND (starts_at, id) > ($2, $3)
 ORDER BY starts_at, id
 LIMIT $4;

-- name: matches_started
-- Not settled and no longer upcoming: started at $1, or with a result (a match
-- cancelled before kick-off, while its bets are being voided), soonest first.
-- The first branch walks betting_match_unsettled_starts up to now; the second
-- reads the few settling matches (betting_match_settling); only the two short
-- branches are sorted together.
SELECT * FROM (
    (SELECT * FROM betting_match
      WHERE settlement_status <> 'SETTLED' AND starts_at <= $1
        AND (starts_at, id) > ($2, $3)
      ORDER BY starts_at, id
      LIMIT $4)
    UNION ALL
    (SELECT * FROM betting_match
      WHERE settlement_status = 'SETTLING' AND starts_at > $1
        AND (starts_at, id) > ($2, $3)
      ORDER BY starts_at, id
      LIMIT $4)
) m
 ORDER BY starts_at, id
 LIMIT $4;

-- name: matches_settled
-- Settled, soonest first, after the key ($1, $2) (betting_match_settled_starts).
SELECT * FROM betting_match
 WHERE settlement_status = 'SETTLED' AND (starts_at, id) > ($1, $2)
 ORDER BY starts_at, id
 LIMIT $3;

-- name: insert_bet
-- A new bet (its stake is debited in the same transaction).
INSERT INTO betting_bet (account_id, owner_id, currency, stake, potential_payout, created_at, legs)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING id, account_id, owner_id, stake, potential_payout, status, payout, created_at;

-- name: insert_selections
-- All the legs of a bet in one statement, from parallel arrays.
INSERT INTO betting_selection (bet_id, match_id, market, pick, odds)
SELECT $1, m, k, p, o
  FROM unnest($2::bigint[], $3::text[], $4::text[], $5::numeric[]) AS t(m, k, p, o);

-- name: get_bet
-- One bet by id (its legs come from bet_selections).
SELECT id, account_id, owner_id, stake, potential_payout, status, payout, created_at, settled_at
  FROM betting_bet WHERE id = $1;

-- name: account_bets
-- An account's bets, newest first, below id $2 (betting_bet_account, backward).
SELECT id, account_id, owner_id, stake, potential_payout, status, payout, created_at
  FROM betting_bet
 WHERE account_id = $1 AND id < $2
 ORDER BY id DESC
 LIMIT $3;

-- name: account_bets_by_status
-- The same, of one status ($4): a filter on the same walk (status is not indexed,
-- so that settling a bet stays a HOT update; see 0017_betting_lists.sql).
SELECT id, account_id, owner_id, stake, potential_payout, status, payout, created_at
  FROM betting_bet
 WHERE account_id = $1 AND id < $2 AND status = $4
 ORDER BY id DESC
 LIMIT $3;

-- name: selections_of_bets
-- The legs of a page of bets, through the primary key (bet_id, match_id).
SELECT bet_id, match_id, market, pick, odds, status FROM betting_selection
 WHERE bet_id = ANY($1::bigint[])
 ORDER BY bet_id, match_id;

-- name: bet_selections
-- The legs of one bet, by match id.
SELECT match_id, market, pick, odds, status FROM betting_selection
 WHERE bet_id = $1 ORDER BY match_id;

-- name: inbox_outcome
-- What became of a providerEventId the settlement consumer took before (no row:
-- never taken): APPLIED, AWAITING_MATCH, SAME_RESULT, PARKED; or, written before
-- results were kept for their match (migration 0052), UNKNOWN_MATCH and
-- DUPLICATE_MATCH (dropped, so decided again).
SELECT outcome FROM betting_result_inbox WHERE provider_event_id = $1;

-- name: record_outcome
-- The settlement inbox: where the result of a providerEventId went, whatever
-- carried it. Written only once the result is applied, kept or parked.
INSERT INTO betting_result_inbox (provider_event_id, match_external_id, outcome, received_at)
VALUES ($1, $2, $3, $4)
ON CONFLICT (provider_event_id) DO UPDATE SET outcome = excluded.outcome;

-- name: pending_insert
-- Keep a result for a match not created yet (one row per provider event).
INSERT INTO betting_pending_result (provider_event_id, match_external_id, payload, received_at)
VALUES ($1, $2, $3, $4)
ON CONFLICT (provider_event_id) DO NOTHING;

-- name: pending_take
-- The results kept for a match being created (betting_pending_result_match); they
-- leave the table with the creation's commit. The caller orders them by id.
DELETE FROM betting_pending_result WHERE match_external_id = $1
RETURNING id, provider_event_id, payload, received_at;

-- name: record_result
-- The first result of a match wins; the match starts settling. $7: the
-- provider's sequence when the result came as a correction.
UPDATE betting_match
   SET result_status = $2, home_score = $3, away_score = $4, result_event_id = $5,
       result_at = $6, settlement_status = 'SETTLING', result_sequence = $7
 WHERE external_id = $1 AND result_status IS NULL
RETURNING id;

-- name: match_result
-- A match's result and settlement status, read by each settlement chunk. FOR
-- KEY SHARE until the chunk commits: a resettlement (reopen_match, FOR UPDATE)
-- waits for the chunks grading under the old result, and a chunk that starts
-- after it reads the new one. KEY SHARE does not conflict with the chunks' own
-- progress UPDATEs (no key changes), so chunks never wait for each other here.
SELECT result_status, home_score, away_score, settlement_status, external_id
  FROM betting_match WHERE id = $1
   FOR KEY SHARE;

-- name: grade_chunk
-- Claim up to $2 pending legs of the match after bet $7 (SKIP LOCKED: several
-- settlement workers share one match), grade them, and settle the single-leg
-- bets among them in the same statement: a single's leg is its whole bet, so its
-- status is the leg's and needs no other leg read (70 % of the bets at the
-- bench's mix). Returns how many legs were graded and the last bet graded, the
-- accumulators graded (ascending; settle_bets recomputes them from all their
-- legs) and the settled singles as one array per column, read by position in
-- the order of settle_bets' columns: decoding five arrays is cheaper than
-- thousands of row records.
-- The keyset ($7) matters: graded legs leave dead entries at the front of the
-- partial index until VACUUM, and restarting from the front each chunk would
-- make a match's settlement quadratic in its bets. The claimed legs are found
-- again by primary key (= ANY of an array): joining the CTE instead let the
-- planner hash the match's every leg (a seq scan per chunk, seconds at 500k
-- legs). Their bets are one primary-key probe each (lateral), and the singles'
-- UPDATE joins those few rows by key; an "id = ANY(array)" condition there too
-- made the planner rescan the whole array per bet (25 s for a chunk of 5,000).
-- A single is paid as settle_bets pays it: floor(stake * odds) when WON, its
-- stake back when VOID.
WITH claimed AS (
    SELECT bet_id FROM betting_selection
     WHERE match_id = $1 AND status = 'PENDING' AND bet_id > $7
     ORDER BY bet_id
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), graded AS (
    UPDATE betting_selection s
       SET status = CASE
               WHEN $3::boolean THEN 'VOID'
               WHEN s.pick = CASE s.market WHEN '1X2' THEN $4::text
                                           WHEN 'TOTALS_2_5' THEN $5::text
                                           ELSE $6::text END THEN 'WON'
               ELSE 'LOST' END
     WHERE s.match_id = $1 AND s.bet_id = ANY (ARRAY(SELECT bet_id FROM claimed))
    RETURNING s.bet_id, s.status, s.odds
), bets AS (
    SELECT b.id, b.legs, g.status, g.odds FROM graded g
     CROSS JOIN LATERAL (SELECT id, legs FROM betting_bet WHERE id = g.bet_id) b
), singles AS (
    UPDATE betting_bet b
       SET status = s.status,
           payout = CASE s.status WHEN 'WON' THEN floor(b.stake * s.odds)::bigint
                                  WHEN 'VOID' THEN b.stake
                                  ELSE 0 END,
           settled_at = $8
      FROM bets s
     WHERE s.legs = 1 AND b.id = s.id AND b.status = 'PENDING'
    RETURNING b.id, b.account_id, b.owner_id, b.status, b.payout, b.generation
)
SELECT (SELECT count(*) FROM graded)::int AS graded,
       (SELECT max(bet_id) FROM graded) AS last,
       ARRAY(SELECT id FROM bets WHERE legs > 1 ORDER BY id) AS accumulators,
       coalesce(array_agg(id), '{}') AS ids,
       coalesce(array_agg(account_id), '{}') AS accounts,
       coalesce(array_agg(owner_id), '{}') AS owners,
       coalesce(array_agg(status), '{}') AS statuses,
       coalesce(array_agg(payout), '{}') AS payouts,
       coalesce(array_agg(generation), '{}') AS generations
  FROM singles;

-- name: lock_bets
-- The chunk's accumulators (grade_chunk settled its singles, which have no other
-- leg to race with). Ascending id order, so settlements of two matches sharing
-- accumulators queue instead of deadlocking. Locking before reading the legs
-- (next statement) means a concurrent settlement of another leg is seen once it
-- committed, so no accumulator is left PENDING by two settlements that each saw
-- the other's leg open. $1 is ascending (grade_chunk) and the lateral lookup
-- takes the locks in its order, one primary-key probe per bet: a join let the
-- planner scan the table.
SELECT b.id FROM unnest($1::bigint[]) AS u(id)
 CROSS JOIN LATERAL (SELECT id FROM betting_bet WHERE id = u.id FOR UPDATE) b;

-- name: settle_bets
-- Recompute each affected accumulator from all its legs, set-based: any LOST
-- leg -> LOST; a PENDING leg left -> stays PENDING; all VOID -> VOID (stake
-- back); else WON with floor(stake * product of the WON legs' odds) (VOID legs
-- count 1.00). Returns the settled bets as one array per column, in
-- grade_chunk's order of columns.
WITH settled AS (
    UPDATE betting_bet b
       SET status = CASE WHEN a.any_lost THEN 'LOST' WHEN a.all_void THEN 'VOID' ELSE 'WON' END,
           payout = CASE WHEN a.any_lost THEN 0
                         WHEN a.all_void THEN b.stake
                         ELSE floor(b.stake * a.product)::bigint END,
           settled_at = $2
      FROM (SELECT u.id AS bet_id, l.*
              -- a lateral aggregate: one primary-key lookup of the legs per bet,
              -- whatever the chunk and table sizes (a join was hashed over every leg)
              FROM unnest($1::bigint[]) AS u(id)
             CROSS JOIN LATERAL (
                   SELECT bool_or(s.status = 'LOST') AS any_lost,
                          bool_or(s.status = 'PENDING') AS any_pending,
                          bool_and(s.status = 'VOID') AS all_void,
                          betting_product(CASE WHEN s.status = 'WON' THEN s.odds ELSE 1 END) AS product
                     FROM betting_selection s WHERE s.bet_id = u.id) l) a
     WHERE b.id = a.bet_id AND b.status = 'PENDING' AND (a.any_lost OR NOT a.any_pending)
    RETURNING b.id, b.account_id, b.owner_id, b.status, b.payout, b.generation
)
SELECT coalesce(array_agg(id), '{}') AS ids,
       coalesce(array_agg(account_id), '{}') AS accounts,
       coalesce(array_agg(owner_id), '{}') AS owners,
       coalesce(array_agg(status), '{}') AS statuses,
       coalesce(array_agg(payout), '{}') AS payouts,
       coalesce(array_agg(generation), '{}') AS generations
  FROM settled;

-- name: add_progress
-- Count the bets a settlement chunk settled.
UPDATE betting_match SET settled_bets = settled_bets + $2 WHERE id = $1;

-- name: finish_settlement
-- SETTLED once no leg of the match is pending; only the first caller gets the row.
UPDATE betting_match SET settlement_status = 'SETTLED', settled_at = $2
 WHERE id = $1 AND settlement_status = 'SETTLING'
   AND NOT EXISTS (SELECT 1 FROM betting_selection
                    WHERE match_id = $1 AND status = 'PENDING');

-- name: settling_matches
-- Matches left SETTLING (a crashed settlement), for the sweeper.
SELECT id FROM betting_match WHERE settlement_status = 'SETTLING' ORDER BY id LIMIT $1;

-- name: fallback_insert
-- Keep a result that Kafka did not acknowledge, PENDING for the resender.
INSERT INTO webhook_events_fallback (id, provider_event_id, payload, created_at)
VALUES ($1, $2, $3, $4);

-- name: fallback_claim
-- Lease a batch of PENDING rows: SKIP LOCKED keeps resenders off each other's rows
-- for this statement only; the lease ($2 + $3 s) keeps them off while the rows are
-- published after the commit, and brings back the rows of a resender that died.
UPDATE webhook_events_fallback f
   SET leased_until = $2::timestamptz + make_interval(secs => $3)
  FROM (SELECT id FROM webhook_events_fallback
         WHERE status = 'PENDING' AND (leased_until IS NULL OR leased_until < $2)
         ORDER BY created_at
         LIMIT $1
           FOR UPDATE SKIP LOCKED) c
 WHERE f.id = c.id
RETURNING f.id, f.payload, f.attempts, f.created_at;

-- name: fallback_resent
-- Published (or settled): done. A row another resender already finished is left alone.
UPDATE webhook_events_fallback
   SET status = 'RESENT', resent_at = $2, attempts = attempts + 1, last_error = NULL,
       leased_until = NULL
 WHERE id = ANY($1::uuid[]) AND status = 'PENDING';

-- name: fallback_failed
-- One more failed attempt. Permanent ($3: the result itself is refused): FAILED,
-- parked for an operator. Transient (Kafka away): PENDING again, and the lease
-- becomes "not before" $4, the backoff, so the row is retried for as long as the
-- outage lasts without hammering the broker.
UPDATE webhook_events_fallback
   SET attempts = attempts + 1, last_error = $2,
       leased_until = CASE WHEN $3::boolean THEN NULL ELSE $4::timestamptz END,
       status = CASE WHEN $3::boolean THEN 'FAILED' ELSE 'PENDING' END
 WHERE id = $1 AND status = 'PENDING'
RETURNING status;

-- name: fallback_release
-- Leased but never tried (the lease ran short): back without spending an attempt.
UPDATE webhook_events_fallback SET leased_until = NULL
 WHERE id = ANY($1::uuid[]) AND status = 'PENDING';

-- name: record_rejected
-- Keep a webhook body that did not validate, for investigation.
INSERT INTO webhook_events_rejected (source, body, error, received_at) VALUES ($1, $2, $3, $4);

-- name: fallback_prunable
-- Retention (core's prune_by_ctid): fallback rows RESENT before $1. PENDING rows
-- (still to resend) and FAILED ones (for an operator) are never pruned; the
-- result itself stays in betting_result_inbox and betting_match.
SELECT ctid FROM webhook_events_fallback
 WHERE status = 'RESENT' AND resent_at < $1
 ORDER BY resent_at;

-- name: rejected_prunable
-- Retention (core's prune_by_ctid): rejected (malformed) webhook bodies received
-- before $1.
SELECT ctid FROM webhook_events_rejected WHERE received_at < $1 ORDER BY received_at;

-- name: lock_many_match_results
-- lock_match_results for a batch of results (the resender's, a Kafka fetch), taken
-- up front in one order (ascending key) so two batches sharing matches queue
-- instead of deadlocking; each result's own lock after this is re-entrant.
SELECT pg_advisory_xact_lock(1381190740, k)
  FROM (SELECT DISTINCT hashtext(e) AS k FROM unnest($1::text[]) AS u(e) ORDER BY 1) x;

-- name: results_settling
-- The matches of a settlement batch that have a result and are still settling.
-- FOR KEY SHARE, as match_result: a resettlement waits for the batch.
SELECT id, external_id, result_status, home_score, away_score
  FROM betting_match
 WHERE id = ANY($1::bigint[]) AND settlement_status = 'SETTLING' AND result_status IS NOT NULL
 ORDER BY id
   FOR KEY SHARE;

-- name: grade_matches
-- grade_chunk for many matches at once: claim up to $6 pending legs of the
-- matches $1 (SKIP LOCKED), grade each by its match's result (parallel arrays: $2
-- voided, $3..$5 the winning 1X2, TOTALS_2_5 and BTTS picks), and settle the
-- single-leg bets in the same statement. One statement for the whole batch of
-- matches, not one per match: at a result per match and a few bets each, the
-- per-match statements and commits were the cost. The legs are claimed per match
-- through betting_selection_pending (lateral, in bet order), the outer LIMIT
-- stopping the walk; a match whose legs did not all fit is left SETTLING for the
-- chunked path. The UPDATE finds the claimed legs again by their row address
-- (a TID scan of an array): they stay where they are while this transaction holds
-- their locks, and joining the claim on the key let the planner hash every leg
-- of the table (a seq scan per batch). Returns the match of each graded leg, the
-- accumulators graded (ascending) with one of their graded matches, and the
-- settled singles (grade_chunk's columns, then their match).
WITH r AS (
    SELECT * FROM unnest($1::bigint[], $2::boolean[], $3::text[], $4::text[], $5::text[])
        AS r(match_id, void, p1x2, ptotals, pbtts)
), claimed AS MATERIALIZED (
    SELECT c.leg FROM r CROSS JOIN LATERAL (
        SELECT ctid AS leg FROM betting_selection
         WHERE match_id = r.match_id AND status = 'PENDING'
         ORDER BY bet_id
           FOR UPDATE SKIP LOCKED) c
     LIMIT $6
), graded AS (
    UPDATE betting_selection s
       SET status = CASE
               WHEN r.void THEN 'VOID'
               WHEN s.pick = CASE s.market WHEN '1X2' THEN r.p1x2
                                           WHEN 'TOTALS_2_5' THEN r.ptotals
                                           ELSE r.pbtts END THEN 'WON'
               ELSE 'LOST' END
      FROM r
     WHERE s.ctid = ANY (ARRAY(SELECT leg FROM claimed)) AND r.match_id = s.match_id
    RETURNING s.match_id, s.bet_id, s.status, s.odds
), bets AS (
    SELECT b.id, b.legs, g.match_id, g.status, g.odds FROM graded g
     CROSS JOIN LATERAL (SELECT id, legs FROM betting_bet WHERE id = g.bet_id) b
), singles AS (
    UPDATE betting_bet b
       SET status = s.status,
           payout = CASE s.status WHEN 'WON' THEN floor(b.stake * s.odds)::bigint
                                  WHEN 'VOID' THEN b.stake
                                  ELSE 0 END,
           settled_at = $7
      FROM bets s
     WHERE s.legs = 1 AND b.id = s.id AND b.status = 'PENDING'
    RETURNING b.id, b.account_id, b.owner_id, b.status, b.payout, b.generation, s.match_id
), accumulators AS (
    SELECT id, min(match_id) AS match_id FROM bets WHERE legs > 1 GROUP BY id
)
SELECT ARRAY(SELECT match_id FROM graded) AS legs,
       ARRAY(SELECT id FROM accumulators ORDER BY id) AS accumulators,
       ARRAY(SELECT match_id FROM accumulators ORDER BY id) AS accumulator_matches,
       coalesce(array_agg(id), '{}') AS ids,
       coalesce(array_agg(account_id), '{}') AS accounts,
       coalesce(array_agg(owner_id), '{}') AS owners,
       coalesce(array_agg(status), '{}') AS statuses,
       coalesce(array_agg(payout), '{}') AS payouts,
       coalesce(array_agg(generation), '{}') AS generations,
       coalesce(array_agg(match_id), '{}') AS matches
  FROM singles;

-- name: add_progress_many
-- add_progress for a batch of matches (parallel arrays: match, legs graded).
UPDATE betting_match m SET settled_bets = settled_bets + p.n
  FROM unnest($1::bigint[], $2::int[]) AS p(id, n)
 WHERE m.id = p.id;

-- name: finish_settlements
-- finish_settlement for a batch of matches; returns the ones it finished.
UPDATE betting_match m SET settlement_status = 'SETTLED', settled_at = $2
 WHERE m.id = ANY($1::bigint[]) AND m.settlement_status = 'SETTLING'
   AND NOT EXISTS (SELECT 1 FROM betting_selection s
                    WHERE s.match_id = m.id AND s.status = 'PENDING')
RETURNING m.id;

-- name: results_seen
-- For a batch of results (parallel arrays: match external id, providerEventId),
-- in the batch's order: the match (no row: not created) and what became of the
-- providerEventId before (NULL: never taken). The batch accept's one read.
SELECT u.n, m.id, m.starts_at, m.result_status, i.outcome
  FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(external_id, provider_event_id, n)
  LEFT JOIN betting_match m ON m.external_id = u.external_id
  LEFT JOIN betting_result_inbox i ON i.provider_event_id = u.provider_event_id
 ORDER BY u.n;

-- name: record_results
-- record_result and record_outcome (APPLIED) for the results of a batch that are
-- their match's first (parallel arrays: external id, status, home, away,
-- providerEventId); the caller holds their matches' result locks and saw each
-- match without a result. Returns the matches now settling.
WITH u AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::int[], $5::text[])
        AS u(external_id, status, home, away, provider_event_id)
), recorded AS (
    UPDATE betting_match m
       SET result_status = u.status, home_score = u.home, away_score = u.away,
           result_event_id = u.provider_event_id, result_at = $6,
           settlement_status = 'SETTLING'
      FROM u
     WHERE m.external_id = u.external_id AND m.result_status IS NULL
    RETURNING m.id, m.external_id, u.provider_event_id
), outcomes AS (
    INSERT INTO betting_result_inbox (provider_event_id, match_external_id, outcome, received_at)
    SELECT provider_event_id, external_id, 'APPLIED', $6 FROM recorded
    ON CONFLICT (provider_event_id) DO UPDATE SET outcome = excluded.outcome
)
SELECT id FROM recorded;

-- name: lock_match_for_resettle
-- A match about to be settled again, locked FOR UPDATE until commit: this waits
-- for the settlement chunks grading it under its current result (they hold FOR
-- KEY SHARE, match_result / results_settling), and a chunk that comes after
-- reads the new result.
SELECT id, external_id, result_status, home_score, away_score, settlement_status,
       settlement_generation, result_sequence
  FROM betting_match WHERE id = $1
   FOR UPDATE;

-- name: lock_bets_of_match
-- Every bet with a leg on the match, locked in ascending id (as lock_bets): a
-- settlement of another match waits before it recomputes one of these
-- accumulators, then reads this match's leg reopened. The settled ones (status,
-- generation) are what the resettlement reverses.
SELECT id, account_id, status, generation FROM betting_bet
 WHERE id IN (SELECT bet_id FROM betting_selection WHERE match_id = $1)
 ORDER BY id
   FOR UPDATE;

-- name: reopen_match
-- Settle the match again under a new result: its legs PENDING, its settled bets
-- PENDING again under the next generation (their payouts were reversed in this
-- transaction), the match SETTLING under its next settlement generation. Rows
-- are updated, never deleted: the ledger keeps the first settlement and its
-- reversal. Returns the new generation.
WITH legs AS (
    UPDATE betting_selection SET status = 'PENDING'
     WHERE match_id = $1 AND status <> 'PENDING'
), bets AS (
    UPDATE betting_bet SET status = 'PENDING', payout = NULL, settled_at = NULL,
                           generation = generation + 1
     WHERE id = ANY($2::bigint[]) AND status <> 'PENDING'
)
UPDATE betting_match
   SET result_status = $3, home_score = $4, away_score = $5,
       result_event_id = coalesce($6, result_event_id), result_at = $7,
       result_sequence = coalesce($8, result_sequence), voided_reason = $9,
       settlement_status = 'SETTLING', settled_bets = 0, settled_at = NULL,
       -- a void of a match never settled settles it the first time
       settlement_generation = settlement_generation + (result_status IS NOT NULL)::int
 WHERE id = $1
RETURNING settlement_generation;

-- name: match_external_id
-- The key of the match's result lock (lock_match_results).
SELECT external_id FROM betting_match WHERE id = $1;
