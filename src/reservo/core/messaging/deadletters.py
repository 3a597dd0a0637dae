"""Dead letters: events a consumer rejected, kept with their error for an
operator to inspect and replay (the Kafka runner and the local transport both
park here)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from uuid import UUID

import asyncpg
import orjson
import structlog

from reservo.core.db.database import Database, Queries
from reservo.core.db.rows import FromRow
from reservo.core.kernel import metrics
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.contract import EventRegistry
from reservo.core.kernel.errors import DomainError
from reservo.core.messaging.failures import Rejected, is_transient
from reservo.core.messaging.transport.base import Event, Subscriptions
from reservo.core.messaging.transport.envelope import from_cloudevent, to_cloudevent

log = structlog.get_logger(__name__)
Q = Queries.load("reservo.core.messaging")


class LocalDeadLetters:
    """The ``park`` of the in-process transport."""

    def __init__(self, db: Database, clock: Clock, source: str = "/reservo") -> None:
        self.db, self.clock, self.source = db, clock, source

    async def __call__(self, consumer: str, event: Event, error: BaseException) -> None:
        async with self.db.connection() as conn:
            await park_in_tx(conn, consumer, event, error, self.clock.now(), self.source)


async def park_in_tx(
    conn: asyncpg.Connection,
    consumer: str,
    event: Event,
    error: BaseException,
    now: datetime,
    source: str = "/reservo",
) -> None:
    """Park ``event`` for ``consumer`` (once per consumer and event id) on
    ``conn``: in the caller's transaction, a handler that applied part of an
    event parks the part it could not apply atomically with the rest, as an
    event of its own that the replay endpoint delivers to it again."""
    await conn.execute(
        Q.dead_letter_park_local,
        consumer,
        event.topic,
        event.id,
        event.key,
        to_cloudevent(event, source),
        repr(error)[:2000],
        now,
    )
    metrics.PARKED.labels(consumer=consumer, topic=event.topic).inc()
    log.error(
        "event_parked",
        consumer=consumer,
        topic=event.topic,
        event_id=str(event.id),
        error=repr(error),
    )


async def park_once_in_tx(
    conn: asyncpg.Connection,
    consumer: str,
    event: Event,
    error: Rejected,
    now: datetime,
    source: str = "/reservo",
) -> None:
    """Park ``event`` for ``consumer`` in the caller's transaction, for a handler
    that refuses it without failing: the handler commits the rest of what it
    records (its inbox row) with the letter, and returns normally, so no
    transport parks the event a second time. A redelivery of an event already
    parked changes nothing. While its letter is being replayed (the operator
    asked, and the handler still refuses it) this raises ``error``: the replay
    fails with it and the letter stays parked, rather than being marked replayed
    with nothing applied."""
    replaying = await conn.fetchval(Q.dead_letter_local_replaying, consumer, event.id)
    if replaying is None:
        await park_in_tx(conn, consumer, event, error, now, source)
    elif replaying:
        raise error


@dataclass(frozen=True)
class DeadLetter(FromRow):
    id: int
    consumer: str
    topic: str
    event_id: UUID | None
    error: str
    attempts: int
    parked_at: datetime
    replayed_at: datetime | None


@dataclass(frozen=True)
class Inspected:
    """A dead letter with what it parked: the record's key and its envelope as
    text (indented JSON when it is JSON, else the bytes decoded leniently: a
    record a consumer rejected may well be malformed)."""

    letter: DeadLetter
    key: str | None
    envelope: str


def _readable(value: bytes) -> str:
    try:
        return orjson.dumps(orjson.loads(value), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        return value.decode("utf-8", errors="replace")


class DeadLetterBox:
    """Lists dead letters and replays one to the consumer that parked it, through
    the same handler (which dedupes by event id through its inbox: a replay is
    applied at most once, however often it is asked for)."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        subscriptions: Subscriptions,
        events: EventRegistry | None = None,
    ) -> None:
        self.db, self.clock, self.subscriptions = db, clock, subscriptions
        # A letter parked under an event's old name replays under its new one.
        self.events = events or EventRegistry()

    async def page(
        self, consumer: str | None, before_id: int | None, limit: int
    ) -> list[DeadLetter]:
        """Newest first; ``limit`` rows at most. Planned for the values given
        (queries.sql, custom_plans)."""
        async with self.db.transaction() as conn:
            await conn.execute(Q.custom_plans)
            rows = await conn.fetch(Q.dead_letter_page, consumer, before_id, limit)
        return [DeadLetter.from_row(r) for r in rows]

    async def inspect(self, letter_id: int) -> Inspected:
        async with self.db.connection() as conn:
            row = await conn.fetchrow(Q.dead_letter_get, letter_id)
        if row is None:
            raise DomainError("not_found", f"no dead letter {letter_id}")
        return Inspected(DeadLetter.from_row(row), row["key"], _readable(bytes(row["value"])))

    async def replay(self, letter_id: int) -> None:
        """Deliver the parked event to its consumer again. Already replayed: done
        (nothing is delivered twice). A replay that fails leaves it parked with the
        new error: 503 when a dependency is still away, 409 otherwise."""
        async with self.db.connection() as conn:
            row = await conn.fetchrow(Q.dead_letter_take_for_replay, letter_id, self.clock.now())
            if row is None:
                if await conn.fetchval(Q.dead_letter_exists, letter_id):
                    return
                raise DomainError("not_found", f"no dead letter {letter_id}")
        try:
            event = from_cloudevent(bytes(row["value"]))
            event = replace(event, topic=self.events.current(event.topic))
            subscription = self.subscriptions.for_consumer(row["consumer"]).get(event.topic)
            if subscription is None:
                raise Rejected(f"{row['consumer']} no longer consumes {row['topic']}")
            await subscription.handler(event)
        except Exception as exc:
            async with self.db.connection() as conn:
                await conn.execute(Q.dead_letter_replay_failed, letter_id, repr(exc)[:2000])
            log.warning("dead_letter_replay_failed", id=letter_id, error=repr(exc))
            if is_transient(exc):
                raise DomainError("unavailable", "a dependency is away; replay later") from exc
            raise DomainError(
                "not_replayable", f"the consumer refused the event again: {exc!r}"
            ) from exc
        log.info("dead_letter_replayed", id=letter_id, consumer=row["consumer"])
