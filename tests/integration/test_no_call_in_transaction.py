"""No network call inside a database transaction: every Redis call of a booking
(a success that fills the slot, a refusal the database decides) happens while
none of the service's connections is inside a transaction."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from reservo.appointments.gate import full_key
from reservo.appointments.setup import Appointments
from reservo.bootstrap import Container
from tests.helpers.appointments import book, make_slots
from tests.helpers.auth import new_id


async def test_redis_marks_of_a_booking_are_written_outside_the_transaction(
    client: Any, container: Container, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, slots = await make_slots(client, capacity=1)
    slot = slots[0]["id"]
    watcher = await asyncpg.connect(database_url)
    seen: list[int] = []
    cache = container.module(Appointments).service.cache

    def watched(call: Callable[..., Any]) -> Callable[..., Any]:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            open_tx = await watcher.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'"
            )
            seen.append(open_tx)
            return await call(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(cache, "mark", watched(cache.mark))
    monkeypatch.setattr(cache, "delete", watched(cache.delete))
    try:
        assert (await book(client, slot, new_id())).status_code == 201  # fills the slot
        # Past the Redis filter (its mark dropped), the database refuses: slot_full,
        # then the mark again.
        await container.redis.delete(cache.mark_key(full_key(slot)))
        r = await book(client, slot, new_id())
        assert (r.status_code, r.json()["code"]) == (409, "slot_full")
    finally:
        await watcher.close()
    assert len(seen) >= 3  # full mark + list invalidation, then the refusal's full mark
    assert seen == [0] * len(seen)
