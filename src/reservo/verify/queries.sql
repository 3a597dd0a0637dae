-- Named queries of the verify module: the cross-row invariants, read in keyset
-- pages. Every query takes the page's cursor ($1: the last key of the page
-- before, or the start value) and its size ($2), reads one page of its subject
-- rows by an index, and answers one row per violation found in that page
-- (subject, ids, facts), each row also carrying the page's last key (after)
-- and how many subject rows it held (seen); a page without a violation answers
-- one row whose subject is NULL, an empty page one row whose after is NULL.
-- Each page is one statement: a snapshot of its own, so every comparison is
-- made on rows of one moment, and no snapshot is held for the whole run.

-- name: page_settings
-- For the page's transaction only: no JIT. The pages' estimates (a lateral
-- lookup per row, generate_series' default thousand rows) look expensive
-- enough to compile, and compiling took 1.4 s of a page that runs in 8 ms.
SELECT set_config('jit', 'off', true);

-- name: slot_capacity
-- Slots whose counters disagree with their active (BOOKED or HELD, a lapsed hold
-- still holds its seat until it is flipped) appointments, or exceed capacity
-- plus the overbook limit; the slots after id $1, by the primary key.
WITH page AS MATERIALIZED (
    SELECT id, capacity, booked_count, overbook_limit, overbooked_count
      FROM time_slot WHERE id > $1 ORDER BY id LIMIT $2
), counted AS (
    SELECT p.*, a.ordinary, a.overbooked, a.ids
      FROM page p
      CROSS JOIN LATERAL (
          SELECT count(*) FILTER (WHERE NOT overbooked)::int AS ordinary,
                 count(*) FILTER (WHERE overbooked)::int AS overbooked,
                 coalesce(array_agg(id ORDER BY id), '{}') AS ids
            FROM appointment
           WHERE slot_id = p.id AND status IN ('BOOKED', 'HELD')) a
), bad AS (
    SELECT 'time_slot ' || id AS subject, ids,
           jsonb_build_object('capacity', capacity, 'bookedCount', booked_count,
                              'overbookLimit', overbook_limit,
                              'overbookedCount', overbooked_count,
                              'activeOrdinary', ordinary, 'activeOverbooked', overbooked) AS facts
      FROM counted
     WHERE booked_count <> ordinary OR overbooked_count <> overbooked
        OR booked_count > capacity OR overbooked_count > overbook_limit
        OR ordinary + overbooked > capacity + overbook_limit
)
SELECT s.after, s.seen, b.subject, b.ids, b.facts
  FROM (SELECT max(id) AS after, count(*)::int AS seen FROM page) s
  LEFT JOIN bad b ON true;

-- name: rental_overlap
-- Active rentals (HOLD, CONFIRMED, ON_TRIP) of one car whose periods overlap:
-- each pair once, named by its lower booking id; the bookings after id $1. The
-- other booking is found through ex_car_period's GiST index.
WITH page AS MATERIALIZED (
    SELECT id, car_id, period, status
      FROM booking WHERE id > $1 ORDER BY id LIMIT $2
), bad AS (
    SELECT 'car ' || p.car_id AS subject, ARRAY[p.id, o.id] AS ids,
           jsonb_build_object('carId', p.car_id, 'first', p.period::text,
                              'firstStatus', p.status, 'second', o.period::text,
                              'secondStatus', o.status) AS facts
      FROM page p
      JOIN booking o ON o.car_id = p.car_id AND o.period && p.period AND o.id > p.id
                    AND o.status IN ('HOLD', 'CONFIRMED', 'ON_TRIP')
     WHERE p.status IN ('HOLD', 'CONFIRMED', 'ON_TRIP')
)
SELECT s.after, s.seen, b.subject, b.ids, b.facts
  FROM (SELECT max(id) AS after, count(*)::int AS seen FROM page) s
  LEFT JOIN bad b ON true;

-- name: wallet_balance
-- Accounts whose balance is not the sum of their ledger entries (each sum one
-- range of wallet_entry_statement); the accounts after id $1.
WITH page AS MATERIALIZED (
    SELECT id, kind, balance FROM wallet_account WHERE id > $1 ORDER BY id LIMIT $2
), summed AS (
    SELECT p.*, e.total, e.entries
      FROM page p
      CROSS JOIN LATERAL (
          SELECT coalesce(sum(amount), 0)::numeric AS total, count(*)::bigint AS entries
            FROM wallet_entry WHERE account_id = p.id) e
), bad AS (
    SELECT 'wallet_account ' || id AS subject, ARRAY[id] AS ids,
           jsonb_build_object('kind', kind, 'balance', balance, 'sumOfEntries', total,
                              'entries', entries) AS facts
      FROM summed WHERE balance <> total
)
SELECT s.after, s.seen, b.subject, b.ids, b.facts
  FROM (SELECT max(id) AS after, count(*)::int AS seen FROM page) s
  LEFT JOIN bad b ON true;

-- name: wallet_transfer_entries
-- Transfers that are not exactly two entries, the amount out of its source and
-- in to its target (so they sum to zero); the transfers after id $1.
WITH page AS MATERIALIZED (
    SELECT id, kind, from_account_id, to_account_id, amount
      FROM wallet_transfer WHERE id > $1 ORDER BY id LIMIT $2
), legs AS (
    SELECT p.*, e.n, e.total, e.debit, e.credit, e.ids
      FROM page p
      CROSS JOIN LATERAL (
          SELECT count(*)::int AS n, coalesce(sum(amount), 0)::numeric AS total,
                 count(*) FILTER (WHERE account_id = p.from_account_id
                                    AND amount = -p.amount)::int AS debit,
                 count(*) FILTER (WHERE account_id = p.to_account_id
                                    AND amount = p.amount)::int AS credit,
                 coalesce(array_agg(id ORDER BY id), '{}') AS ids
            FROM wallet_entry WHERE transfer_id = p.id) e
), bad AS (
    SELECT 'wallet_transfer ' || id AS subject, ids,
           jsonb_build_object('kind', kind, 'amount', amount, 'entries', n,
                              'sumOfEntries', total) AS facts
      FROM legs WHERE n <> 2 OR total <> 0 OR debit <> 1 OR credit <> 1
)
SELECT s.after, s.seen, b.subject, b.ids, b.facts
  FROM (SELECT max(id) AS after, count(*)::int AS seen FROM page) s
  LEFT JOIN bad b ON true;

-- name: wallet_available
-- Accounts whose pending debits are not the sum of their PENDING transfers out
-- (or below zero), and customer accounts whose available money (balance less
-- pending debits) is below zero with no REVERSAL out of them: since 0059 only a
-- reversal may take a customer below zero. The accounts after id $1.
WITH page AS MATERIALIZED (
    SELECT id, kind, balance, pending_debits
      FROM wallet_account WHERE id > $1 ORDER BY id LIMIT $2
), held AS (
    SELECT p.*,
           (SELECT coalesce(sum(amount), 0)::numeric FROM wallet_pending_transfer t
             WHERE t.from_account_id = p.id AND t.status = 'PENDING') AS pending,
           (SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM wallet_pending_transfer t
             WHERE t.from_account_id = p.id AND t.status = 'PENDING') AS pending_ids
      FROM page p
), bad AS (
    SELECT 'wallet_account ' || id AS subject, ARRAY[id] || pending_ids AS ids,
           jsonb_build_object('kind', kind, 'balance', balance, 'pendingDebits', pending_debits,
                              'sumOfPending', pending,
                              'available', balance - pending_debits) AS facts
      FROM held h
     WHERE pending_debits <> pending OR pending_debits < 0
        OR (kind = 'CUSTOMER' AND balance - pending_debits < 0
            AND NOT EXISTS (SELECT 1 FROM wallet_entry e
                             WHERE e.account_id = h.id AND e.kind = 'REVERSAL' AND e.amount < 0))
)
SELECT s.after, s.seen, b.subject, b.ids, b.facts
  FROM (SELECT max(id) AS after, count(*)::int AS seen FROM page) s
  LEFT JOIN bad b ON true;

-- name: bet_payouts
-- Bets whose credits (PAYOUT and REFUND to the bet's account under "bet:<id>"
-- for generation 1, "bet:<id>:g<n>" after), less their REVERSALs (into a house
-- sub-account of the bet's currency, under the same reference), are not what
-- the bet's last result pays: its payout when WON or VOID, else nothing. A
-- credit still on its way (a payouts-requested event not delivered yet, or
-- parked) is not missing. Each lookup is one probe of
-- wallet_transfer_reference_once; the bets after id $1.
WITH page AS MATERIALIZED (
    SELECT id, account_id, currency, status, payout, generation
      FROM betting_bet WHERE id > $1 ORDER BY id LIMIT $2
), house AS MATERIALIZED (
    SELECT array_agg(id) AS ids FROM wallet_account WHERE kind = 'HOUSE' AND kind <> 'CUSTOMER'
), refs AS (
    SELECT p.id AS bet_id, p.account_id, g,
           CASE WHEN g = 1 THEN 'bet:' || p.id ELSE 'bet:' || p.id || ':g' || g END AS reference
      FROM page p CROSS JOIN LATERAL generate_series(1, p.generation) AS g
), moves AS (
    SELECT r.bet_id, r.g, r.reference, t.id, t.kind, t.amount
      FROM refs r
      LEFT JOIN LATERAL (
          SELECT id, kind, amount FROM wallet_transfer
           WHERE to_account_id = r.account_id AND kind IN ('PAYOUT', 'REFUND')
             AND reference = r.reference
          UNION ALL
          SELECT id, kind, amount FROM wallet_transfer
           WHERE to_account_id = ANY ((SELECT ids FROM house)::bigint[]) AND kind = 'REVERSAL'
             AND reference = r.reference AND from_account_id = r.account_id
      ) t ON true
), moved AS (
    SELECT bet_id,
           coalesce(sum(amount) FILTER (WHERE kind IN ('PAYOUT', 'REFUND')), 0) AS paid,
           coalesce(sum(amount) FILTER (WHERE kind = 'REVERSAL'), 0) AS reversed,
           count(*) FILTER (WHERE kind IN ('PAYOUT', 'REFUND')) AS credits,
           array_agg(id ORDER BY id) FILTER (WHERE id IS NOT NULL) AS ids,
           (array_agg(reference ORDER BY g DESC))[1] AS current_ref
      FROM moves
     GROUP BY bet_id
), judged AS (
    SELECT p.*, m.paid, m.reversed, m.credits, m.ids, m.current_ref,
           CASE WHEN p.status IN ('WON', 'VOID') THEN coalesce(p.payout, 0) ELSE 0 END AS owed
      FROM page p JOIN moved m ON m.bet_id = p.id
), bad AS (
    SELECT 'betting_bet ' || id AS subject, ARRAY[id] || coalesce(ids, '{}') AS ids,
           jsonb_build_object('status', status, 'generation', generation, 'owed', owed,
                              'paid', paid, 'reversed', reversed, 'credits', credits,
                              'accountId', account_id) AS facts
      FROM judged j
     WHERE paid - reversed <> owed
       AND NOT (paid - reversed < owed AND EXISTS (
               SELECT 1 FROM outbox o
                WHERE o.status <> 'DONE' AND o.topic = 'wallet.account.payouts-requested.v1'
                  AND strpos(o.payload::text, '"' || j.current_ref || '"') > 0
               UNION ALL
               SELECT 1 FROM dead_letter d
                WHERE d.replayed_at IS NULL AND d.topic = 'wallet.account.payouts-requested.v1'
                  AND position(convert_to('"' || j.current_ref || '"', 'UTF8') IN d.value) > 0))
)
SELECT s.after, s.seen, b.subject, b.ids, b.facts
  FROM (SELECT max(id) AS after, count(*)::int AS seen FROM page) s
  LEFT JOIN bad b ON true;

-- name: outbox_pending
-- PENDING events stuck without a reason: not leased, due since before $4 (now
-- $3 less the grace), never failed (no last_error), and not waiting behind an
-- earlier failed event of their key (outbox_claim keeps a key in order). The
-- PENDING events after id $1, through the partial index outbox_pending.
WITH page AS MATERIALIZED (
    SELECT id, key, created_at, available_at, locked_until, last_error, attempts
      FROM outbox WHERE status = 'PENDING' AND id > $1 ORDER BY id LIMIT $2
), bad AS (
    SELECT 'outbox ' || p.id AS subject, ARRAY[p.id] AS ids,
           jsonb_build_object('status', 'PENDING', 'createdAt', p.created_at,
                              'availableAt', p.available_at, 'attempts', p.attempts) AS facts
      FROM page p
     WHERE p.last_error IS NULL AND p.available_at < $4
       AND (p.locked_until IS NULL OR p.locked_until < $3)
       AND NOT EXISTS (SELECT 1 FROM outbox f
                        WHERE f.status = 'PENDING' AND f.last_error IS NOT NULL
                          AND f.key = p.key AND f.id < p.id)
)
SELECT s.after, s.seen, b.subject, b.ids, b.facts
  FROM (SELECT max(id) AS after, count(*)::int AS seen FROM page) s
  LEFT JOIN bad b ON true;

-- name: outbox_settled
-- Events out of PENDING without their mark: DEAD with no last_error (given up
-- on, no reason kept) or DONE with no published_at. The DEAD ones through
-- outbox_dead, the DONE ones through outbox_done_published (NULLs are in it);
-- by id after $1.
WITH page AS MATERIALIZED (
    (SELECT id, status, created_at FROM outbox
      WHERE status = 'DEAD' AND last_error IS NULL AND id > $1 ORDER BY id LIMIT $2)
    UNION ALL
    (SELECT id, status, created_at FROM outbox
      WHERE status = 'DONE' AND published_at IS NULL AND id > $1 ORDER BY id LIMIT $2)
    ORDER BY id LIMIT $2
)
SELECT s.after, s.seen, b.subject, b.ids, b.facts
  FROM (SELECT max(id) AS after, count(*)::int AS seen FROM page) s
  LEFT JOIN (SELECT 'outbox ' || id AS subject, ARRAY[id] AS ids,
                    jsonb_build_object('status', status, 'createdAt', created_at) AS facts
               FROM page) b ON true;

-- name: job_lease
-- RUNNING jobs with no live owner: no worker named, or no heartbeat since
-- before $3 (now less the reaper's timeout and period and the grace: a live
-- worker beats every few seconds, and the reaper gives back a job that
-- stopped); the RUNNING jobs after id $1, through scheduled_job_status_id.
WITH page AS MATERIALIZED (
    SELECT id, category, worker, heartbeat_at, started_at, attempts
      FROM scheduled_job WHERE status = 'RUNNING' AND id > $1 ORDER BY id LIMIT $2
), bad AS (
    SELECT 'scheduled_job ' || id AS subject, ARRAY[id] AS ids,
           jsonb_build_object('category', category, 'worker', worker,
                              'heartbeatAt', heartbeat_at, 'startedAt', started_at,
                              'attempts', attempts) AS facts
      FROM page WHERE worker IS NULL OR heartbeat_at IS NULL OR heartbeat_at < $3
)
SELECT s.after, s.seen, b.subject, b.ids, b.facts
  FROM (SELECT max(id) AS after, count(*)::int AS seen FROM page) s
  LEFT JOIN bad b ON true;

-- name: job_run_once
-- Jobs that ran to completion twice: more than one DONE execution, or a DONE
-- execution while the job is no longer DONE (nothing moves a job out of DONE);
-- the jobs after id $1 that have executions (a distinct walk of uq_job_attempt).
WITH page AS MATERIALIZED (
    SELECT DISTINCT job_id AS id FROM job_execution WHERE job_id > $1 ORDER BY job_id LIMIT $2
), runs AS (
    SELECT p.id, j.status,
           (SELECT count(*) FROM job_execution e
             WHERE e.job_id = p.id AND e.outcome = 'DONE')::int AS done,
           (SELECT array_agg(attempt ORDER BY attempt) FROM job_execution e
             WHERE e.job_id = p.id AND e.outcome = 'DONE') AS attempts
      FROM page p LEFT JOIN scheduled_job j ON j.id = p.id
), bad AS (
    SELECT 'scheduled_job ' || id AS subject, ARRAY[id] AS ids,
           jsonb_build_object('status', status, 'doneExecutions', done,
                              'doneAttempts', attempts) AS facts
      FROM runs WHERE done > 1 OR (done = 1 AND status IS NOT NULL AND status <> 'DONE')
)
SELECT s.after, s.seen, b.subject, b.ids, b.facts
  FROM (SELECT max(id) AS after, count(*)::int AS seen FROM page) s
  LEFT JOIN bad b ON true;

-- name: job_owner
-- Jobs out of RUNNING that still name a worker: every way out of RUNNING
-- clears it (complete, fail, defer, reap, retry), so a named worker on another
-- status means a transition skipped its rule; the jobs after id $1, by the
-- primary key.
WITH page AS MATERIALIZED (
    SELECT id, status, worker FROM scheduled_job WHERE id > $1 ORDER BY id LIMIT $2
)
SELECT s.after, s.seen, b.subject, b.ids, b.facts
  FROM (SELECT max(id) AS after, count(*)::int AS seen FROM page) s
  LEFT JOIN (SELECT 'scheduled_job ' || id AS subject, ARRAY[id] AS ids,
                    jsonb_build_object('status', status, 'worker', worker) AS facts
               FROM page WHERE status <> 'RUNNING' AND worker IS NOT NULL) b ON true;

-- name: idempotency_resource
-- Stored answers (DONE, 2xx) whose created resource (the answer's "id";
-- "bookingId" for a booking, "seriesId" for a series) is gone: an appointment, a series, a car, a booking, a transfer (posted or
-- pending), a bet. The keys after ($1[1], $1[2], $1[3]) in primary-key order.
-- Endpoints whose resources are deleted or pruned by design (jobs, recurring
-- jobs, waitlist entries) are not looked at.
WITH page AS MATERIALIZED (
    SELECT caller, endpoint, key, status, response_status, response_body
      FROM idempotency_key
     WHERE (caller, endpoint, key) > (($1::text[])[1], ($1::text[])[2], ($1::text[])[3])
     ORDER BY caller, endpoint, key LIMIT $2
), pointed AS (
    SELECT caller, endpoint, key,
           CASE WHEN endpoint = 'POST /api/appointments'
                  OR endpoint ~ '^POST /api/appointments/[0-9]+/reschedule$' THEN 'appointment'
                WHEN endpoint = 'POST /api/appointment-series' THEN 'appointment_series'
                WHEN endpoint = 'POST /api/cars' THEN 'car'
                WHEN endpoint = 'POST /api/bookings' THEN 'booking'
                WHEN endpoint = 'POST /api/transfers'
                  OR endpoint ~ '^POST /api/accounts/[0-9]+/deposits$' THEN 'wallet_transfer'
                WHEN endpoint = 'POST /api/bets' THEN 'betting_bet'
           END AS resource,
           CASE WHEN json_typeof(response_body) = 'object' THEN
                CASE endpoint WHEN 'POST /api/bookings' THEN response_body->>'bookingId'
                              WHEN 'POST /api/appointment-series' THEN response_body->>'seriesId'
                              ELSE response_body->>'id' END
           END AS answered
      FROM page
     WHERE status = 'DONE' AND response_status BETWEEN 200 AND 299
), ided AS (
    SELECT caller, endpoint, key, resource,
           CASE WHEN answered ~ '^[0-9]{1,18}$' THEN answered::bigint END AS resource_id
      FROM pointed
), bad AS (
    SELECT 'idempotency_key ' || caller || ' ' || endpoint || ' ' || key AS subject,
           ARRAY[resource_id] AS ids,
           jsonb_build_object('resource', resource, 'id', resource_id) AS facts
      FROM ided p
     WHERE resource IS NOT NULL AND resource_id IS NOT NULL AND NOT CASE resource
           WHEN 'appointment' THEN EXISTS (SELECT 1 FROM appointment WHERE id = p.resource_id)
           WHEN 'appointment_series'
               THEN EXISTS (SELECT 1 FROM appointment_series WHERE id = p.resource_id)
           WHEN 'car' THEN EXISTS (SELECT 1 FROM car WHERE id = p.resource_id)
           WHEN 'booking' THEN EXISTS (SELECT 1 FROM booking WHERE id = p.resource_id)
           WHEN 'wallet_transfer'
               THEN EXISTS (SELECT 1 FROM wallet_transfer WHERE id = p.resource_id)
                 OR EXISTS (SELECT 1 FROM wallet_pending_transfer WHERE id = p.resource_id)
           WHEN 'betting_bet' THEN EXISTS (SELECT 1 FROM betting_bet WHERE id = p.resource_id)
           END
)
SELECT (SELECT ARRAY[caller, endpoint, key] FROM page
         ORDER BY caller DESC, endpoint DESC, key DESC LIMIT 1) AS after,
       (SELECT count(*)::int FROM page) AS seen, b.subject, b.ids, b.facts
  FROM (SELECT 1) one LEFT JOIN bad b ON true;
