"""Consumer inbox: a handler's database effect and the record that it ran for
this event commit together, so redelivery (at least once) applies it once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from uuid import UUID

import asyncpg

from reservo.core.db import Database, Queries

Q = Queries.load("reservo.core")


async def once(
    db: Database,
    consumer: str,
    event_id: UUID,
    apply: Callable[[asyncpg.Connection], Awaitable[None]],
) -> bool:
    """Run ``apply`` in a transaction unless this consumer already applied this
    event. Returns False for a duplicate."""
    async with db.transaction() as conn:
        if await conn.fetchval(Q.inbox_claim, consumer, event_id) is None:
            return False
        await apply(conn)
        return True
