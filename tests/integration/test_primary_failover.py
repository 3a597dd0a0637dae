"""The PostgreSQL primary lost, a standby promoted: reservo answers 503
``unavailable`` (with Retry-After, never a 500) while no primary is writable, and
resumes on the promoted standby without a restart of its own, through a multi-host
URL with ``target_session_attrs=read-write``. The servers are real
(``tests/helpers/replication.py``: a primary and a hot standby streaming from it); the
promotion is what the HA manager does (tests/chaos/test_failover.py runs the whole
thing under pg_auto_failover)."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import date, timedelta
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from reservo.app import create_app
from reservo.bootstrap import Container, build
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import book, make_doctor
from tests.helpers.auth import ADMIN, new_id
from tests.helpers.replication import HotStandbyPair, missing_binaries, started_pair

pytestmark = pytest.mark.timeout(120)

WHY_NOT = missing_binaries()


@pytest.fixture
async def pair() -> AsyncIterator[HotStandbyPair]:
    """A pair of its own per test: the tests kill and promote."""
    async with started_pair("reservo-failover-") as p:
        yield p


def multi_host(pair: HotStandbyPair) -> str:
    """Both servers in one URL: whichever takes writes is the one connected to."""
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in (pair.primary, pair.standby))
    return f"postgresql://postgres@{hosts}/reservo?target_session_attrs=read-write"


@asynccontextmanager
async def service(base: Settings, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    settings = base.with_(**{"redis_namespace": f"test-{uuid.uuid4().hex[:8]}", **overrides})
    container: Container = build(settings, OffsetClock())
    app = create_app(container, owns_container=False)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://reservo.test", timeout=30
        ) as client:
            yield client
    finally:
        await container.close()


def went_away() -> float:
    return REGISTRY.get_sample_value("reservo_db_unavailable_total") or 0.0


def assert_unavailable(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["code"] == "unavailable"
    assert int(r.headers["Retry-After"]) >= 1


async def first_slot(client: httpx.AsyncClient) -> int:
    doctor = await make_doctor(client)
    on = (date.today() + timedelta(days=2)).isoformat()
    r = await client.post(
        f"/api/doctors/{doctor}/schedules",
        headers=ADMIN,
        json={
            "from": on,
            "to": on,
            "weekdays": list(range(1, 8)),
            "startTime": "08:00",
            "endTime": "09:00",
            "slotMinutes": 30,
            "capacity": 5,
        },
    )
    assert r.status_code == 201, r.text
    r = await client.get(f"/api/doctors/{doctor}/slots", params={"date": on}, headers=ADMIN)
    assert r.status_code == 200, r.text
    return int(r.json()[0]["id"])


async def new_doctor(client: httpx.AsyncClient) -> httpx.Response:
    return await client.post(
        "/api/doctors", json={"name": "Dr. Away", "timezone": "UTC"}, headers=ADMIN
    )


async def test_a_read_only_server_answers_503_not_500(
    pair: HotStandbyPair, base_settings: Settings
) -> None:
    # A server that takes connections but no writes: a primary demoted by a
    # failover, which the pool's connections still point at.
    async with service(base_settings, database_url=pair.standby_url) as client:
        before = went_away()
        assert_unavailable(await new_doctor(client))
        assert went_away() == before + 1


async def test_primary_killed_standby_promoted_writes_resume_without_restart(
    pair: HotStandbyPair, base_settings: Settings
) -> None:
    async with service(
        base_settings, database_url=multi_host(pair), db_unavailable_hold_s=0.5
    ) as client:
        slot = await first_slot(client)
        r = await book(client, slot, new_id())
        assert r.status_code == 201, r.text
        await asyncio.to_thread(pair.kill_primary)
        patient, key = new_id(), str(uuid.uuid4())
        # No primary at all: 503 unavailable, never a 500.
        assert_unavailable(await book(client, slot, patient, key))
        await pair.promote_standby()
        # The same process, the same request retried with its key, until it lands.
        deadline = time.monotonic() + 20
        while (r := await book(client, slot, patient, key)).status_code == 503:
            assert_unavailable(r)
            assert time.monotonic() < deadline, "writes did not resume on the new primary"
            await asyncio.sleep(0.2)
        assert r.status_code == 201, r.text
        again = await book(client, slot, patient, key)
        assert again.is_success and again.json()["id"] == r.json()["id"]  # one booking
        r = await client.get(f"/api/appointments/{r.json()['id']}", headers=ADMIN)
        assert r.status_code == 200, r.text


class Unanswering:
    """A PostgreSQL that takes TCP connections and never answers, like a primary
    whose machine hangs: every connection attempt is counted."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []

    def accept_all(self) -> int:
        """Accept what is queued; returns how many connections arrived so far."""
        self.sock.setblocking(False)
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return len(self.held)
            self.held.append(conn)

    def close(self) -> None:
        for s in self.held:
            s.close()
        self.sock.close()


async def test_requests_do_not_pile_up_while_the_database_hangs(base_settings: Settings) -> None:
    hung = Unanswering()
    try:
        async with service(
            base_settings,
            database_url=f"postgresql://postgres@127.0.0.1:{hung.port}/reservo",
            db_acquire_timeout_s=1.0,
            db_unavailable_hold_s=5.0,
        ) as client:
            assert_unavailable(await new_doctor(client))
            tried = hung.accept_all()
            assert tried >= 1
            # While it is away, 40 concurrent requests are answered 503 at once:
            # none waits on a connection (none even tries one).
            answers = await asyncio.gather(*(new_doctor(client) for _ in range(40)))
            for r in answers:
                assert_unavailable(r)
            assert hung.accept_all() == tried
    finally:
        hung.close()
