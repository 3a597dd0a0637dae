"""docs/OPERATIONS.md, "When a dependency fails": while PostgreSQL is unreachable,
requests that need it answer 503 `unavailable` with `Retry-After: 1`, never a 500,
and /readyz says 503; when it is back, the same processes serve again.

`reservo api --workers 2` and `reservo worker` reach the machine's PostgreSQL
through a TCP proxy the test cuts (the network lost, the shared server untouched)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.databases import create_database, drop_database
from tests.helpers.deployment import Deploy
from tests.helpers.procs import free_port
from tests.helpers.proxy import TcpProxy
from tests.helpers.waiting import wait_until


@pytest.fixture
async def proxied(services: tuple[str, str]) -> AsyncIterator[tuple[TcpProxy, str]]:
    """A fresh database and a proxy to its server: (the proxy, the database's URL
    through it)."""
    admin_url = services[0]
    database = await create_database(admin_url, "reservo_accept")
    parts = urlsplit(database)
    proxy = TcpProxy(free_port(), (parts.hostname or "127.0.0.1", parts.port or 5432))
    await proxy.start()
    user = parts.netloc.rpartition("@")[0]
    netloc = f"{user}@127.0.0.1:{proxy.port}" if user else f"127.0.0.1:{proxy.port}"
    try:
        yield proxy, urlunsplit(parts._replace(netloc=netloc))
    finally:
        if proxy.listening:
            await proxy.stop()
        await drop_database(admin_url, database)


async def test_requests_answer_503_with_retry_after_while_postgresql_is_unreachable(
    deploy: Deploy, proxied: tuple[TcpProxy, str]
) -> None:
    proxy, url = proxied
    split = await deploy("split", database_url=url)
    try:
        started = split.pids()
        customer = new_id()
        # Two requests that need the database: a read and a write.
        requests = [
            ("GET", f"/api/customers/{customer}/bookings", auth("customer", customer), None),
            ("POST", "/api/accounts", ADMIN, {"ownerId": new_id(), "currency": "EUR"}),
        ]
        async with httpx.AsyncClient(base_url=split.url, timeout=30) as http:

            async def readiness(status: int, postgres: str) -> bool:
                r = await http.get("/readyz")
                return r.status_code == status and r.json()["checks"]["postgres"] == postgres

            for method, path, headers, body in requests:
                r = await http.request(method, path, headers=headers, json=body)
                assert r.status_code in (200, 201), r.text

            await proxy.stop()
            for _ in range(3):
                for method, path, headers, body in requests:
                    t0 = time.monotonic()
                    r = await http.request(method, path, headers=headers, json=body)
                    assert r.status_code == 503, r.text
                    assert r.json()["code"] == "unavailable", r.text
                    assert r.headers["Retry-After"] == "1", r.headers
                    assert time.monotonic() - t0 < 10
            # Each process reuses its readiness answer for RESERVO_READY_CACHE_S (1 s).
            await wait_until(lambda: readiness(503, "down"), 10, "/readyz 503", step_s=0.2)

            await proxy.start()

            async def serves_again() -> bool:
                r = await http.request("GET", requests[0][1], headers=requests[0][2])
                return r.status_code == 200

            await wait_until(serves_again, 30, "the same processes serving again", step_s=0.5)
            await wait_until(lambda: readiness(200, "up"), 10, "/readyz 200 again", step_s=0.2)
        assert split.pids() == started, "the processes are not restarted"
    finally:
        # While the proxy still forwards: the processes stop cleanly.
        await asyncio.to_thread(split.stop)
