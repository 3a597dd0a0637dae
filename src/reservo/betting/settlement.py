"""Settling a match's bets once its result is recorded.

Settlement is chunked: each chunk grades up to ``chunk`` pending legs of the match
(settling the single-leg bets in the same statement) and recomputes the other
bets set-based in one transaction, crediting the chunk's payouts in the wallet
and emitting its settled-bet notifications through the outbox in that same
transaction. A crash loses at most the chunk in flight, which rolls
back and is done again by whoever resumes (the consumer redelivery or the sweeper).
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import asyncpg
import structlog

from reservo import wallet
from reservo.betting import domain, events, repo
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
    ) -> None:
        self.db, self.clock = db, clock
        self.chunk, self.parallel, self.house_shards = chunk, parallel, house_shards

    async def accept_in_tx(self, conn: asyncpg.Connection, payload: dict[str, Any]) -> int | None:
        """Record a result in the caller's transaction, once per providerEventId.
        Returns the match to settle (also for a duplicate whose match is still
        settling, so a redelivery resumes an interrupted settlement)."""
        result = ResultIn.model_validate(payload)
        now = self.clock.now()
        started = await repo.match_by_external_id(conn, result.match_external_id)
        if started is not None:
            try:  # the intake's rule again, for a result it could not check
                domain.check_result(result.status, started["starts_at"], now)
            except domain.BetRefused as exc:
                raise Rejected(exc.detail) from None
        if await repo.claim_result(conn, result.provider_event_id, result.match_external_id, now):
            match_id = await repo.record_result(
                conn,
                result.match_external_id,
                result.status,
                result.home_score,
                result.away_score,
                result.provider_event_id,
                now,
            )
            if match_id is not None:
                return int(match_id)
            match = await repo.match_by_external_id(conn, result.match_external_id)
            outcome = "UNKNOWN_MATCH" if match is None else "DUPLICATE_MATCH"
            await repo.set_inbox_outcome(conn, result.provider_event_id, outcome)
            log.warning(
                "match_result_ignored",
                outcome=outcome,
                provider_event_id=result.provider_event_id,
                match_external_id=result.match_external_id,
            )
            if match is None:
                return None
        match = await repo.match_by_external_id(conn, result.match_external_id)
        if match is not None and match["settlement_status"] == "SETTLING":
            return int(match["id"])
        return None

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
                wallet.bet_reference(bet_id),
                account_id,
                payout,
            )
            for bet_id, account_id, status, payout in zip(
                settled.ids, settled.accounts, settled.statuses, settled.payouts, strict=True
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
