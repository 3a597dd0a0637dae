"""Betting use cases: matches, placing bets, receiving results, settling.

Settlement is chunked: each chunk grades up to ``chunk`` pending legs of the match
and recomputes their bets set-based in one transaction, emitting the chunk's
payouts (to the wallet) and settled-bet notifications through the outbox in
that same transaction. A crash loses at most the chunk in flight, which rolls
back and is done again by whoever resumes (the consumer redelivery or the sweeper).
"""

from __future__ import annotations

import asyncio
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import asyncpg
import orjson
import structlog
from pydantic import ValidationError

from reservo import wallet
from reservo.betting import domain, events, repo
from reservo.betting.schemas import ResultIn
from reservo.core import metrics
from reservo.core.auth import verify_webhook
from reservo.core.backoff import backoff_delay
from reservo.core.breaker import BreakerOpen, CircuitBreaker
from reservo.core.clock import Clock
from reservo.core.db import Database
from reservo.core.errors import DomainError, validation_error
from reservo.core.failures import Rejected, is_transient
from reservo.core.idempotency import Within
from reservo.core.outbox import emit
from reservo.core.retry import retry_async
from reservo.core.transport.base import Event, Transport

log = structlog.get_logger(__name__)

# Below every match's start (betting_match_starts_at_range): the first page's key.
_BEFORE_ANY_MATCH = datetime(1970, 1, 1, tzinfo=UTC)


# -- matches and bets ------------------------------------------------------------------


