"""Webhooks out: admins subscribe URLs to event types; every event is POSTed
as its CloudEvents JSON, signed the Standard Webhooks way (proved with the
specification's own verifier, ``standardwebhooks``), at least once, through
the scheduler (jobs ``webhooks.deliver``), to a real local HTTP subscriber."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import asyncpg
import httpx
import orjson
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from reservo.core.maintenance.retention import Pruner
from reservo.core.messaging.outbox import emit
from reservo.core.messaging.transport.base import Event
from reservo.core_modules import Outbox
from reservo.scheduler.setup import SchedulerModule
from reservo.scheduler.workers import run as run_scheduler
from reservo.settings import Settings
from reservo.webhooks.setup import WebhooksModule
from tests.helpers.auth import auth
from tests.helpers.scheduler import Stack, api_stack
from tests.helpers.waiting import wait_until

ADMIN = auth("admin", 1)
BOOKED = "appointments.appointment.booked.v1"
CANCELLED = "appointments.appointment.cancelled.v1"
PAYLOAD = {
    "appointmentId": 42,
    "firstAppointmentId": 42,
    "slotId": 7,
    "patientId": 1001,
    "doctorId": 3,
    "startAt": "2030-01-07T09:00:00+00:00",
    "endAt": "2030-01-07T09:30:00+00:00",
}
# The suite's subscribers listen on loopback: allowed as `http` jobs' are.
LOOPBACK = {"jobs_http_allow": "127.0.0.1", "webhooks_backoff_base_s": 0.1}


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Subscriber:
    """A real HTTP server on 127.0.0.1: records each request and answers
    ``status(n)`` to the n-th (from 1); ``hang``: reads the request and never
    answers (a dead subscriber)."""

    status: Callable[[int], int] = lambda n: 204
    hang: bool = False
    # Awaited when a request arrived, before it is answered.
    on_request: Callable[[], Awaitable[None]] | None = None
    received: list[Received] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def __aenter__(self) -> Subscriber:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            headers = {}
            for line in head.split("\r\n")[1:]:
                name, sep, value = line.partition(":")
                if sep:
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.received.append(Received(headers, body, time.monotonic()))
            if self.on_request is not None:
                await self.on_request()
            if self.hang:
                await asyncio.sleep(3600)
            status = self.status(len(self.received))
            writer.write(
                f"HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".encode()
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def running(stack: Stack) -> AsyncIterator[None]:
    """The outbox relay (which runs the webhooks consumer in-process) and the
    scheduler (which runs the deliveries)."""
    stop = asyncio.Event()
    relay = stack.container.module(Outbox).relay
    tasks = [
        asyncio.create_task(relay.run(stop)),
        asyncio.create_task(run_scheduler(stack.container.module(SchedulerModule).service, stop)),
    ]
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)


async def subscribe(stack: Stack, url: str, *events: str) -> dict[str, Any]:
    r = await stack.client.post(
        "/api/webhook-endpoints", json={"url": url, "events": list(events)}, headers=ADMIN
    )
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


async def publish(stack: Stack, topic: str = BOOKED, n: int = 1) -> list[str]:
    ids = []
    async with stack.container.db.transaction() as conn:
        for i in range(n):
            key = f"appointment:{i}"
            ids.append(str(await emit(conn, topic, key, PAYLOAD, stack.container.clock.now())))
    return ids


async def deliveries(stack: Stack, endpoint_id: int, status: str | None = None) -> list[Any]:
    params = {"status": status} if status else {}
    r = await stack.client.get(
        f"/api/webhook-endpoints/{endpoint_id}/deliveries", params=params, headers=ADMIN
    )
    assert r.status_code == 200, r.text
    found: list[Any] = r.json()
    return found


@pytest.fixture
async def stack(base_settings: Settings, own_database: str) -> AsyncIterator[Stack]:
    async with api_stack(base_settings, own_database, **LOOPBACK) as s:
        yield s


async def test_an_event_arrives_as_cloudevent_verified_by_the_standard_webhooks_verifier(
    stack: Stack,
) -> None:
    async with Subscriber() as sub:
        created = await subscribe(stack, sub.url, BOOKED)
        assert created["secret"].startswith("whsec_")
        assert created["status"] == "ENABLED"
        listed = (await stack.client.get("/api/webhook-endpoints", headers=ADMIN)).json()
        assert [e["id"] for e in listed] == [created["id"]]
        assert "secret" not in listed[0]
        (event_id,) = await publish(stack)
        await publish(stack, CANCELLED)  # not subscribed: not sent
        async with running(stack):
            await wait_until(lambda: len(sub.received) >= 1, timeout_s=20)
            await asyncio.sleep(0.5)
        assert len(sub.received) == 1
        got = sub.received[0]
        # The specification's own verifier accepts the message as sent.
        data = Webhook(created["secret"]).verify(got.body, got.headers)
        assert got.headers["webhook-id"] == event_id
        assert got.headers["content-type"] == "application/json"
        assert data["specversion"] == "1.0"
        assert data["id"] == event_id
        assert data["type"] == f"dev.reservo.{BOOKED}"
        assert data["data"] == PAYLOAD
        # Another secret does not verify it.
        other = (await subscribe(stack, sub.url, BOOKED))["secret"]
        with pytest.raises(WebhookVerificationError):
            Webhook(other).verify(got.body, got.headers)
        (d,) = await deliveries(stack, created["id"])
        assert d["status"] == "DELIVERED"
        assert d["eventId"] == event_id and d["eventType"] == BOOKED
        assert d["attempts"] == 1 and d["lastStatusCode"] == 204
        assert d["deliveredAt"] is not None


async def test_during_a_rotation_both_secrets_verify_and_after_24_h_only_the_new(
    stack: Stack,
) -> None:
    async with Subscriber() as sub:
        created = await subscribe(stack, sub.url, BOOKED)
        old = created["secret"]
        r = await stack.client.post(
            f"/api/webhook-endpoints/{created['id']}/rotate-secret", headers=ADMIN
        )
        assert r.status_code == 200, r.text
        new = r.json()["secret"]
        assert new.startswith("whsec_") and new != old
        async with running(stack):
            await publish(stack)
            await wait_until(lambda: len(sub.received) >= 1, timeout_s=20)
            got = sub.received[0]
            assert len(got.headers["webhook-signature"].split(" ")) == 2
            Webhook(old).verify(got.body, got.headers)
            Webhook(new).verify(got.body, got.headers)
            # The previous secret signs for 24 h from the rotation ...
            grace = await stack.db.fetchval(
                "SELECT previous_until - now() FROM webhook_endpoint WHERE id = $1", created["id"]
            )
            assert timedelta(hours=23, minutes=59) < grace <= timedelta(hours=24)
            # ... and no longer once they have passed.
            await stack.db.execute(
                "UPDATE webhook_endpoint SET previous_until = now() - interval '1 second'"
            )
            await publish(stack)
            await wait_until(lambda: len(sub.received) >= 2, timeout_s=20)
        later = sub.received[1]
        assert len(later.headers["webhook-signature"].split(" ")) == 1
        Webhook(new).verify(later.body, later.headers)
        with pytest.raises(WebhookVerificationError):
            Webhook(old).verify(later.body, later.headers)


async def test_a_failed_attempt_is_retried_with_the_same_webhook_id_until_2xx(
    stack: Stack,
) -> None:
    async with Subscriber(status=lambda n: 500 if n < 3 else 200) as sub:
        created = await subscribe(stack, sub.url, BOOKED)
        (event_id,) = await publish(stack)
        async with running(stack):
            await wait_until(lambda: len(sub.received) >= 3, timeout_s=30)
            await wait_until(lambda: _status(stack, created["id"], "DELIVERED"), timeout_s=10)
        assert {r.headers["webhook-id"] for r in sub.received} == {event_id}
        for r in sub.received:
            Webhook(created["secret"]).verify(r.body, r.headers)
        (d,) = await deliveries(stack, created["id"])
        assert d["attempts"] == 3 and d["lastStatusCode"] == 200


async def _status(stack: Stack, endpoint_id: int, status: str) -> bool:
    return bool(await deliveries(stack, endpoint_id, status))


async def test_past_the_retry_window_a_delivery_fails_and_after_5_days_the_endpoint_is_disabled(
    base_settings: Settings, own_database: str
) -> None:
    settings = {**LOOPBACK, "webhooks_retry_hours": 0.001}  # 3.6 s
    async with (
        api_stack(base_settings, own_database, **settings) as stack,
        Subscriber(status=lambda n: 503) as sub,
    ):
        created = await subscribe(stack, sub.url, BOOKED)
        await publish(stack)
        async with running(stack):
            await wait_until(lambda: _status(stack, created["id"], "FAILED"), timeout_s=30)
            (d,) = await deliveries(stack, created["id"])
            assert d["attempts"] >= 2 and d["lastStatusCode"] == 503
            assert d["nextAttemptAt"] is None
            # Failing since five days (as if they had passed): the next failed
            # attempt disables the endpoint.
            await stack.db.execute(
                "UPDATE webhook_endpoint SET failing_since = failing_since - interval '5 days'"
            )
            await publish(stack)
            await wait_until(
                lambda: _endpoint_status(stack, created["id"], "DISABLED"), timeout_s=30
            )
            seen = len(sub.received)
            await publish(stack)  # a disabled endpoint gets nothing new
            await asyncio.sleep(1.0)
        assert len(sub.received) == seen
        # Enabled again by an admin.
        r = await stack.client.patch(
            f"/api/webhook-endpoints/{created['id']}",
            json={"status": "ENABLED"},
            headers=ADMIN,
        )
        assert r.status_code == 200 and r.json()["status"] == "ENABLED"


async def _endpoint_status(stack: Stack, endpoint_id: int, status: str) -> bool:
    found = await stack.db.fetchval(
        "SELECT status FROM webhook_endpoint WHERE id = $1", endpoint_id
    )
    return bool(found == status)


async def test_a_dead_subscriber_delays_no_other_endpoint(
    base_settings: Settings, own_database: str
) -> None:
    # One executor with few slots: without the per-endpoint bound the dead
    # subscriber's deliveries would take them all for their 10 s timeout.
    settings = {
        **LOOPBACK,
        "scheduler_executors": 1,
        "scheduler_executor_concurrency": 8,
        "webhooks_per_endpoint": 2,
        "webhooks_timeout_s": 10.0,
    }
    async with (
        api_stack(base_settings, own_database, **settings) as stack,
        Subscriber(hang=True) as dead,
        Subscriber() as alive,
    ):
        await subscribe(stack, dead.url, BOOKED)
        await subscribe(stack, alive.url, CANCELLED)
        async with running(stack):
            await publish(stack, BOOKED, 30)
            await wait_until(lambda: len(dead.received) >= 2, timeout_s=20)
            start = time.monotonic()
            await publish(stack, CANCELLED, 20)
            await wait_until(lambda: len(alive.received) >= 20, timeout_s=30)
            took = time.monotonic() - start
            # At most its share of attempts ever reached the dead subscriber.
            assert len(dead.received) <= 2
        assert took < 6.0, f"the live endpoint's 20 deliveries took {took:.1f} s"


async def test_redeliver_asked_twice_at_once_queues_it_once(stack: Stack) -> None:
    async with Subscriber() as sub:
        created = await subscribe(stack, sub.url, BOOKED)
        (event_id,) = await publish(stack)
        async with running(stack):
            await wait_until(lambda: _status(stack, created["id"], "DELIVERED"), timeout_s=20)
            (d,) = await deliveries(stack, created["id"])
            barrier = asyncio.Barrier(10)

            async def redeliver() -> httpx.Response:
                await barrier.wait()
                return await stack.client.post(
                    f"/api/webhook-deliveries/{d['id']}/redeliver", headers=ADMIN
                )

            answers = await asyncio.gather(*(redeliver() for _ in range(10)))
            assert [a.status_code for a in answers] == [202] * 10, answers[0].text
            await wait_until(lambda: len(sub.received) >= 2, timeout_s=20)
            await wait_until(lambda: _status(stack, created["id"], "DELIVERED"), timeout_s=20)
            await asyncio.sleep(1.0)
        assert [r.headers["webhook-id"] for r in sub.received] == [event_id, event_id]
        jobs = await stack.db.fetchval(
            "SELECT count(*) FROM scheduled_job WHERE category = 'webhooks.deliver'"
            " AND (payload->>'deliveryId')::bigint = $1",
            d["id"],
        )
        assert jobs == 2
        (after,) = await deliveries(stack, created["id"])
        assert after["attempts"] == 2 and after["status"] == "DELIVERED"


async def test_a_redelivered_event_fans_out_once_per_endpoint(stack: Stack) -> None:
    async with Subscriber() as a, Subscriber() as b:
        ea = await subscribe(stack, a.url, BOOKED)
        eb = await subscribe(stack, b.url, BOOKED, CANCELLED)
        (event_id,) = await publish(stack)
        row = await stack.db.fetchrow("SELECT * FROM outbox WHERE event_id = $1::uuid", event_id)
        event = Event(
            row["event_id"],
            row["topic"],
            row["key"],
            orjson.loads(row["payload"]),
            row["created_at"],
        )
        service = stack.container.module(WebhooksModule).service
        await asyncio.gather(*(service.handle_many([event]) for _ in range(5)))
        for endpoint in (ea, eb):
            assert len(await deliveries(stack, endpoint["id"])) == 1


async def test_bad_requests_are_refused_and_change_nothing(
    stack: Stack, db: asyncpg.Connection
) -> None:
    c = stack.client
    for url in (
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/hook",
        "http://user:pw@example.com/hook",
        "ftp://example.com/hook",
    ):
        r = await c.post(
            "/api/webhook-endpoints", json={"url": url, "events": [BOOKED]}, headers=ADMIN
        )
        assert r.status_code == 422, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["code"] == "url_not_allowed", r.json()
    r = await c.post(
        "/api/webhook-endpoints",
        json={"url": "https://example.com/hook", "events": ["no.such.event.v1"]},
        headers=ADMIN,
    )
    assert r.status_code == 422 and r.json()["code"] == "unknown_event_type"
    r = await c.post(
        "/api/webhook-endpoints",
        json={"url": "https://example.com/hook", "events": [BOOKED]},
        headers=auth("service", 1),
    )
    assert r.status_code == 403
    assert await stack.db.fetchval("SELECT count(*) FROM webhook_endpoint") == 0
    for method, path in (
        ("PATCH", "/api/webhook-endpoints/999"),
        ("DELETE", "/api/webhook-endpoints/999"),
        ("POST", "/api/webhook-endpoints/999/rotate-secret"),
        ("GET", "/api/webhook-endpoints/999/deliveries"),
        ("POST", "/api/webhook-deliveries/999/redeliver"),
    ):
        r = await c.request(method, path, json={} if method == "PATCH" else None, headers=ADMIN)
        assert r.status_code == 404, (method, path, r.text)


async def test_deleting_an_endpoint_drops_its_pending_deliveries(stack: Stack) -> None:
    created = await subscribe(stack, "https://example.com/hook", BOOKED)
    await publish(stack)
    relay = stack.container.module(Outbox).relay
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    await wait_until(lambda: _has_deliveries(stack, created["id"]), timeout_s=20)
    stop.set()
    await task
    r = await stack.client.delete(f"/api/webhook-endpoints/{created['id']}", headers=ADMIN)
    assert r.status_code == 204
    assert await stack.db.fetchval("SELECT count(*) FROM webhook_delivery") == 0


async def _has_deliveries(stack: Stack, endpoint_id: int) -> bool:
    return bool(await deliveries(stack, endpoint_id, "PENDING"))


async def test_retention_prunes_finished_deliveries_and_unneeded_bodies_only(
    stack: Stack,
) -> None:
    db = stack.db
    now = stack.container.clock.now()
    endpoint_id = await db.fetchval(
        "INSERT INTO webhook_endpoint (url, events, secret, created_at)"
        " VALUES ('https://example.com/h', $1, 'whsec_AAAA', $2) RETURNING id",
        [BOOKED],
        now,
    )

    async def delivery(status: str, age: timedelta) -> tuple[int, Any]:
        event_id = uuid.uuid4()
        await db.execute(
            "INSERT INTO webhook_event VALUES ($1, $2, '{}', $3)", event_id, BOOKED, now - age
        )
        delivery_id = await db.fetchval(
            "INSERT INTO webhook_delivery (endpoint_id, event_id, status, retry_until,"
            " created_at) VALUES ($1, $2, $3, $4, $4) RETURNING id",
            endpoint_id,
            event_id,
            status,
            now - age,
        )
        return delivery_id, event_id

    old_ok = await delivery("DELIVERED", timedelta(days=31))
    old_failed = await delivery("FAILED", timedelta(days=31))
    old_pending = await delivery("PENDING", timedelta(days=400))
    young_ok = await delivery("DELIVERED", timedelta(days=29))
    rules = stack.container.module(WebhooksModule).retention
    assert {r.name for r in stack.container.retention()} >= {r.name for r in rules}
    await Pruner(stack.container.db, stack.container.clock, rules, pause_s=0).run()
    assert {r[0] for r in await db.fetch("SELECT id FROM webhook_delivery")} == {
        old_pending[0],
        young_ok[0],
    }
    assert {r[0] for r in await db.fetch("SELECT event_id FROM webhook_event")} == {
        old_pending[1],
        young_ok[1],
    }
    # The old finished ones went, their bodies with them.
    for gone in (old_ok, old_failed):
        assert (
            await db.fetchval("SELECT count(*) FROM webhook_event WHERE event_id = $1", gone[1])
            == 0
        )


async def test_no_attempt_runs_inside_a_database_transaction(stack: Stack) -> None:
    """While the subscriber holds each attempt's request, no connection whose
    last statement touched the webhooks' tables is inside a transaction. One
    event, attempts one after another (two failures, then a success), the
    fan-out done before: nothing else of the module runs meanwhile."""
    in_transaction: list[int] = []

    async def look() -> None:
        in_transaction.append(
            await stack.db.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND state LIKE 'idle in transaction%' AND query LIKE '%webhook_%'"
                " AND pid <> pg_backend_pid()"
            )
        )

    async with Subscriber(status=lambda n: 500 if n < 3 else 204, on_request=look) as sub:
        created = await subscribe(stack, sub.url, BOOKED)
        await publish(stack)
        stop = asyncio.Event()
        relay = asyncio.create_task(stack.container.module(Outbox).relay.run(stop))
        await wait_until(lambda: _has_deliveries(stack, created["id"]), timeout_s=20)
        stop.set()
        await relay
        stop = asyncio.Event()
        scheduler = stack.container.module(SchedulerModule).service
        task = asyncio.create_task(run_scheduler(scheduler, stop))
        try:
            await wait_until(lambda: _status(stack, created["id"], "DELIVERED"), timeout_s=30)
        finally:
            stop.set()
            await task
    assert len(sub.received) == 3
    assert in_transaction == [0, 0, 0]
