"""``http`` jobs may only call destinations the policy allows (scheduler.egress,
RESERVO_JOBS_HTTP_ALLOW): checked at POST /api/jobs for what needs no DNS, and
again when the job runs, on every address the host resolves to. What the API
says about a failed call is the same whatever the destination did."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import httpx

from reservo.scheduler.egress import parse_allow
from reservo.scheduler.handlers import POLICY_ERROR, HttpHandler, call_failed
from reservo.scheduler.workers import run
from reservo.settings import Settings
from tests.helpers.auth import auth
from tests.helpers.procs import free_port
from tests.helpers.scheduler import HookServer, Stack, api_stack
from tests.helpers.waiting import wait_until

SERVICE = auth("service", 1)


def _job(url: str, **payload: Any) -> dict[str, Any]:
    return {"category": "http", "payload": {"url": url, **payload}}


async def _create(client: httpx.AsyncClient, url: str) -> int:
    r = await client.post("/api/jobs", json=_job(url), headers=SERVICE)
    assert r.status_code == 201, r.text
    return int(r.json()["jobId"])


async def _get(client: httpx.AsyncClient, job_id: int) -> dict[str, Any]:
    r = await client.get(f"/api/jobs/{job_id}", headers=SERVICE)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


@asynccontextmanager
async def _workers(stack: Stack) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(run(stack.container.scheduler, stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def _settled(stack: Stack, *ids: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        for job_id in ids:
            if (await _get(stack.client, job_id))["status"] not in ("DONE", "DEAD"):
                return False
        return True

    return check


async def test_inside_destinations_and_credentials_are_422_at_post(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    before = await db.fetchval("SELECT count(*) FROM scheduled_job")
    port = free_port()
    for url in (
        f"http://127.0.0.1:{port}/hook",
        f"http://[::1]:{port}/hook",
        f"http://[::ffff:127.0.0.1]:{port}/hook",
        f"http://2130706433:{port}/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/",
        "http://10.0.0.1/",
        "http://192.168.1.1/",
        "http://user:secret@example.com/hook",
        "https://token@example.com/hook",
    ):
        r = await client.post("/api/jobs", json=_job(url), headers=SERVICE)
        assert r.status_code == 422, (url, r.text)
        body = r.json()
        assert body["code"] == "destination_not_allowed", (url, body)
        assert "RESERVO_JOBS_HTTP_ALLOW" in body["detail"]
    assert await db.fetchval("SELECT count(*) FROM scheduled_job") == before


async def test_every_ipv6_form_carrying_an_inside_ipv4_is_422_at_post(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    before = await db.fetchval("SELECT count(*) FROM scheduled_job")
    for host in (
        "::ffff:0:127.0.0.1",  # IPv4-translated (RFC 2765)
        "::ffff:0:a9fe:a9fe",  # translated 169.254.169.254 (metadata)
        "::10.0.0.1",  # IPv4-compatible
        "64:ff9b::7f00:1",  # NAT64
        "64:ff9b:1::a9fe:a9fe",  # local-use NAT64
        "2002:a9fe:a9fe::1",  # 6to4
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
        "2a00:1450:4001:80b:0:5efe:127.0.0.1",  # ISATAP
        "2a00:1450:4001:80b:200:5efe:192.168.1.1",  # ISATAP, global id
    ):
        r = await client.post("/api/jobs", json=_job(f"http://[{host}]:8080/hook"), headers=SERVICE)
        assert r.status_code == 422, (host, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["code"] == "destination_not_allowed", (host, r.json())
    assert await db.fetchval("SELECT count(*) FROM scheduled_job") == before


async def test_a_name_resolving_to_loopback_is_refused_when_the_job_runs(
    own_database: str, base_settings: Settings
) -> None:
    async with (
        HookServer() as target,
        api_stack(base_settings, own_database) as stack,
    ):
        # A name is not resolved at POST: accepted there ...
        job = await _create(stack.client, f"http://localhost:{target.port}/hook")
        async with _workers(stack):
            await wait_until(_settled(stack, job), 20)
        # ... and refused when it runs: DEAD at once (no retries), nothing sent.
        got = await _get(stack.client, job)
        assert got["status"] == "DEAD" and got["attempts"] == 1, got
        assert got["lastError"] == POLICY_ERROR
        assert target.requests == []


async def test_an_allowed_destination_is_called(own_database: str, base_settings: Settings) -> None:
    async with (
        HookServer() as target,
        api_stack(base_settings, own_database, jobs_http_allow="127.0.0.1") as stack,
    ):
        job = await _create(stack.client, target.url)
        async with _workers(stack):
            await wait_until(_settled(stack, job), 20)
        got = await _get(stack.client, job)
        assert got["status"] == "DONE" and got["lastError"] is None, got
        assert len(target.requests) == 1
        assert target.requests[0]["idempotency-key"] == str(job)
        assert target.requests[0]["host"] == f"127.0.0.1:{target.port}"


async def test_closed_port_and_401_look_the_same_through_the_api(
    own_database: str, base_settings: Settings
) -> None:
    async with (
        HookServer(lambda n: 401) as target,
        api_stack(
            base_settings,
            own_database,
            jobs_http_allow="127.0.0.1",
            scheduler_max_attempts=2,
        ) as stack,
    ):
        closed = free_port()
        refused = await _create(stack.client, f"http://127.0.0.1:{closed}/hook")
        unauthorized = await _create(stack.client, target.url)
        async with _workers(stack):
            await wait_until(_settled(stack, refused, unauthorized), 30)
        a, b = await _get(stack.client, refused), await _get(stack.client, unauthorized)
        assert a["status"] == b["status"] == "DEAD"
        assert a["attempts"] == b["attempts"] == 2
        assert a["lastError"] == b["lastError"] == call_failed(2)
        for body in (a, b):
            # Its times are left out: a timestamp may hold "401" by chance.
            shown = str({k: v for k, v in body.items() if not k.endswith("At")})
            assert "401" not in shown and str(closed) not in shown
        # Operators keep the detail: the execution log (not rendered by the API).
        sched = stack.container.scheduler
        assert "401" in (await sched.executions(unauthorized))[0]["error"]
        assert "ConnectError" in (await sched.executions(refused))[0]["error"]
        assert len(target.requests) == 2


async def test_the_call_goes_to_the_checked_address_with_the_original_host() -> None:
    # DNS is asked once, and the request is sent to the address that was
    # checked (a second answer, e.g. a rebinding one, is never used); the Host
    # header and TLS name stay those of the URL.
    handler = HttpHandler(allow=parse_allow("localhost"))
    try:
        dest = await handler.destination("https://localhost:8443/hook?x=1")
        assert dest.url.host in ("127.0.0.1", "::1") and dest.url.port == 8443
        assert dest.url.path == "/hook" and dest.url.query == b"x=1"
        assert dest.host_header == "localhost:8443"
        assert dest.sni_hostname == "localhost"
        refusing = HttpHandler()
        try:
            await refusing.destination("http://localhost/")
        except Exception as exc:
            assert "loopback" in str(exc)
        else:
            raise AssertionError("localhost was not refused")
        finally:
            await refusing.aclose()
    finally:
        await handler.aclose()
