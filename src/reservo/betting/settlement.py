"""Settling a match's bets once its result is recorded.

Settlement is chunked: each chunk grades up to ``chunk`` pending legs of the match
(settling the single-leg bets in the same statement) and recomputes the other
bets set-based in one transaction, crediting the chunk's payouts in the wallet
and emitting its settled-bet notifications through the outbox in that same
transaction. A crash loses at most the chunk in flight, which rolls
back and is done again by whoever resumes (the consumer redelivery or the sweeper).

Results come in batches too (the fallback resender's claim, a Kafka fetch): the
batch is accepted in one transaction and its matches are settled together,
``chunk`` legs of many matches per transaction and one grading statement for
them all (settle_many). A match too big for that one chunk goes on through the
per-match chunks.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg
import structlog

from reservo import wallet
from reservo.betting import domain, events, repo, results
from reservo.betting.schemas import ResultIn
from reservo.core.db.database import Database
from reservo.core.kernel import metrics
from reservo.core.kernel.clock import Clock
from reservo.core.messaging.failures import Rejected, is_transient
from reservo.core.messaging.outbox import emit
from reservo.core.messaging.transport.base import Event

log = structlog.get_logger(__name__)

# Matches one sweep resumes: each settles in full before the next, and the next
# sweep (every few seconds) takes the rest.
SWEEP_BATCH = 10


class Settlement:
    """The settlement consumer (same handler for Kafka and the fallback path)."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        *,
        chunk: int = 5_000,
        parallel: int = 2,
        house_shards: int = 8,
        batch_matches: int = 500,
    ) -> None:
        self.db, self.clock = db, clock
        self.chunk, self.parallel, self.house_shards = chunk, parallel, house_shards
        self.batch_matches = batch_matches
        # Which house sub-account pays the next batch: batches in flight at once
        # (several consumers, the resender) pay from different rows.
        self._lanes = itertools.count()

    async def accept_in_tx(self, conn: asyncpg.Connection, payload: dict[str, Any]) -> int | None:
        """Take a result in the caller's transaction: applied to its match, kept
        until the match exists, or parked (betting.results); recorded once per
        providerEventId, and only then. Returns the match to settle (also for a
        redelivery whose match is still settling, so it resumes an interrupted
        settlement)."""
        return await self._accept(conn, ResultIn.model_validate(payload), self.clock.now())

    async def _accept(
        self, conn: asyncpg.Connection, result: ResultIn, now: datetime
    ) -> int | None:
        external_id = result.match_external_id
        await repo.lock_match_results(conn, external_id)
        match = await repo.match_by_external_id(conn, external_id)
        before = await repo.inbox_outcome(conn, result.provider_event_id)
        if before in results.DONE:
            if match is not None and match["settlement_status"] == "SETTLING":
                return int(match["id"])
            return None
        if match is None:
            await results.keep_until_created(conn, result, now)
            return None
        if before is None:
            try:  # the intake's rule again, for a result it could not check
                domain.check_result(result.status, match["starts_at"], now)
            except domain.BetRefused as exc:
                raise Rejected(exc.detail) from None
        return await results.place(conn, result, now, now, self.house_shards)

    async def accept_many_in_tx(
        self, conn: asyncpg.Connection, payloads: Sequence[dict[str, Any]]
    ) -> list[int]:
        """accept_in_tx for a batch of results, after taking every match's result
        lock in one order. Returns the matches to settle.

        The common case, a match's first result (its match exists, has no result
        yet and has started; the providerEventId is new), is recorded for the
        whole batch in one statement. Every other result goes through
        accept_in_tx's steps after it, in the batch's order: a match's later
        results of the batch then find its first one recorded, as one by one."""
        now = self.clock.now()
        results = [ResultIn.model_validate(p) for p in payloads]
        external_ids = [r.match_external_id for r in results]
        await repo.lock_many_match_results(conn, external_ids)
        seen = await repo.results_seen(conn, external_ids, [r.provider_event_id for r in results])
        firsts: list[ResultIn] = []
        others: list[ResultIn] = []
        matches: set[str] = set()
        events_seen: set[str] = set()
        for result, row in zip(results, seen, strict=True):
            first = result.match_external_id not in matches and (
                result.provider_event_id not in events_seen
            )
            matches.add(result.match_external_id)
            events_seen.add(result.provider_event_id)
            if first and _first_result(result, row, now):
                firsts.append(result)
            else:
                others.append(result)
        to_settle = await repo.record_results(
            conn,
            [
                (r.match_external_id, r.status, r.home_score, r.away_score, r.provider_event_id)
                for r in firsts
            ],
            now,
        )
        to_settle += [m for r in others if (m := await self._accept(conn, r, now)) is not None]
        return list(dict.fromkeys(to_settle))

    async def handle_batch(self, batch: Sequence[Event]) -> None:
        """Batch handler of the match results: a fetched batch accepted in one
        transaction, then its matches settled together. Should it fail, nothing
        of it committed and the events go one by one through ``handle``."""
        payloads = [e.payload for e in batch if e.topic == events.RESULT_TOPIC]
        if not payloads:
            return
        async with self.db.transaction() as conn:
            to_settle = await self.accept_many_in_tx(conn, payloads)
        await self.settle_many(to_settle)

    async def handle(self, event: Event) -> None:
        """Consumer-group handler of the match results (``RESULT_TOPIC``)."""
        if event.topic != events.RESULT_TOPIC:
            return
        async with self.db.transaction() as conn:
            match_id = await self.accept_in_tx(conn, event.payload)
        if match_id is not None:
            await self.settle(match_id)

    async def settle(self, match_id: int) -> None:
        """Run chunks until no pending leg of the match is left. Several loops
        (here and in other processes) may share one match: SKIP LOCKED."""
        loops = max(1, self.parallel)
        await asyncio.gather(*(self._loop(match_id, lane) for lane in range(loops)))

    async def _loop(self, match_id: int, lane: int) -> None:
        after = 0
        while True:
            last = await self.settle_chunk(match_id, after, lane)
            if last is not None:
                after = last
            elif after > 0:
                # One more pass from the start: legs skipped while another worker
                # held them (and then rolled back) are picked up here.
                after = 0
            else:
                break
        async with self.db.transaction() as conn:
            if await repo.finish_settlement(conn, match_id, self.clock.now()):
                log.info("match_settled", match_id=match_id)

    async def settle_many(self, match_ids: Sequence[int]) -> None:
        """Settle these matches, ``batch_matches`` at a time: one transaction
        grades up to ``chunk`` legs of the whole batch, a second one marks the
        finished matches SETTLED (in its own transaction, after the grading
        committed, so that of two workers grading one match the later one sees
        the other's legs). A match left with pending legs (more than fitted, or
        legs another worker held) goes on alone through ``settle``."""
        ids = list(dict.fromkeys(match_ids))
        for at in range(0, len(ids), self.batch_matches):
            part = ids[at : at + self.batch_matches]
            await self.settle_batch(part, next(self._lanes))
            async with self.db.transaction() as conn:
                finished = await repo.finish_settlements(conn, part, self.clock.now())
            if finished:
                log.info("matches_settled", matches=len(finished))
            for match_id in part:
                if match_id not in finished:
                    await self.settle(match_id)

    async def settle_batch(self, match_ids: list[int], lane: int = 0) -> int:
        """One transaction: grade up to ``chunk`` legs of these matches in one
        statement, settle their bets, credit the payouts, emit one settled-bet
        notification per match. Returns how many legs it graded."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            matches = await repo.results_settling(conn, sorted(match_ids))
            if not matches:
                return 0
            graded = await repo.grade_matches(conn, _grading(matches), self.chunk, now)
            if not graded.legs:
                return 0
            settled = graded.singles
            settled_matches = list(graded.single_matches)
            if graded.accumulators:
                await repo.lock_bets(conn, graded.accumulators)
                accumulators = await repo.settle_bets(conn, graded.accumulators, now)
                match_of = dict(zip(graded.accumulators, graded.accumulator_matches, strict=True))
                settled += accumulators
                settled_matches += [match_of[b] for b in accumulators.ids]
            await self._credit(conn, settled, lane, now)
            by_match: dict[int, list[tuple[int, int, int, str, int]]] = defaultdict(list)
            for match_id, row in zip(settled_matches, settled.rows(), strict=True):
                by_match[match_id].append(row)
            external = {m["id"]: m["external_id"] for m in matches}
            for match_id, rows in sorted(by_match.items()):
                await emit(
                    conn,
                    events.BETS_SETTLED,
                    events.match_key(external[match_id]),
                    events.settled_payload(match_id, external[match_id], rows),
                    now,
                )
            # Ascending match id, as finish_settlements and every other batch update
            # their rows: two batches sharing matches queue instead of deadlocking.
            await repo.add_progress_many(conn, dict(sorted(Counter(graded.legs).items())))
        metrics.BETS_SETTLED.inc(len(graded.legs))
        return len(graded.legs)

    async def settle_chunk(self, match_id: int, after: int = 0, lane: int = 0) -> int | None:
        """One transaction: grade up to ``chunk`` legs (of bets after ``after``),
        settle their bets, credit their payouts and emit their notifications.
        Returns the last bet id it graded, None when there was nothing left.
        ``lane``: the loop's number, which picks the house sub-account paying."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            result = await repo.match_result(conn, match_id)
            if result is None or result["result_status"] is None:
                return None
            void = result["result_status"] == "CANCELLED"
            picks = {} if void else domain.winning_picks(result["home_score"], result["away_score"])
            graded = await repo.grade_chunk(conn, match_id, self.chunk, void, picks, after, now)
            if not graded.count:
                return None
            settled = graded.singles
            if graded.accumulators:
                await repo.lock_bets(conn, graded.accumulators)
                settled += await repo.settle_bets(conn, graded.accumulators, now)
            await self._credit(conn, settled, lane, now)
            if settled.ids:
                external_id = result["external_id"]
                await emit(
                    conn,
                    events.BETS_SETTLED,
                    events.match_key(external_id),
                    events.settled_payload(match_id, external_id, settled.rows()),
                    now,
                )
            await repo.add_progress(conn, match_id, graded.count)
        metrics.BETS_SETTLED.inc(graded.count)
        return graded.last

    async def _credit(
        self, conn: asyncpg.Connection, settled: repo.Settled, lane: int, now: datetime
    ) -> None:
        """Credit the chunk's payouts and refunds in its own transaction, so a bet
        is paid when it is settled (the wallet skips a bet already paid). The
        loop's own house sub-account pays the chunk: two loops of one match then
        never wait for each other on a house row (the operator's position is the
        sum of the sub-accounts, so which one pays changes nothing else). Should
        one credit not land (an account full to its range), none of the chunk's
        is written here: they go to the wallet as payout events instead, whose
        consumer pays the others and parks that one (a dead letter to replay),
        rather than the match staying unsettled."""
        credits = [
            wallet.Payout(
                "REFUND" if status == "VOID" else "PAYOUT",
                wallet.bet_reference(bet_id, generation),
                account_id,
                payout,
            )
            for bet_id, account_id, status, payout, generation in zip(
                settled.ids,
                settled.accounts,
                settled.statuses,
                settled.payouts,
                settled.generations,
                strict=True,
            )
            if payout
        ]
        if not credits:
            return
        try:
            async with conn.transaction():
                await wallet.pay_many_in_tx(conn, credits, lane, self.house_shards, now)
            return
        except Exception as exc:
            if is_transient(exc):
                raise
            log.warning("settlement_credit_deferred", credits=len(credits), error=str(exc))
        # The credits by account bucket, one event each, keyed by it: an account's
        # payouts stay in order, and each bucket's house sub-account pays them
        # (never two events at once on one house row).
        for shard, items in wallet.by_bucket(credits, self.house_shards).items():
            await emit(
                conn,
                wallet.PAYOUT_REQUESTED,
                wallet.payouts_key(shard),
                wallet.payout_request(items, shard),
                now,
            )

    async def sweep(self) -> int:
        """Resume settlements a crashed worker left SETTLING."""
        async with self.db.connection() as conn:
            ids = await repo.settling_matches(conn, SWEEP_BATCH)
        for match_id in ids:
            await self.settle(match_id)
        return len(ids)


def _grading(matches: Sequence[asyncpg.Record]) -> repo.MatchGrading:
    """How each match grades its legs: void when cancelled, else each market's
    winning pick."""
    grading = repo.MatchGrading([], [], [], [], [])
    for m in matches:
        void = m["result_status"] == "CANCELLED"
        picks = {} if void else domain.winning_picks(m["home_score"], m["away_score"])
        grading.ids.append(int(m["id"]))
        grading.void.append(void)
        grading.picks_1x2.append(picks.get("1X2", ""))
        grading.picks_totals.append(picks.get("TOTALS_2_5", ""))
        grading.picks_btts.append(picks.get("BTTS", ""))
    return grading


def _first_result(result: ResultIn, seen: asyncpg.Record, now: datetime) -> bool:
    """Whether ``result`` simply applies: its match exists without a result and
    has started (or the result is a cancellation), and its providerEventId was
    never taken."""
    if result.correction:  # its sequence is recorded one by one (results.place)
        return False
    if seen["id"] is None or seen["result_status"] is not None or seen["outcome"] is not None:
        return False
    try:
        domain.check_result(result.status, seen["starts_at"], now)
    except domain.BetRefused:
        return False
    return True
