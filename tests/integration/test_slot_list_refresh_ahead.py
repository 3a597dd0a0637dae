"""A popular slot list read by several API processes costs one PostgreSQL read
per life for the whole deployment: the one reader that takes its refresh lease
reads it again shortly before it expires, while every process keeps serving the
cached one (docs/DESIGN.md, "Slot lists: refreshed ahead under a lease")."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import datetime

import asyncpg
import httpx
import pytest

from reservo.app import create_app
from reservo.appointments import repo
from reservo.bootstrap import Container, build
from reservo.core.kernel.clock import OffsetClock
from reservo.core.redis.cache import Cache
from reservo.settings import Settings
from tests.helpers.appointments import make_slots
from tests.helpers.auth import ADMIN

pytestmark = pytest.mark.redis_cluster

PROCESSES = 4
LIFE_S = 2  # RESERVO_APPOINTMENTS_SLOTS_CACHE_LIFE_S, short to see several lives
AHEAD_S = 0.5
READING_S = 6.0
# A loaded database: each list read takes this long, so processes whose copies
# expire together all miss before any of them stored the list again.
READ_DELAY_S = 0.1


@pytest.fixture
async def processes(base_settings: Settings) -> AsyncIterator[list[httpx.AsyncClient]]:
    """API processes with their own per-process caches, same PostgreSQL and Redis."""
    own = base_settings.appointments.model_copy(
        update={"slots_cache_life_s": LIFE_S, "slots_refresh_ahead_s": AHEAD_S}
    )
    settings = base_settings.model_copy(update={"appointments": own})
    async with AsyncExitStack() as stack:
        clients = []
        for _ in range(PROCESSES):
            container = build(settings, OffsetClock())
            stack.push_async_callback(container.close)
            transport = httpx.ASGITransport(app=create_app(container))
            clients.append(
                await stack.enter_async_context(
                    httpx.AsyncClient(transport=transport, base_url="http://reservo.test")
                )
            )
        yield clients


async def test_a_hot_list_is_read_from_postgresql_once_per_life_across_processes(
    processes: list[httpx.AsyncClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    doctor, slots = await make_slots(processes[0], capacity=1)
    day = slots[0]["startAt"][:10]
    url = f"/api/doctors/{doctor}/slots"
    list_reads: list[float] = []
    real_read = repo.available_slots_json

    async def counted_read(
        conn: asyncpg.Connection, wanted: list[tuple[int, datetime, datetime]], now: datetime
    ) -> list[tuple[bytes, datetime | None, datetime | None]]:
        if any(doctor_id == doctor for doctor_id, _, _ in wanted):
            list_reads.append(asyncio.get_running_loop().time())
            await asyncio.sleep(READ_DELAY_S)
        return await real_read(conn, wanted, now)

    monkeypatch.setattr(repo, "available_slots_json", counted_read)
    start = asyncio.get_running_loop().time()
    barrier = asyncio.Barrier(PROCESSES)

    async def keep_reading(client: httpx.AsyncClient) -> int:
        await barrier.wait()
        served = 0
        while asyncio.get_running_loop().time() - start < READING_S:
            r = await client.get(url, params={"date": day}, headers=ADMIN)
            assert r.status_code == 200 and r.json(), r.text
            served += 1
            await asyncio.sleep(0.01)
        return served

    served = await asyncio.gather(*(keep_reading(c) for c in processes))
    assert all(served), served
    # One read per life at most (a fill if the list expired meanwhile, then
    # one refresh per LIFE_S - AHEAD_S), whatever the number of processes.
    bound = 1 + math.ceil(READING_S / (LIFE_S - AHEAD_S))
    assert len(list_reads) <= bound, (
        f"{len(list_reads)} PostgreSQL reads of the list in {READING_S} s "
        f"by {PROCESSES} processes, at most {bound} expected: "
        f"{[round(t - start, 2) for t in list_reads]}"
    )


async def test_one_reader_of_all_processes_takes_a_value_s_refresh_lease(
    container: Container,
) -> None:
    # Two processes' caches (own command batches), the same Redis.
    caches = [container.cache, Cache(container.cache.gate, container.cache.namespace)]
    k = "slots:{doctor:1}:2030-01-01"
    _, _, generation = await caches[0].get_versioned(k)
    assert generation is not None
    assert await caches[0].set_if_unchanged(k, b"[]", 5, generation)
    go = asyncio.Event()

    async def read(i: int) -> tuple[bytes | None, float, bytes | None, bool]:
        await go.wait()
        return await caches[i % 2].get_versioned_refreshing(k, 1.0)

    async def released_together() -> list[tuple[bytes | None, float, bytes | None, bool]]:
        tasks = [asyncio.create_task(read(i)) for i in range(40)]
        await asyncio.sleep(0)
        go.set()
        return await asyncio.gather(*tasks)

    # 5 s to live: no refresh yet, for anyone.
    answers = await released_together()
    assert all(raw == b"[]" and not refresh for raw, _, _, refresh in answers)
    # Inside the last second of its life: exactly one reader refreshes it, and
    # every reader is still served the value.
    await caches[0].gate.client.pexpire(caches[0].value_key(k), 800)
    go.clear()
    answers = await released_together()
    assert all(raw == b"[]" and 0 < life <= 0.8 for raw, life, _, _ in answers)
    assert sum(refresh for *_, refresh in answers) == 1
    # The refresh stored with the generation it was handed: a full life again,
    # and no further lease until its own last second.
    (leased,) = [gen for _, _, gen, refresh in answers if refresh]
    assert leased is not None and await caches[1].set_if_unchanged(k, b"[1]", 5, leased)
    raw, life, _, refresh = await caches[0].get_versioned_refreshing(k, 1.0)
    assert raw == b"[1]" and life > 4 and not refresh
