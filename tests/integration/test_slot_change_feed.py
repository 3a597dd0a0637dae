"""The slot lists' change feed (appointments/change_feed.py): each API process
asks PostgreSQL once a second which doctors' lists changed, so a list may live
60 s in Redis while nothing changes it and still shows a change whose drops were
both lost within 5 s."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta

import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis

from reservo.app import create_app
from reservo.appointments.change_feed import LOOKBACK_S, SlotChangeFeed
from reservo.appointments.setup import Appointments
from reservo.appointments.slots import slots_key
from reservo.bootstrap import Container, build
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import make_doctor, make_slots
from tests.helpers.auth import ADMIN
from tests.integration.test_slot_list_staleness import (
    BOUND_S,
    book_losing_its_drop,
    unlisted_within_the_bound,
)

LIFE_S = 60  # RESERVO_APPOINTMENTS_SLOTS_CACHE_LIFE_S's default


@dataclass
class Process:
    """One API process of the test: its container (caches, feed) and its client."""

    container: Container
    client: httpx.AsyncClient

    @property
    def feed(self) -> SlotChangeFeed:
        feed = self.container.module(Appointments).service.feed
        assert feed is not None, "the change feed is on by default"
        return feed


@pytest.fixture
async def processes(base_settings: Settings) -> AsyncIterator[list[Process]]:
    """Two API processes on one PostgreSQL and Redis, each running its change
    feed as `reservo api` runs it (the app's lifespan runs it there)."""
    stop = asyncio.Event()
    built: list[Process] = []
    tasks: list[asyncio.Task[None]] = []
    clients: list[httpx.AsyncClient] = []
    try:
        for _ in range(2):
            container = build(base_settings, OffsetClock())
            app = create_app(container, owns_container=False)
            c = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
            clients.append(c)
            built.append(Process(container, c))
            tasks.append(asyncio.create_task(built[-1].feed.run(stop)))
            built[-1].feed.want()
        # Processes that have served a while: a list read before a feed's first
        # look-back ended is never vouched for (its first marks may miss a commit).
        await asyncio.sleep(LOOKBACK_S + 1.2)
        yield built
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in clients:
            await c.aclose()
        for p in built:
            await p.container.close()


async def _listed(client: httpx.AsyncClient, doctor: int, day: str) -> list[int]:
    r = await client.get(f"/api/doctors/{doctor}/slots", params={"date": day}, headers=ADMIN)
    assert r.status_code == 200, r.text
    return [s["id"] for s in r.json()]


async def _redis_life_s(settings: Settings, container: Container, doctor: int, day: str) -> float:
    """How long Redis still keeps the list (seconds): a list stored again by a
    read from PostgreSQL starts a new 60 s life."""
    r = aioredis.from_url(settings.redis_url)
    try:
        k = container.cache.value_key(slots_key(doctor, date.fromisoformat(day)))
        return float(await r.pttl(k)) / 1000
    finally:
        await r.aclose()


async def test_a_lost_drop_shows_within_5_s_and_an_unchanged_list_keeps_its_life(
    processes: list[Process], base_settings: Settings
) -> None:
    booking, other = processes
    doctor, slots = await make_slots(booking.client, capacity=1)
    quiet, _ = await make_slots(booking.client, capacity=1)
    day = slots[0]["startAt"][:10]
    target = slots[0]["id"]
    # Read after the feeds saw the new slots: a list read before a feed learnt
    # of its doctor's change (make_slots read both) is read again once it is
    # older than the bound (the feed cannot tell it showed the change).
    await asyncio.sleep(1.5)
    when = date.fromisoformat(day)
    assert await booking.container.cache.bump(slots_key(doctor, when), slots_key(quiet, when))
    for p in processes:
        assert target in await _listed(p.client, doctor, day)
        assert await _listed(p.client, quiet, day)
    # Older than the bound, and the feeds have polled since they were read.
    await asyncio.sleep(BOUND_S + 1)
    life = await _redis_life_s(base_settings, other.container, quiet, day)
    assert life < LIFE_S - BOUND_S, life
    # The unchanged list is served as it is: the feed vouches for it, so it
    # is not read again (its Redis life goes on shrinking).
    assert await _listed(other.client, quiet, day)
    assert await _redis_life_s(base_settings, other.container, quiet, day) <= life

    booked = await book_losing_its_drop(booking.client, booking.container.cache, target)
    # Both drops lost (no consumer runs): only the feed can tell.
    readers = {"booking process": booking.client, "other process": other.client}
    await unlisted_within_the_bound(readers, f"/api/doctors/{doctor}/slots", day, target, booked)
    # The changed list was read again, the quiet one still was not.
    assert await _redis_life_s(base_settings, other.container, doctor, day) > LIFE_S - BOUND_S
    assert await _redis_life_s(base_settings, other.container, quiet, day) < LIFE_S - BOUND_S


async def test_without_the_feed_an_old_list_is_read_again(
    processes: list[Process], base_settings: Settings
) -> None:
    """The same unchanged list, with the feed of the reading process stopped:
    nothing vouches for it past the bound, so it is read from PostgreSQL again."""
    p = processes[1]
    doctor, slots = await make_slots(p.client, capacity=1)
    day = slots[0]["startAt"][:10]
    assert await _listed(p.client, doctor, day)
    p.container.module(Appointments).service.feed = None
    await asyncio.sleep(BOUND_S + 0.5)
    assert await _listed(p.client, doctor, day)
    assert await _redis_life_s(base_settings, p.container, doctor, day) > LIFE_S - 1


async def test_a_change_that_commits_after_a_newer_one_was_polled_is_still_seen(
    client: httpx.AsyncClient, container: Container, database_url: str
) -> None:
    """Ids are taken before commit: a slot generated in a transaction that
    commits after a later slot's was already polled is found by the next
    poll's look-back, and its doctor's lists read before it lose the vouch
    (reading only after the newest marks, the feed would vouch for them)."""
    late, early, unchanged = [await make_doctor(client) for _ in range(3)]
    feed = SlotChangeFeed(container.db, container.clock, interval_s=1.0, keep_s=LIFE_S)
    await feed.poll()  # the first marks
    await asyncio.sleep(LOOKBACK_S + 0.2)  # lists read from now on may be vouched for
    await feed.poll()
    start = datetime.now().astimezone() + timedelta(days=30)
    insert = (
        "INSERT INTO time_slot (doctor_id, start_at, end_at, capacity, opens_at) "
        "VALUES ($1, $2, $3, 1, $2)"
    )
    slow = await asyncpg.connect(database_url)
    fast = await asyncpg.connect(database_url)
    try:
        tx = slow.transaction()
        await tx.start()
        await slow.execute(insert, late, start, start + timedelta(minutes=15))  # the lower id
        await fast.execute(insert, early, start, start + timedelta(minutes=15))  # committed
        await feed.poll()
        read_at = container.clock.now()  # a list of `late` read now misses its new slot
        assert not feed.vouches(early, read_at - timedelta(seconds=1), fresh_s=4.0)
        assert feed.vouches(late, read_at, fresh_s=4.0)  # nothing committed for it yet
        await tx.commit()
    finally:
        await slow.close()
        await fast.close()
    await feed.poll()
    assert not feed.vouches(late, read_at, fresh_s=4.0), "the late commit was missed"
    assert feed.vouches(unchanged, read_at, fresh_s=4.0)
    # A list read after the poll that saw the change shows it: vouched for.
    later = container.clock.now() + timedelta(seconds=0.3)
    assert feed.vouches(late, later, fresh_s=4.0)


async def test_a_feed_that_has_not_heard_from_postgresql_vouches_for_nothing(
    client: httpx.AsyncClient, container: Container
) -> None:
    doctor = await make_doctor(client)
    feed = SlotChangeFeed(container.db, container.clock, interval_s=1.0, keep_s=LIFE_S)
    now = container.clock.now()
    assert not feed.vouches(doctor, now, fresh_s=4.0)  # never polled
    await feed.poll()
    await asyncio.sleep(LOOKBACK_S + 0.2)
    await feed.poll()
    read_at = container.clock.now()
    assert feed.vouches(doctor, read_at, fresh_s=4.0)
    # No poll for longer than the bound (PostgreSQL away): nothing is vouched for.
    await asyncio.sleep(0.3)
    assert not feed.vouches(doctor, read_at, fresh_s=0.1)
