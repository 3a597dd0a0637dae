"""The slot list's layers: PostgreSQL writes the JSON (it must be the wire form the
Python shaping wrote), a per-process copy sits in front of Redis (never older
than the Redis TTL after its database read, dropped on a local change, one fill
per key at a time), and a full slot leaves every process's list within the
documented staleness.

Each test that reaches Redis runs on a single Redis and on a Redis Cluster."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from reservo.app import create_app
from reservo.appointments.setup import Appointments
from reservo.appointments.slots import slots_key
from reservo.bootstrap import Container, build
from reservo.core.kernel.clock import OffsetClock
from reservo.core.messaging.transport.base import Event
from reservo.core.redis.local_cache import LocalCache
from reservo.settings import Settings
from tests.helpers.appointments import book, make_doctor, make_slots
from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.http import key

pytestmark = pytest.mark.redis_cluster


def _wire(row: asyncpg.Record) -> dict[str, Any]:
    """The wire form the Python code wrote before PostgreSQL did (SlotOut)."""
    return {
        "id": row["id"],
        "doctorId": row["doctor_id"],
        "startAt": row["start_at"].isoformat(),
        "endAt": row["end_at"].isoformat(),
        "capacity": row["capacity"],
        "bookedCount": row["booked_count"],
        "available": row["capacity"] - row["booked_count"],
        "overbookedCount": row["overbooked_count"],
    }


async def test_postgres_writes_the_wire_form_byte_for_byte(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    doctor = await make_doctor(client, "Asia/Kathmandu")  # +05:45: no whole-hour offset
    day = datetime.now(UTC).date() + timedelta(days=5)
    base = datetime(day.year, day.month, day.day, 3, 0, tzinfo=UTC)
    starts = [
        base,
        base + timedelta(minutes=15, microseconds=120),
        base + timedelta(hours=1, seconds=7),
    ]
    for i, s in enumerate(starts):
        await db.execute(
            "INSERT INTO time_slot (doctor_id, start_at, end_at, capacity, booked_count, opens_at)"
            " VALUES ($1, $2, $3, $4, $5, now() - interval '1 day')",
            doctor,
            s,
            s + timedelta(minutes=10, microseconds=999_999 if i == 1 else 0),
            3,
            i,
        )
    r = await client.get(
        f"/api/doctors/{doctor}/slots", params={"date": day.isoformat()}, headers=ADMIN
    )
    assert r.status_code == 200
    rows = await db.fetch(
        "SELECT id, doctor_id, start_at, end_at, capacity, booked_count, overbooked_count"
        " FROM time_slot WHERE doctor_id = $1 ORDER BY start_at",
        doctor,
    )
    assert r.content == orjson.dumps([_wire(row) for row in rows])
    assert [s["startAt"] for s in r.json()][1].endswith(".000120+00:00")


@asynccontextmanager
async def _second_process(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """Another API process: its own container (own per-process caches), same
    PostgreSQL and Redis."""
    container = build(settings, OffsetClock())
    try:
        transport = httpx.ASGITransport(app=create_app(container))
        async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as c:
            yield c
    finally:
        await container.close()


async def test_a_full_slot_leaves_another_process_list_within_the_local_ttl(
    client: httpx.AsyncClient, base_settings: Settings
) -> None:
    settings = base_settings.with_(appointments_slots_local_ttl_s=0.5)
    doctor, slots = await make_slots(client, capacity=1)
    day = slots[0]["startAt"][:10]
    url, target = f"/api/doctors/{doctor}/slots", slots[0]["id"]
    async with _second_process(settings) as other:
        listed = await other.get(url, params={"date": day}, headers=ADMIN)
        assert target in [s["id"] for s in listed.json()]  # now in its own cache
        patient = new_id()
        r = await client.post(
            "/api/appointments",
            json={"slotId": target, "patientId": patient},
            headers={**auth("patient", patient), **key()},
        )
        assert r.status_code == 201
        # This process dropped its copy at once.
        mine = await client.get(url, params={"date": day}, headers=ADMIN)
        assert target not in [s["id"] for s in mine.json()]
        # The other one shows it at most until its copy expires (0.5 s here).
        started = asyncio.get_running_loop().time()
        while target in [
            s["id"] for s in (await other.get(url, params={"date": day}, headers=ADMIN)).json()
        ]:
            assert asyncio.get_running_loop().time() - started < 0.5 + 0.3
            await asyncio.sleep(0.05)


async def test_a_local_copy_never_outlives_the_redis_entry_it_came_from(
    client: httpx.AsyncClient, container: Container
) -> None:
    doctor, slots = await make_slots(client, capacity=1)
    day = slots[0]["startAt"][:10]
    # Redis holds the list for 0.3 s more: a copy taken now must go with it,
    # even though the per-process TTL (1 s) is longer.
    k = slots_key(doctor, datetime.fromisoformat(day).date())
    await container.cache.set_bytes(k, b"[]", 0.3)
    svc = container.module(Appointments).service
    # Stored for a life of 1 s, so the entry is young (0.7 s old), served as it is.
    svc.limits = dataclasses.replace(svc.limits, slots_cache_life_s=1)
    svc._slot_lists.invalidate(k)
    assert await svc.list_slots(doctor, datetime.fromisoformat(day).date()) == b"[]"
    await asyncio.sleep(0.4)
    fresh = await svc.list_slots(doctor, datetime.fromisoformat(day).date())
    assert [s["id"] for s in orjson.loads(fresh)] == [s["id"] for s in slots]


async def test_one_fill_per_key_at_a_time() -> None:
    cache: LocalCache[int] = LocalCache(10.0)
    calls = 0
    gate = asyncio.Event()

    async def fill() -> tuple[int, float]:
        nonlocal calls
        calls += 1
        await gate.wait()
        return 42, 10.0

    waiters = [asyncio.create_task(cache.get("k", fill)) for _ in range(20)]
    await asyncio.sleep(0.01)
    gate.set()
    assert await asyncio.gather(*waiters) == [42] * 20
    assert calls == 1
    assert await cache.get("k", fill) == 42 and calls == 1  # served from the entry


async def test_a_failed_fill_reaches_every_waiter_and_is_not_kept() -> None:
    cache: LocalCache[int] = LocalCache(10.0)
    gate = asyncio.Event()

    async def boom() -> tuple[int, float]:
        await gate.wait()
        raise RuntimeError("database away")

    waiters = [asyncio.create_task(cache.get("k", boom)) for _ in range(3)]
    await asyncio.sleep(0.01)
    gate.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    assert len(cache) == 0


async def test_an_invalidation_during_a_fill_keeps_nothing() -> None:
    cache: LocalCache[int] = LocalCache(10.0)
    gate = asyncio.Event()

    async def fill() -> tuple[int, float]:
        await gate.wait()
        return 1, 10.0

    task = asyncio.create_task(cache.get("k", fill))
    await asyncio.sleep(0.01)
    cache.invalidate("k")  # a change committed while the fill was reading
    gate.set()
    assert await task == 1
    assert cache.peek("k") is None


async def test_entries_expire_and_the_size_is_bounded() -> None:
    now = [0.0]
    cache: LocalCache[str] = LocalCache(1.0, max_entries=3, clock=lambda: now[0])

    def filler(v: str, life: float = 5.0) -> Any:
        async def fill() -> tuple[str, float]:
            return v, life

        return fill

    for k in "abcd":
        assert await cache.get(k, filler(k)) == k
    assert len(cache) == 3 and cache.peek("a") is None  # the oldest went
    now[0] = 0.99
    assert cache.peek("b") == "b"
    now[0] = 1.0  # min(ttl 1 s, life 5 s)
    assert cache.peek("b") is None
    await cache.get("short", filler("s", 0.2))
    now[0] = 1.21
    assert cache.peek("short") is None
    await cache.get("gone", filler("g", 0.0))  # no life left: returned, not kept
    assert cache.peek("gone") is None


@pytest.mark.parametrize("ttl", [0.0])
async def test_a_zero_ttl_keeps_nothing(ttl: float) -> None:
    cache: LocalCache[int] = LocalCache(ttl)
    calls = 0

    async def fill() -> tuple[int, float]:
        nonlocal calls
        calls += 1
        return calls, 10.0

    assert [await cache.get("k", fill) for _ in range(3)] == [1, 2, 3]


# -- lists kept until a change drops them -------------------------------------------


async def test_a_fill_that_raced_a_change_is_not_stored(container: Container) -> None:
    cache, k = container.cache, f"slots:{{doctor:{new_id()}}}:2030-01-01"
    raw, _, generation = await cache.get_versioned(k)
    assert raw is None and generation is not None  # a miss; the read begins
    assert await cache.bump(k)  # a booking commits meanwhile
    assert not await cache.set_if_unchanged(k, b"[]", 60, generation)
    assert (await cache.get_versioned(k))[0] is None  # the old answer was not kept
    # A fill that began after the change stores normally.
    _, _, generation = await cache.get_versioned(k)
    assert generation is not None and await cache.set_if_unchanged(k, b"[]", 60, generation)
    assert (await cache.get_versioned(k))[0] == b"[]"


async def test_a_list_lives_long_in_redis_and_a_booking_drops_it(
    client: httpx.AsyncClient, container: Container
) -> None:
    doctor, slots = await make_slots(client, capacity=1)
    day = datetime.fromisoformat(slots[0]["startAt"]).date()
    k = slots_key(doctor, day)
    url, params = f"/api/doctors/{doctor}/slots", {"date": day.isoformat()}
    assert (await client.get(url, params=params, headers=ADMIN)).status_code == 200
    raw, life_s, _ = await container.cache.get_versioned(k)
    life = container.settings.appointments.slots_cache_life_s
    assert raw is not None and life - 5 < life_s <= life  # kept for the long life
    assert (await book(client, slots[0]["id"], new_id())).status_code == 201
    assert (await container.cache.get_versioned(k))[0] is None  # dropped after the commit
    listed = await client.get(url, params=params, headers=ADMIN)
    assert slots[0]["id"] not in [s["id"] for s in listed.json()]


async def test_a_list_expires_when_the_next_slot_of_its_day_opens(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection
) -> None:
    doctor = await make_doctor(client, "UTC")
    day = datetime.now(UTC).date() + timedelta(days=5)
    base = datetime(day.year, day.month, day.day, 9, 0, tzinfo=UTC)
    for n, opens in enumerate(("now() - interval '1 day'", "now() + interval '4 seconds'")):
        await db.execute(
            "INSERT INTO time_slot (doctor_id, start_at, end_at, capacity, opens_at)"
            f" VALUES ($1, $2, $3, 1, {opens})",
            doctor,
            base + timedelta(hours=n),
            base + timedelta(hours=n, minutes=30),
        )
    url, params = f"/api/doctors/{doctor}/slots", {"date": day.isoformat()}
    assert len((await client.get(url, params=params, headers=ADMIN)).json()) == 1
    raw, life_s, _ = await container.cache.get_versioned(slots_key(doctor, day))
    assert raw is not None and 0 < life_s <= 4  # gone when the second slot opens
    await asyncio.sleep(life_s + 1.1)  # Redis and the 1 s per-process copy both expired
    assert len((await client.get(url, params=params, headers=ADMIN)).json()) == 2


async def test_the_outbox_consumer_drops_what_a_dead_request_left_cached(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection
) -> None:
    doctor, slots = await make_slots(client, capacity=2)
    day = datetime.fromisoformat(slots[0]["startAt"]).date()
    k = slots_key(doctor, day)
    r = await book(client, slots[0]["id"], new_id())
    assert r.status_code == 201
    # The process died between its commit and its drop: a stale list stays behind.
    await container.cache.set_bytes(k, b"[]", 60)
    row = await db.fetchrow(
        "SELECT event_id, topic, key, payload, created_at FROM outbox WHERE key = $1",
        f"appointment:{r.json()['id']}",
    )
    assert row is not None
    event = Event(
        row["event_id"], row["topic"], row["key"], orjson.loads(row["payload"]), row["created_at"]
    )
    await container.module(Appointments).service.slot_lists_changed(event)
    assert (await container.cache.get_versioned(k))[0] is None
