"""Every outbound call is bounded: an ``http`` job reads at most a prefix of the
answer and ends at its deadline, however the destination behaves, and a slow
destination never keeps the jobs of the others waiting (core/http/outbound.py,
scheduler/handlers.py, the executor). SMS, SMTP and refunds get the same
deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from reservo.core.http import outbound
from reservo.core.messaging.notify import Notification
from reservo.notifications.channels import HttpChannel, NotificationError, SmtpChannel
from reservo.rentals.gateway import HttpGateway, TransientGatewayError
from reservo.scheduler.handlers import call_failed
from reservo.scheduler.workers import run
from reservo.settings import Settings
from tests.helpers.auth import auth
from tests.helpers.scheduler import HookServer, Stack, api_stack
from tests.helpers.slow_servers import SlowServer
from tests.helpers.waiting import wait_until

SERVICE = auth("service", 1)
LOOPBACK = {"jobs_http_allow": "127.0.0.1"}
HUGE = 64 * 1024 * 1024


async def _create(client: httpx.AsyncClient, url: str, urgency: int = 5) -> int:
    job = {"category": "http", "urgency": urgency, "payload": {"url": url}}
    r = await client.post("/api/jobs", json=job, headers=SERVICE)
    assert r.status_code == 201, r.text
    return int(r.json()["jobId"])


async def _get(client: httpx.AsyncClient, job_id: int) -> dict[str, Any]:
    r = await client.get(f"/api/jobs/{job_id}", headers=SERVICE)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def _status(stack: Stack, job_id: int) -> str:
    return str((await _get(stack.client, job_id))["status"])


@asynccontextmanager
async def _workers(stack: Stack) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(run(stack.container.scheduler, stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def test_a_huge_answer_is_read_up_to_the_limit_and_dropped(
    own_database: str, base_settings: Settings
) -> None:
    with SlowServer("huge", size=HUGE) as target:
        async with api_stack(base_settings, own_database, **LOOPBACK) as stack:
            job = await _create(stack.client, target.url)
            async with _workers(stack):
                await wait_until(lambda: _settled(stack, job), 20)
            got = await _get(stack.client, job)
        assert got["status"] == "DONE", got
        # 64 KiB read, then the connection closed: what the kernel took beyond
        # that is its socket buffers, far from the 64 MiB offered.
        assert target.sent < 16 * 1024 * 1024, target.sent


async def test_an_endless_answer_still_ends_with_a_bounded_prefix() -> None:
    # The call itself: an answer that never ends is cut after the prefix.
    with SlowServer("huge", size=2**62) as target:
        async with httpx.AsyncClient() as client:
            answer = await outbound.call(client, "GET", target.url, outbound.Limits(10, 1000))
    assert answer.status_code == 200 and answer.truncated and len(answer.head) == 1000


async def _settled(stack: Stack, *ids: int) -> bool:
    for job_id in ids:
        if await _status(stack, job_id) not in ("DONE", "DEAD"):
            return False
    return True


async def test_a_trickling_destination_is_cut_at_the_deadline_and_retried(
    own_database: str, base_settings: Settings
) -> None:
    # 600 bytes at one a second: ten minutes without the deadline.
    with SlowServer("trickle", size=600) as target:
        async with api_stack(
            base_settings,
            own_database,
            **LOOPBACK,
            scheduler_http_deadline_s=1.5,
            scheduler_max_attempts=2,
        ) as stack:
            job = await _create(stack.client, target.url)
            started = time.monotonic()
            async with _workers(stack):
                await wait_until(lambda: _settled(stack, job), 20)
            took = time.monotonic() - started
            got = await _get(stack.client, job)
            runs = await stack.container.scheduler.executions(job)
    # Two attempts, each cut at the deadline: a failure like any other (retried,
    # then DEAD), and the API says no more than for any failed call.
    assert got["status"] == "DEAD" and got["attempts"] == 2, got
    assert got["lastError"] == call_failed(2)
    assert len(runs) == 2 and all("deadline" in str(r["error"]) for r in runs), runs
    assert took < 15, took
    assert target.connections == 2


async def test_trickling_destinations_do_not_delay_an_urgent_job_to_another(
    own_database: str, base_settings: Settings
) -> None:
    # The case: two executors, two trickling jobs, then an urgent job.
    with SlowServer("trickle", size=600) as slow:
        async with (
            HookServer() as fast,
            api_stack(
                base_settings,
                own_database,
                **LOOPBACK,
                scheduler_executors=2,
                scheduler_http_deadline_s=10,
            ) as stack,
        ):
            slow_jobs = [await _create(stack.client, slow.url) for _ in range(2)]
            async with _workers(stack):
                await wait_until(lambda: _is(slow.open == 2), 10)
                urgent = await _create(stack.client, fast.url, urgency=0)
                await wait_until(lambda: _done(stack, urgent), 5)
                # Done while both slow calls still hold their connection.
                assert slow.open == 2
                assert [await _status(stack, j) for j in slow_jobs] == ["RUNNING"] * 2
        assert len(fast.requests) == 1


async def test_one_destination_cannot_take_every_executor_slot(
    own_database: str, base_settings: Settings
) -> None:
    # One executor with four slots, at most two calls to one destination: six
    # trickling jobs leave room for the urgent job to another destination, and
    # the ones put back have not used an attempt.
    with SlowServer("trickle", size=600) as slow:
        async with (
            HookServer() as fast,
            api_stack(
                base_settings,
                own_database,
                **LOOPBACK,
                scheduler_executors=1,
                scheduler_executor_concurrency=4,
                scheduler_http_per_destination=2,
                scheduler_http_deadline_s=10,
            ) as stack,
        ):
            slow_jobs = [await _create(stack.client, slow.url) for _ in range(6)]
            async with _workers(stack):
                await wait_until(lambda: _is(slow.open == 2), 10)
                await asyncio.sleep(1.5)  # the others are taken and put back meanwhile
                urgent = await _create(stack.client, fast.url, urgency=0)
                await wait_until(lambda: _done(stack, urgent), 5)
                attempts = [(await _get(stack.client, j))["attempts"] for j in slow_jobs]
                statuses = [await _status(stack, j) for j in slow_jobs]
        assert slow.max_open == 2, slow.max_open
        assert statuses.count("RUNNING") == 2, statuses
        assert sorted(attempts) == [0, 0, 0, 0, 1, 1], attempts
        assert len(fast.requests) == 1


async def _is(value: bool) -> bool:
    return value


async def _done(stack: Stack, job_id: int) -> bool:
    return await _status(stack, job_id) == "DONE"


NOTE = Notification(1, "subject", "body", "evt-1", phone="+15550001")


async def test_an_sms_provider_trickling_its_answer_is_cut_at_the_deadline() -> None:
    with SlowServer("trickle", size=600) as provider:
        channel = HttpChannel(provider.url, deadline_s=1.0)
        try:
            started = time.monotonic()
            with pytest.raises(NotificationError, match="deadline"):
                await channel.send(NOTE)
            assert time.monotonic() - started < 5
        finally:
            await channel.aclose()


async def test_an_smtp_server_trickling_its_greeting_is_cut_at_the_deadline() -> None:
    with SlowServer("smtp", size=600) as server:
        channel = SmtpChannel(
            "127.0.0.1",
            server.port,
            "reservo@example.invalid",
            "u{user_id}@x.invalid",
            deadline_s=1.0,
        )
        started = time.monotonic()
        with pytest.raises(NotificationError, match="deadline"):
            await channel.send(NOTE)
        assert time.monotonic() - started < 5


async def test_a_gateway_trickling_its_answer_fails_the_refund_at_the_deadline() -> None:
    with SlowServer("trickle", size=600) as provider:
        gateway = HttpGateway(f"http://127.0.0.1:{provider.port}", None, deadline_s=1.5)
        try:
            started = time.monotonic()
            with pytest.raises(TransientGatewayError, match="deadline"):
                await gateway.refund(1, 100, "refund-1")
            assert time.monotonic() - started < 6
        finally:
            await gateway.aclose()
