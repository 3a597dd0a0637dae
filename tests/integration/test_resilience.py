"""The service under failing dependencies, with real sockets (no mocks).

PostgreSQL down: requests answer 503 ``unavailable`` (never 500) and the same app
recovers on its own. Redis down: Redis is only a filter and a cache, so bookings
stay correct (the database decides) and readiness reports it as degraded, still
ready."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import date, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest
from prometheus_client import REGISTRY

from reservo.app import create_app
from reservo.appointments.gate import full_key
from reservo.appointments.setup import Appointments
from reservo.appointments.slots import slots_key
from reservo.bootstrap import Container, build
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import book, make_slots
from tests.helpers.auth import ADMIN, new_id
from tests.helpers.procs import free_port
from tests.helpers.proxy import TcpProxy
from tests.helpers.waiting import wait_until


def _with_port(url: str, host: str, port: int) -> str:
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


@contextlib.asynccontextmanager
async def app_client(container: Container) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(container, owns_container=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as c:
        yield c


def _unavailable(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["code"] == "unavailable"


# ------------------------------------------------------------- PostgreSQL down


@contextlib.asynccontextmanager
async def behind_proxy(
    base_settings: Settings, clock: OffsetClock, **extra: Any
) -> AsyncIterator[tuple[TcpProxy, Container]]:
    """A container whose PostgreSQL is reached through a proxy the test can cut."""
    pg = urlsplit(base_settings.database_url or "")
    proxy = TcpProxy(free_port(), (pg.hostname or "127.0.0.1", pg.port or 5432))
    await proxy.start()
    settings = base_settings.with_(
        **{
            "database_url": _with_port(base_settings.database_url or "", "127.0.0.1", proxy.port),
            "db_pool_min": 1,
            "db_pool_max": 5,
            "db_acquire_timeout_s": 2.0,
            "db_command_timeout_s": 2.0,
            "ready_cache_s": 0.0,
            **extra,
        }
    )
    container = build(settings, clock)
    try:
        yield proxy, container
    finally:
        await container.close()
        with contextlib.suppress(AssertionError):
            await proxy.stop()


@pytest.fixture
async def proxied(base_settings: Settings, clock: OffsetClock) -> AsyncIterator[Any]:
    async with behind_proxy(base_settings, clock) as both:
        yield both


async def test_postgres_outage_answers_503_and_recovers_by_itself(proxied: Any) -> None:
    proxy, container = proxied
    async with app_client(container) as client:
        doctor, slots = await make_slots(client)
        day = date.today() + timedelta(days=2)
        patient = new_id()
        idem = "resilience-" + str(new_id())

        async def list_slots() -> httpx.Response:
            # Skip the Redis slot cache: this request must reach the database.
            await container.cache.delete(slots_key(doctor, day))
            return await client.get(
                f"/api/doctors/{doctor}/slots",
                params={"date": day.isoformat()},
                headers=ADMIN,
            )

        assert (await list_slots()).status_code == 200
        warm = await book(client, slots[0]["id"], new_id())
        assert warm.status_code == 201, warm.text
        assert (await client.get("/readyz")).status_code == 200

        await proxy.stop()

        _unavailable(await list_slots())
        _unavailable(await book(client, slots[1]["id"], patient, idem))
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"] == {"postgres": "down", "redis": "up"}

        await proxy.start()

        # Same app, same container, same requests (even the same Idempotency-Key:
        # the failed attempt left nothing behind that blocks it).
        assert (await client.get("/readyz")).status_code == 200
        r = await list_slots()
        assert r.status_code == 200, r.text
        assert slots[1]["id"] in {s["id"] for s in r.json()}
        booked = await book(client, slots[1]["id"], patient, idem)
        assert booked.status_code == 201, booked.text
        assert booked.json()["patientId"] == patient


async def test_the_gates_refusals_of_a_full_slot_need_no_postgres(proxied: Any) -> None:
    """A storm on a full slot is refused by Redis alone, rate-limited attempts
    included: with PostgreSQL cut, a limited patient still gets 429 (with
    Retry-After) and another patient 409 slot_full, never 503. A limited attempt
    on a slot that is not full may be a replay Redis forgot, so that one still
    asks the database (503 while it is away)."""
    proxy, container = proxied
    async with app_client(container) as client:
        _, slots = await make_slots(client, capacity=1)
        full, free = slots[0]["id"], slots[1]["id"]
        assert (await book(client, full, new_id())).status_code == 201
        hammering = new_id()
        for _ in range(container.settings.appointments.booking_rate_limit):
            refused = await book(client, full, hammering)
            assert (refused.status_code, refused.json()["code"]) == (409, "slot_full")
        # The steady state: the gate's marks of the keys that reached the
        # database are whole (repaired once, from the first attempt on).
        marks = container.module(Appointments).service.key_marks
        await wait_until(marks.whole, what="the gate's marks whole")

        await proxy.stop()

        limited = await book(client, full, hammering)
        assert (limited.status_code, limited.json()["code"]) == (429, "rate_limited"), limited.text
        assert int(limited.headers["retry-after"]) >= 1
        other = await book(client, full, new_id())
        assert (other.status_code, other.json()["code"]) == (409, "slot_full"), other.text
        _unavailable(await book(client, free, hammering))

        await proxy.start()
        assert (await client.get("/readyz")).status_code == 200
        again = await book(client, free, hammering)
        assert (again.status_code, again.json()["code"]) == (429, "rate_limited"), again.text


async def test_a_lost_host_costs_one_waiting_request_at_a_time_not_all_of_them(
    base_settings: Settings, clock: OffsetClock
) -> None:
    """A host that accepts connections and never answers (a machine lost, its
    address not refusing): while it stays lost, after each hold one request at a
    time tries it (and waits out the acquire timeout) and every other one is
    answered 503 at once. Without the single trial, every request after every
    hold waited the timeout (a pile-up of waiting coroutines)."""
    async with (
        behind_proxy(
            base_settings,
            clock,
            db_acquire_timeout_s=1.5,
            db_command_timeout_s=1.5,
            db_unavailable_hold_s=0.2,
        ) as (proxy, container),
        app_client(container) as client,
    ):
        doctor, slots = await make_slots(client)

        async def write() -> tuple[httpx.Response, float]:
            t0 = asyncio.get_running_loop().time()
            r = await client.post(
                "/api/doctors", json={"name": "Dr. Lost", "timezone": "UTC"}, headers=ADMIN
            )
            return r, asyncio.get_running_loop().time() - t0

        assert (await write())[0].status_code == 201
        proxy.blackhole()
        _unavailable((await write())[0])  # its pooled connection was cut: a hold
        for _ in range(3):  # hold over, host still lost: a wave of 40 requests
            await asyncio.sleep(0.3)
            answers = await asyncio.gather(*(write() for _ in range(40)))
            for r, _ in answers:
                _unavailable(r)
                assert "Retry-After" in r.headers
            slow = [t for _, t in answers if t >= 1.0]
            assert len(slow) <= 1, sorted(t for _, t in answers)
            assert sorted(t for _, t in answers)[-2] < 0.5
        proxy.forward()
        await asyncio.sleep(0.3)
        back = None
        for _ in range(20):  # one trial finds it back, then everyone passes
            back, _ = await write()
            if back.status_code == 201:
                break
            await asyncio.sleep(0.2)
        assert back is not None and back.status_code == 201, back and back.text
        answers = await asyncio.gather(*(write() for _ in range(10)))
        assert [r.status_code for r, _ in answers] == [201] * 10
        assert slots  # the doctor's slots were made before the loss
        del doctor


# ------------------------------------------------------------------ Redis down


@pytest.fixture
async def no_redis(base_settings: Settings, clock: OffsetClock) -> AsyncIterator[Container]:
    # A port where nothing listens: every Redis call fails at once (refused).
    settings = base_settings.with_(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    container = build(settings, clock)
    yield container
    await container.close()


def _db_conflicts() -> float:
    value = REGISTRY.get_sample_value(
        "reservo_conflicts_total",
        {"module": "appointments", "code": "slot_full", "decided_by": "database"},
    )
    return value or 0.0


async def test_bookings_stay_correct_without_redis(
    no_redis: Container, db: asyncpg.Connection
) -> None:
    async with app_client(no_redis) as client:
        doctor, slots = await make_slots(client, capacity=1)
        slot = slots[0]["id"]
        first = await book(client, slot, new_id())
        assert first.status_code == 201, first.text

        refused_before = _db_conflicts()
        second = await book(client, slot, new_id())
        assert second.status_code == 409, second.text
        assert second.json()["code"] == "slot_full"
        # With Redis away there is no "full" mark: the database refused it.
        assert _db_conflicts() == refused_before + 1

        day = date.today() + timedelta(days=2)
        listed = await client.get(
            f"/api/doctors/{doctor}/slots",
            params={"date": day.isoformat()},
            headers=ADMIN,
        )
        assert listed.status_code == 200, listed.text
        ids = {s["id"] for s in listed.json()}
        assert slot not in ids  # full slots are not listed
        assert {s["id"] for s in slots[1:]} <= ids

        # Every request above was served: Redis away degrades, it does not unready.
        ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"] == {"postgres": "up", "redis": "degraded"}

    assert await db.fetchval("SELECT booked_count FROM time_slot WHERE id = $1", slot) == 1


async def test_no_overbooking_with_redis_down(no_redis: Container, db: asyncpg.Connection) -> None:
    async with app_client(no_redis) as client:
        _, slots = await make_slots(client, capacity=1)
        slot = slots[0]["id"]
        go = asyncio.Event()

        async def attempt(patient: int) -> httpx.Response:
            await go.wait()
            return await book(client, slot, patient)

        tasks = [asyncio.create_task(attempt(new_id())) for _ in range(30)]
        await asyncio.sleep(0.05)  # let all 30 reach the barrier
        go.set()
        results = await asyncio.gather(*tasks)

    statuses = sorted(r.status_code for r in results)
    assert statuses == [201] + [409] * 29, [r.text for r in results if r.status_code >= 500]
    assert {r.json()["code"] for r in results if r.status_code == 409} == {"slot_full"}
    assert (
        await db.fetchval(
            "SELECT count(*) FROM appointment WHERE slot_id = $1 AND status = 'BOOKED'", slot
        )
        == 1
    )
    assert await db.fetchval("SELECT booked_count FROM time_slot WHERE id = $1", slot) == 1


async def test_no_overbooking_after_redis_lost_its_marks(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection
) -> None:
    """Redis up but emptied (as after a flush or restart; only this slot's keys are
    removed, the shared Redis is never flushed): the database still refuses."""
    _, slots = await make_slots(client, capacity=1)
    slot = slots[0]["id"]
    assert (await book(client, slot, new_id())).status_code == 201
    assert await container.cache.is_marked(full_key(slot))
    await container.cache.clear_mark(full_key(slot))
    go = asyncio.Event()

    async def attempt(patient: int) -> httpx.Response:
        await go.wait()
        return await book(client, slot, patient)

    tasks = [asyncio.create_task(attempt(new_id())) for _ in range(30)]
    await asyncio.sleep(0.05)
    go.set()
    results = await asyncio.gather(*tasks)

    assert [r.status_code for r in results] == [409] * 30
    assert {r.json()["code"] for r in results} == {"slot_full"}
    assert (
        await db.fetchval(
            "SELECT count(*) FROM appointment WHERE slot_id = $1 AND status = 'BOOKED'", slot
        )
        == 1
    )
    assert await db.fetchval("SELECT booked_count FROM time_slot WHERE id = $1", slot) == 1
