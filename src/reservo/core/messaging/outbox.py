"""Transactional outbox: ``emit`` writes an event in the caller's transaction;
``OutboxRelay`` claims batches (FOR UPDATE SKIP LOCKED + lease) and hands them to
the transport, marking rows done only after delivery succeeded."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import structlog

from reservo.core.aio.backoff import backoff_delay
from reservo.core.aio.loops import pause
from reservo.core.db.database import Database, Queries
from reservo.core.kernel import metrics, tracing
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.contract import EventRegistry
from reservo.core.kernel.errors import DomainError
from reservo.core.messaging.failures import is_transient
from reservo.core.messaging.transport.base import Event, Transport, TransportUnavailable

log = structlog.get_logger(__name__)
Q = Queries.load("reservo.core.messaging")
# Longest wait between tries while the transport reports an outage.
OUTAGE_BACKOFF_MAX_S = 5.0


async def emit(
    conn: asyncpg.Connection, topic: str, key: str | None, payload: dict[str, Any], now: datetime
) -> uuid.UUID:
    """Write an event in the current transaction; it leaves only if that commits.
    It carries the current trace and request id along (core/kernel/tracing.py)."""
    event_id = uuid.uuid4()
    await conn.execute(
        Q.outbox_insert,
        event_id,
        topic,
        key,
        payload,
        now,
        tracing.current_traceparent(),
        tracing.current_request_id(),
    )
    return event_id


class OutboxRelay:
    def __init__(
        self,
        db: Database,
        transport: Transport,
        clock: Clock,
        *,
        batch_size: int = 100,
        lease_s: int = 30,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 60.0,
        poll_interval_s: float = 0.2,
        pipelined: bool = False,
        events: EventRegistry | None = None,
    ) -> None:
        self.db, self.transport, self.clock = db, transport, clock
        # Rows written under an event's old name (pending at the upgrade, or
        # written by a process of the release before during a rolling one) go
        # out under its new name: no event is lost to a rename.
        self.events = events or EventRegistry()
        self.batch_size, self.lease_s = batch_size, lease_s
        self.backoff_base_s, self.backoff_max_s = backoff_base_s, backoff_max_s
        self.poll_interval_s, self.pipelined = poll_interval_s, pipelined
        self._outages = 0  # consecutive batches the transport was unavailable for
        self.settled_total = 0  # rows settled so far (progress, for benchmarks and tests)

    async def run_once(self) -> int:
        """Claim, deliver and settle one batch; returns how many events it claimed."""
        rows = await self._claim()
        if rows:
            await self._settle(rows, await self._deliver(rows))
        return len(rows)

    async def _claim(self) -> list[asyncpg.Record]:
        async with self.db.connection() as conn:
            rows = await conn.fetch(
                Q.outbox_claim, self.batch_size, self.clock.now(), float(self.lease_s)
            )
        # In the order they were written: an UPDATE's RETURNING follows its join's
        # plan, not the subquery's ORDER BY, and a key's events must go out in order.
        return sorted(rows, key=lambda r: r["id"])

    async def _deliver(self, rows: list[asyncpg.Record]) -> list[BaseException | None]:
        name = self.events.current
        events = [
            Event(
                r["event_id"],
                name(r["topic"]),
                r["key"],
                r["payload"],
                r["created_at"],
                r["traceparent"],
                r["request_id"],
            )
            for r in rows
        ]
        return await self.transport.deliver(events)

    async def _settle(
        self, rows: list[asyncpg.Record], results: list[BaseException | None]
    ) -> None:
        done = [r["id"] for r, err in zip(rows, results, strict=True) if err is None]
        # A transport outage is nobody's fault: those rows go back uncounted.
        down = [
            r["id"]
            for r, err in zip(rows, results, strict=True)
            if isinstance(err, TransportUnavailable)
        ]
        self._outages = self._outages + 1 if down else 0
        now = self.clock.now()
        async with self.db.transaction() as conn:
            if done:
                await conn.execute(Q.outbox_done, done, now)
            if down:
                await conn.execute(Q.outbox_release, down, now)
                log.warning("outbox_transport_unavailable", events=len(down))
            for row, err in zip(rows, results, strict=True):
                if err is None or isinstance(err, TransportUnavailable):
                    continue
                # Transient: again after a capped backoff, for as long as it takes.
                # Permanent (the transport refused the event itself): parked now.
                permanent = not is_transient(err)
                delay = backoff_delay(row["attempts"], self.backoff_base_s, self.backoff_max_s)
                await conn.execute(
                    Q.outbox_retry,
                    row["id"],
                    repr(err)[:2000],
                    now + timedelta(seconds=delay),
                    permanent,
                )
                metrics.OUTBOX_FAILURES.labels(topic=row["topic"]).inc()
                if permanent:
                    log.error(
                        "outbox_event_dead",
                        event_id=str(row["event_id"]),
                        topic=row["topic"],
                        attempts=row["attempts"],
                        error=repr(err),
                    )
        for row in rows:
            metrics.OUTBOX_LAG.observe(max(0.0, (now - row["created_at"]).total_seconds()))
        metrics.OUTBOX_PUBLISHED.inc(len(done))
        self.settled_total += len(rows)

    async def run(self, stop: asyncio.Event) -> None:
        """The relay loop. Pipelined (for a network transport such as Kafka):
        while batch N is being delivered, batch N+1 is claimed and batch N-1
        settled, so a batch costs the slowest of the three steps, not their sum.
        Deliveries stay one at a time and in claim order, which keeps per-key
        order; the leases keep a claimed batch from being taken by another relay
        while it waits its turn. Not pipelined (the local transport runs the
        handlers in this process, beside the worker's other roles): one step after
        the other; overlapping them there bought nothing measurable (docs/DESIGN.md)."""
        settling: asyncio.Task[None] | None = None
        prefetch: asyncio.Task[list[asyncpg.Record]] | None = None
        try:
            while not stop.is_set():
                try:
                    claiming, prefetch = prefetch, None
                    rows = await (claiming or self._claim())
                    if self.pipelined and len(rows) == self.batch_size:  # a backlog
                        prefetch = asyncio.create_task(self._claim())  # claim the next now
                    results = await self._deliver(rows) if rows else []
                    # Something of this batch goes out again later: the next batch
                    # (claimed meanwhile) must not overtake it, so it is handed back,
                    # and this one is settled before the next claim, which then
                    # keeps each failed row's key behind it (outbox_claim).
                    failed = any(err is not None for err in results)
                    if failed and prefetch is not None:
                        await self._hand_back(prefetch)
                        prefetch = None
                    if settling is not None:
                        await settling
                        settling = None
                    if rows and self.pipelined and not failed:
                        settling = asyncio.create_task(self._settle(rows, results))
                    elif rows:
                        await self._settle(rows, results)
                    claimed = len(rows)
                except DomainError as exc:  # database away: wait, then try again
                    log.warning("outbox_relay_unavailable", error=exc.detail)
                    settling, claimed = _unless_done(settling), 0
                except Exception:
                    log.exception("outbox_relay_error")
                    settling, claimed = _unless_done(settling), 0
                wait = self.poll_interval_s if claimed < self.batch_size else 0.0
                if self._outages:  # transport down: back off instead of hammering it
                    wait = backoff_delay(self._outages, self.poll_interval_s, OUTAGE_BACKOFF_MAX_S)
                if wait:
                    await pause(stop, wait)
        finally:
            if settling is not None:  # delivered rows: record it, or they go out twice
                with contextlib.suppress(Exception):
                    await settling
            if prefetch is not None:  # claimed, never sent: the lease would hold them back
                with contextlib.suppress(Exception):
                    await self._hand_back(prefetch)

    async def _hand_back(self, claimed: asyncio.Task[list[asyncpg.Record]]) -> None:
        """Release a claimed batch that was never sent, without spending an attempt."""
        rows = await claimed
        if rows:
            async with self.db.connection() as conn:
                await conn.execute(Q.outbox_release, [r["id"] for r in rows], self.clock.now())


def _unless_done(task: asyncio.Task[None] | None) -> asyncio.Task[None] | None:
    """Keep a settle still running (it is awaited next round); forget a finished
    one (its error is the one being handled)."""
    return task if task is not None and not task.done() else None
