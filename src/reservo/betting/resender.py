"""The resender of the result fallback table (held while Kafka was away)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import asyncpg
import structlog

from reservo.betting import events, repo
from reservo.betting.publisher import Publisher
from reservo.betting.settlement import Settlement
from reservo.core.aio.backoff import backoff_delay
from reservo.core.db.database import Database
from reservo.core.kernel import metrics
from reservo.core.kernel.clock import Clock
from reservo.core.messaging.failures import is_transient
from reservo.core.messaging.transport.base import Event

log = structlog.get_logger(__name__)


class FallbackResender:
    """Republishes PENDING fallback rows and marks them RESENT. A transient failure
    (Kafka away, breaker open) leaves the row PENDING with a capped backoff, for as
    long as the outage lasts; only a result refused for good (core.messaging.failures) is
    FAILED, parked for an operator. No transaction stays open while it publishes (the outbox
    relay's pattern): a batch is leased (FOR UPDATE SKIP LOCKED and ``leased_until``
    in one committed statement), published with no connection held, then marked
    in one short transaction. Several instances share the backlog; the rows of one
    that died mid-publish come back when their lease ends, and a result published
    twice is settled once (the settlement inbox, keyed by providerEventId).
    Without Kafka it hands the batch's results to the settlement handler, in the
    transaction that marks the rows RESENT (a database-only step), and settles
    their matches together (Settlement.settle_many)."""

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
            await self.settlement.settle_many(await self._accept_batch(rows))
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
                # Stamped with the row's time, the intake's: the time the intake
                # gave the event when it tried Kafka first, so every delivery of
                # a result carries the same creation time (docs/SCALING.md,
                # "History tables").
                await publisher.publish(
                    Event(
                        events.result_event_id(payload["providerEventId"]),
                        events.RESULT_TOPIC,
                        events.match_key(payload["matchExternalId"]),
                        payload,
                        row["created_at"],
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

    async def _accept_batch(self, rows: list[asyncpg.Record]) -> list[int]:
        """Record the batch's results and mark its rows RESENT in one transaction;
        returns the matches to settle. Should one result fail, nothing of the batch
        committed, and the rows go one by one (``_accept``), which parks that one."""
        try:
            async with self.db.transaction() as conn:
                to_settle = await self.settlement.accept_many_in_tx(
                    conn, [row["payload"] for row in rows]
                )
                await repo.fallback_resent(conn, [row["id"] for row in rows], self.clock.now())
            return to_settle
        except Exception as exc:
            log.warning("fallback_batch_one_by_one", rows=len(rows), error=repr(exc))
        to_settle = [m for row in rows if (m := await self._accept(row)) is not None]
        return list(dict.fromkeys(to_settle))

    async def _accept(self, row: asyncpg.Record) -> int | None:
        """Record the result and mark the row RESENT in one transaction; returns the
        match to settle (settled after the commit, chunk by chunk)."""
        try:
            async with self.db.transaction() as conn:
                match_id = await self.settlement.accept_in_tx(conn, row["payload"])
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