class BettingService:
    def __init__(
        self,
        db: Database,
        clock: Clock,
        house_shards: int = 8,
        max_payout: int = 1_000_000_000,
    ) -> None:
        self.db, self.clock, self.house_shards = db, clock, house_shards
        self.max_payout = max_payout

    def potential_payout(self, stake: int, legs: Sequence[domain.Leg]) -> int:
        """The bet's potential payout, or 422 at the stake when it exceeds
        ``max_payout``. Pure: callers run it before touching the database."""
        try:
            return domain.check_payout(stake, [leg.odds for leg in legs], self.max_payout)
        except domain.BetRefused as exc:
            at_stake = {"loc": ["body", "stake"], "msg": exc.detail, "type": "max_payout"}
            raise validation_error(exc.detail, [at_stake], code=exc.code) from None

    async def create_match(
        self,
        external_id: str,
        home: str,
        away: str,
        starts_at: datetime,
        odds: dict[str, dict[str, str]],
    ) -> dict[str, Any]:
        async with self.db.transaction() as conn:
            row = await repo.insert_match(
                conn, external_id, home, away, starts_at, odds, self.clock.now()
            )
        return {**repo.as_dict(row), "pending_bets": 0}

    async def get_match(self, match_id: int) -> dict[str, Any]:
        async with self.db.connection() as conn:
            row = await repo.get_match(conn, match_id)
        if row is None:
            raise DomainError("match_not_found", f"no match {match_id}")
        return repo.as_dict(row)

    async def update_match(
        self,
        match_id: int,
        odds: dict[str, dict[str, str]] | None,
        suspended: bool | None,
    ) -> dict[str, Any]:
        """New odds and/or suspension, while the match is open. The UPDATE waits
        for bets that share-locked the row (matches_for_bet) and bets after it
        see the new row: a bet commits either before the change or under it."""
        async with self.db.transaction() as conn:
            changed = await repo.update_match(conn, match_id, odds, suspended, self.clock.now())
            row = await repo.get_match(conn, match_id)
        if row is None:
            raise DomainError("match_not_found", f"no match {match_id}")
        if changed is None:
            raise DomainError(
                "match_closed", f"match {match_id} has started or has a result: no more changes"
            )
        return repo.as_dict(row)

    async def list_matches(
        self, status: str, after: tuple[datetime, int] | None, limit: int
    ) -> list[dict[str, Any]]:
        """One page of matches of a status, soonest first (keyset on startsAt, id)."""
        key = after or (_BEFORE_ANY_MATCH, 0)
        async with self.db.connection() as conn:
            if status == "UPCOMING":
                rows = await repo.matches_upcoming(conn, self.clock.now(), key, limit)
            elif status == "STARTED":
                rows = await repo.matches_started(conn, self.clock.now(), key, limit)
            else:
                rows = await repo.matches_settled(conn, key, limit)
        return [repo.as_dict(r) for r in rows]

    async def customer_owner(self, account_id: int) -> int | None:
        """The owner of a customer account; None when there is no such account
        (unknown, or a system account: it places no bets)."""
        async with self.db.connection() as conn:
            account = await wallet.get_account_in(conn, account_id)
        if account is None or account["kind"] != "CUSTOMER":
            return None
        return int(account["owner_id"])

    async def account_bets(
        self, account_id: int, before: int | None, limit: int, status: str | None
    ) -> list[dict[str, Any]]:
        """One page of an account's bets with their legs, newest first (keyset on id)."""
        async with self.db.connection() as conn:
            rows = await repo.account_bets(conn, account_id, before or 2**63 - 1, limit, status)
            bets = [repo.as_dict(r) for r in rows]
            legs: dict[int, list[dict[str, Any]]] = {b["id"]: [] for b in bets}
            for s in await repo.selections_of_bets(conn, list(legs)):
                legs[s["bet_id"]].append(repo.as_dict(s))
        for b in bets:
            b["selections"] = legs[b["id"]]
        return bets

    async def account_owner(self, account_id: int) -> int:
        async with self.db.connection() as conn:
            account = await wallet.get_account_in(conn, account_id)
        if account is None or account["kind"] != "CUSTOMER":
            raise DomainError("account_not_found", f"no account {account_id}")
        return int(account["owner_id"])

    async def place_bet(
        self,
        account_id: int,
        stake: int,
        legs: Sequence[domain.Leg],
        within: Within[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Insert the bet and debit its stake in one transaction: either both
        happen or neither (the wallet's conditional update refuses overdrafts)."""
        potential = self.potential_payout(stake, legs)
        now = self.clock.now()
        async with self.db.transaction() as conn:
            account = await wallet.get_account_in(conn, account_id)
            if account is None or account["kind"] != "CUSTOMER":
                raise DomainError("account_not_found", f"no account {account_id}")
            rows = await repo.matches_for_bet(conn, [leg.match_id for leg in legs])
            matches = {
                r["id"]: domain.MatchState(
                    r["id"],
                    r["starts_at"],
                    r["odds"],
                    r["result_status"] is not None,
                    r["suspended"],
                )
                for r in rows
            }
            for leg in legs:
                if leg.match_id not in matches:
                    raise DomainError("match_not_found", f"no match {leg.match_id}")
            try:
                domain.check_bet(legs, matches, now)
            except domain.BetRefused as exc:
                raise DomainError(exc.code, exc.detail) from None
            bet = repo.as_dict(
                await repo.insert_bet(
                    conn,
                    account_id,
                    account["owner_id"],
                    account["currency"],
                    stake,
                    potential,
                    now,
                    len(legs),
                )
            )
            await repo.insert_selections(
                conn,
                bet["id"],
                [leg.match_id for leg in legs],
                [leg.market for leg in legs],
                [leg.pick for leg in legs],
                [leg.odds for leg in legs],
            )
            house = await wallet.house_account_in(
                conn,
                account["currency"],
                wallet.house_shard(account_id, self.house_shards),
                self.house_shards,
                now,
            )
            await wallet.transfer_in(
                conn, account_id, house, stake, "STAKE", wallet.bet_reference(bet["id"]), now
            )
            bet["selections"] = [
                {
                    "match_id": leg.match_id,
                    "market": leg.market,
                    "pick": leg.pick,
                    "odds": leg.odds,
                    "status": "PENDING",
                }
                for leg in legs
            ]
            if within is not None:
                await within(conn, bet)
        metrics.BETS_PLACED.inc()
        return bet

    async def get_bet(self, bet_id: int) -> dict[str, Any]:
        async with self.db.connection() as conn:
            row = await repo.get_bet(conn, bet_id)
            if row is None:
                raise DomainError("bet_not_found", f"no bet {bet_id}")
            bet = repo.as_dict(row)
            bet["selections"] = [repo.as_dict(s) for s in await repo.bet_selections(conn, bet_id)]
        return bet


# -- settlement ------------------------------------------------------------------------


class Settlement:
    """The settlement consumer (same handler for Kafka and the fallback path)."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        *,
        chunk: int = 10_000,
        parallel: int = 2,
        house_shards: int = 8,
    ) -> None:
        self.db, self.clock = db, clock
        self.chunk, self.parallel, self.house_shards = chunk, parallel, house_shards

    async def accept_in(self, conn: asyncpg.Connection, payload: dict[str, Any]) -> int | None:
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
        """Consumer-group handler of ``matches.result.v1``."""
        if event.topic != events.RESULT_TOPIC:
            return
        async with self.db.transaction() as conn:
            match_id = await self.accept_in(conn, event.payload)
        if match_id is not None:
            await self.settle(match_id)

    async def settle(self, match_id: int) -> None:
        """Run chunks until no pending leg of the match is left. Several loops
        (here and in other processes) may share one match: SKIP LOCKED."""
        await asyncio.gather(*(self._loop(match_id) for _ in range(max(1, self.parallel))))

    async def _loop(self, match_id: int) -> None:
        after = 0
        while True:
            last = await self.settle_chunk(match_id, after)
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

    async def settle_chunk(self, match_id: int, after: int = 0) -> int | None:
        """One transaction: grade up to ``chunk`` legs (of bets after ``after``),
        settle their bets, emit the chunk's payouts and notifications. Returns the
        last bet id it graded, None when there was nothing left."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            result = await repo.match_result(conn, match_id)
            if result is None or result["result_status"] is None:
                return None
            void = result["result_status"] == "CANCELLED"
            picks = {} if void else domain.winning_picks(result["home_score"], result["away_score"])
            bet_ids = await repo.grade_chunk(conn, match_id, self.chunk, void, picks, after)
            if not bet_ids:
                return None
            await repo.lock_bets(conn, bet_ids)
            settled = await repo.settle_bets(conn, bet_ids, now)
            credits = [
                wallet.Payout(
                    "REFUND" if r["status"] == "VOID" else "PAYOUT",
                    wallet.bet_reference(r["id"]),
                    r["account_id"],
                    r["payout"],
                )
                for r in settled
                if r["payout"]
            ]
            # One key per house sub-account: chunks of a match are independent (each
            # bet is paid once whatever the order), so they are applied in parallel,
            # but never two at once on the same house row.
            shard = zlib.crc32(str(bet_ids[0]).encode()) % self.house_shards
            key = f"match:{match_id}:{shard}"
            if credits:
                await emit(
                    conn, wallet.PAYOUT_REQUESTED, key, wallet.payout_request(credits, shard), now
                )
            if settled:
                await emit(
                    conn, events.BETS_SETTLED, key, events.settled_payload(match_id, settled), now
                )
            await repo.add_progress(conn, match_id, len(bet_ids))
        metrics.BETS_SETTLED.inc(len(bet_ids))
        return bet_ids[-1]

    async def sweep(self) -> int:
        """Resume settlements a crashed worker left SETTLING."""
        async with self.db.connection() as conn:
            ids = await repo.settling_matches(conn, 10)
        for match_id in ids:
            await self.settle(match_id)
        return len(ids)


# -- the result webhook ----------------------------------------------------------------


class Publisher(Protocol):
    async def publish(self, event: Event) -> None: ...


@dataclass
class TransportPublisher:
    """Publishes one event through a transport (Kafka); raises unless acknowledged."""

    transport: Transport
    timeout_s: float = 2.0

    async def publish(self, event: Event) -> None:
        results = await asyncio.wait_for(self.transport.deliver([event]), self.timeout_s)
        if results[0] is not None:
            raise results[0]


class ResultIntake:
    """POST /api/webhooks/match-results. The provider never resends, so 202 is
    answered only once Kafka acknowledged the result or PostgreSQL stored it."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        secret: str,
        *,
        tolerance_s: int = 300,
        publisher: Publisher | None = None,
        breaker: CircuitBreaker | None = None,
        attempts: int = 3,
        backoff_s: float = 0.05,
    ) -> None:
        self.db, self.clock, self.secret, self.tolerance_s = db, clock, secret, tolerance_s
        self.publisher = publisher
        self.breaker = breaker or CircuitBreaker("results_kafka", failure_threshold=3)
        self.attempts, self.backoff_s = attempts, backoff_s

    async def receive(self, raw: bytes, signature: str | None) -> str:
        """Returns where the result is held: ``kafka`` or ``fallback``."""
        now = self.clock.now()
        verify_webhook(self.secret, signature, raw, now, self.tolerance_s)
        try:
            result = ResultIn.model_validate_json(raw)
        except ValidationError as exc:
            await self._reject(raw, exc, now)
            errors = orjson.loads(exc.json(include_url=False, include_input=False))
            raise validation_error("the result payload is not valid", errors) from None
        return await self._take(result, now)

    async def post_by_hand(self, result: ResultIn, admin: int) -> str:
        """A result an admin posted from the console for a match whose provider
        failed: the webhook's path after its signature check (same refusals, same
        event id from ``providerEventId``, so a second post settles nothing)."""
        log.warning(
            "match_result_posted_by_hand",
            admin=admin,
            provider_event_id=result.provider_event_id,
            match_external_id=result.match_external_id,
            status=result.status,
            home_score=result.home_score,
            away_score=result.away_score,
        )
        return await self._take(result, self.clock.now())

    async def _take(self, result: ResultIn, now: datetime) -> str:
        await self._check_started(result, now)
        payload = result.wire()
        event = Event(
            events.result_event_id(result.provider_event_id),
            events.RESULT_TOPIC,
            result.match_external_id,
            payload,
            now,
        )
        if self.publisher is not None:
            publisher = self.publisher
            try:
                await retry_async(
                    lambda: self.breaker.call(publisher.publish, event),
                    name="results_publish",
                    attempts=self.attempts,
                    base_s=self.backoff_s,
                    max_s=1.0,
                )
                metrics.RESULTS_RECEIVED.labels("kafka").inc()
                return "kafka"
            except BreakerOpen:
                log.warning("results_breaker_open", provider_event_id=result.provider_event_id)
            except Exception as exc:
                log.warning("results_publish_failed", error=repr(exc))
        try:
            async with self.db.transaction() as conn:
                await repo.fallback_insert(
                    conn, uuid.uuid4(), result.provider_event_id, payload, now
                )
            metrics.RESULTS_RECEIVED.labels("fallback").inc()
            return "fallback"
        except Exception as exc:
            # Neither Kafka nor PostgreSQL holds it: the provider must learn (503)
            # and the payload must at least reach the logs.
            log.error(
                "match_result_not_durable", payload=orjson.dumps(payload).decode(), error=repr(exc)
            )
            raise DomainError("unavailable", "the result could not be stored; retry") from exc

    async def _check_started(self, result: ResultIn, now: datetime) -> None:
        """Refuse (409, nothing stored) a final result for a match that has not
        started by this server's clock. Decided here, at intake, against the match
        row. An unknown match passes, as before: the consumer records it as
        UNKNOWN_MATCH. When PostgreSQL cannot answer, the result is not refused:
        the provider never resends, and Kafka may still hold it durably; the
        settlement consumer applies the same rule before it records anything."""
        try:
            async with self.db.connection() as conn:
                match = await repo.match_by_external_id(conn, result.match_external_id)
        except DomainError as exc:
            if exc.status != 503:
                raise
            log.warning("match_result_unchecked", provider_event_id=result.provider_event_id)
            return
        if match is None:
            return
        try:
            domain.check_result(result.status, match["starts_at"], now)
        except domain.BetRefused as exc:
            log.warning(
                "match_result_refused",
                code=exc.code,
                provider_event_id=result.provider_event_id,
                match_external_id=result.match_external_id,
            )
            raise DomainError(exc.code, exc.detail) from None

    async def _reject(self, raw: bytes, exc: Exception, now: datetime) -> None:
        try:
            async with self.db.connection() as conn:
                await repo.record_rejected(
                    conn, "match-results", raw.decode(errors="replace"), str(exc)[:4000], now
                )
        except Exception as err:  # recording is for investigation; the 422 stands
            log.error(
                "webhook_reject_not_recorded", body=raw.decode(errors="replace"), error=repr(err)
            )


class FallbackResender:
    """Republishes PENDING fallback rows and marks them RESENT. A transient failure
    (Kafka away, breaker open) leaves the row PENDING with a capped backoff, for as
    long as the outage lasts; only a result refused for good (core.failures) is
    FAILED, parked for an operator. No transaction stays open while it publishes (the outbox
    relay's pattern): a batch is leased (FOR UPDATE SKIP LOCKED and ``leased_until``
    in one committed statement), published with no connection held, then marked
    in one short transaction. Several instances share the backlog; the rows of one
    that died mid-publish come back when their lease ends, and a result published
    twice is settled once (the settlement inbox, keyed by providerEventId).
    Without Kafka it hands each result to the settlement handler, in the
    transaction that marks the row RESENT (a database-only step)."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        settlement: Settlement,
        *,
        publisher: Publisher | None = None,
        batch: int = 100,
        lease_s: float = 60.0,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 60.0,
    ) -> None:
        self.db, self.clock, self.settlement = db, clock, settlement
        self.publisher, self.batch, self.lease_s = publisher, batch, lease_s
        self.backoff_base_s, self.backoff_max_s = backoff_base_s, backoff_max_s

    async def run_once(self) -> int:
        """Lease, resend and mark one batch; returns how many rows it leased."""
        now = self.clock.now()
        async with self.db.connection() as conn:
            rows = await repo.fallback_claim(conn, self.batch, now, self.lease_s)
        if not rows:
            return 0
        if self.publisher is None:
            to_settle = [m for row in rows if (m := await self._accept(row)) is not None]
            for match_id in dict.fromkeys(to_settle):
                await self.settlement.settle(match_id)
        else:
            await self._publish(self.publisher, rows, now + timedelta(seconds=self.lease_s / 2))
        return len(rows)

    async def _publish(
        self, publisher: Publisher, rows: list[asyncpg.Record], until: datetime
    ) -> None:
        resent: list[uuid.UUID] = []
        failed: list[tuple[asyncpg.Record, BaseException]] = []
        unstarted: list[uuid.UUID] = []
        for row in rows:
            now = self.clock.now()
            if now >= until:
                # Past half the lease (slow or timing-out publishes): a row started now
                # could outlive it and be sent by another resender at the same time.
                unstarted.append(row["id"])
                continue
            payload = row["payload"]
            try:
                await publisher.publish(
                    Event(
                        events.result_event_id(payload["providerEventId"]),
                        events.RESULT_TOPIC,
                        payload["matchExternalId"],
                        payload,
                        now,
                    )
                )
            except Exception as exc:
                failed.append((row, exc))
            else:
                resent.append(row["id"])
        async with self.db.transaction() as conn:
            if resent:
                await repo.fallback_resent(conn, resent, self.clock.now())
            for failed_row, error in failed:
                await self._failed(conn, failed_row, error)
            if unstarted:
                await repo.fallback_release(conn, unstarted)

    async def _accept(self, row: asyncpg.Record) -> int | None:
        """Record the result and mark the row RESENT in one transaction; returns the
        match to settle (settled after the commit, chunk by chunk)."""
        try:
            async with self.db.transaction() as conn:
                match_id = await self.settlement.accept_in(conn, row["payload"])
                await repo.fallback_resent(conn, [row["id"]], self.clock.now())
            return match_id
        except Exception as exc:
            async with self.db.transaction() as conn:
                await self._failed(conn, row, exc)
            return None

    async def _failed(
        self, conn: asyncpg.Connection, row: asyncpg.Record, exc: BaseException
    ) -> None:
        permanent = not is_transient(exc)
        delay = backoff_delay(row["attempts"] + 1, self.backoff_base_s, self.backoff_max_s)
        retry_at = self.clock.now() + timedelta(seconds=delay)
        status = await repo.fallback_failed(conn, row["id"], repr(exc)[:2000], permanent, retry_at)
        if permanent:
            log.error("fallback_result_parked", id=str(row["id"]), error=repr(exc))
        else:
            metrics.TRANSIENT_FAILURES.labels(consumer="results_resend").inc()
            log.warning("fallback_resend_retrying", id=str(row["id"]), status=status)
