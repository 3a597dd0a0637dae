"""Consumer inbox: a handler's database effect and the record that it ran for
this event commit together, so redelivery (at least once) applies it once.

The record is keyed by (consumer, event id, event creation time): the table is
partitioned by the day of the event's creation (migration 0026), and that time
is the same on every delivery of an event (the outbox row's, carried by the
relay and by the Kafka envelope), so the key refuses exactly the redeliveries."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import asyncpg

from reservo.core.db.database import Database, Queries
from reservo.core.messaging.transport.base import Event

Q = Queries.load("reservo.core.messaging")
T = TypeVar("T")


# The inbox's default partition (migration 0026): rows of a day not created yet.
DEFAULT_PARTITION = "inbox_default"


async def _claimed(run: Callable[[], Awaitable[T]]) -> T:
    """Runs ``run`` (a transaction whose first statement is the inbox claim)
    again once if its claim raced the creation of the event's day: the insert
    routed its row to the default partition just before the partition keeper
    attached that day (history_partition_add), and PostgreSQL refuses the row
    there once the attach has committed. Nothing was written, and the next
    attempt routes the row to the new day."""
    try:
        return await run()
    except asyncpg.CheckViolationError as exc:
        if getattr(exc, "table_name", None) != DEFAULT_PARTITION:
            raise
        return await run()


async def once(
    db: Database,
    consumer: str,
    event: Event,
    apply: Callable[[asyncpg.Connection], Awaitable[None]],
) -> bool:
    """Run ``apply`` in a transaction unless this consumer already applied this
    event. Returns False for a duplicate."""

    async def attempt() -> bool:
        async with db.transaction() as conn:
            if await conn.fetchval(Q.inbox_claim, consumer, event.id, event.created_at) is None:
                return False
            await apply(conn)
            return True

    return await _claimed(attempt)


async def once_many(
    db: Database,
    consumer: str,
    events: Sequence[Event],
    apply: Callable[[asyncpg.Connection, list[Event]], Awaitable[None]],
) -> int:
    """The batch form of ``once``: one transaction records every event and runs
    ``apply`` on those not applied before (in their order, each id once).
    Returns how many were new."""

    async def attempt() -> int:
        async with db.transaction() as conn:
            rows = await conn.fetch(
                Q.inbox_claim_many,
                consumer,
                [e.id for e in events],
                [e.created_at for e in events],
            )
            new = {r[0] for r in rows}
            fresh: list[Event] = []
            for event in events:
                if event.id in new:
                    new.discard(event.id)
                    fresh.append(event)
            if fresh:
                await apply(conn, fresh)
            return len(fresh)

    return await _claimed(attempt)
