"""Dead letters: events a consumer rejected, kept with their error for an
operator to inspect and replay (the Kafka runner and the local transport both
park here)."""

from __future__ import annotations

import structlog

from reservo.core import metrics
from reservo.core.clock import Clock
from reservo.core.db import Database, Queries
from reservo.core.transport.base import Event
from reservo.core.transport.envelope import to_cloudevent

log = structlog.get_logger(__name__)
Q = Queries.load("reservo.core")


class LocalDeadLetters:
    """The ``park`` of the in-process transport."""

    def __init__(self, db: Database, clock: Clock, source: str = "/reservo") -> None:
        self.db, self.clock, self.source = db, clock, source

    async def __call__(self, consumer: str, event: Event, error: BaseException) -> None:
        value = to_cloudevent(event, self.source)
        async with self.db.connection() as conn:
            await conn.execute(
                Q.dead_letter_park_local,
                consumer,
                event.topic,
                event.id,
                event.key,
                value,
                repr(error)[:2000],
                self.clock.now(),
            )
        metrics.PARKED.labels(consumer=consumer, topic=event.topic).inc()
        log.error(
            "event_parked",
            consumer=consumer,
            topic=event.topic,
            event_id=str(event.id),
            error=repr(error),
        )
