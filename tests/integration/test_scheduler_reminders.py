"""Appointment reminders are scheduler jobs: created 24 h before the slot in the
booking transaction, cancelled with the appointment, sent once. Plus the
built-in ``http`` category: Idempotency-Key, retries with backoff."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime, timedelta

import asyncpg
import httpx

from reservo.appointments.setup import Appointments
from reservo.bootstrap import Container
from tests.helpers.appointments import book, make_slots
from tests.helpers.auth import auth, new_id
from tests.helpers.scheduler import HookServer, drop_namespace, make, running
from tests.helpers.waiting import wait_until


async def test_booking_creates_a_reminder_24h_before_and_cancel_cancels_it(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client, days_ahead=3)
    patient = new_id()
    r = await book(client, slots[0]["id"], patient)
    assert r.status_code == 201, r.text
    appt = r.json()
    row = await db.fetchrow(
        "SELECT j.* FROM appointment a JOIN scheduled_job j ON j.id = a.reminder_job_id "
        "WHERE a.id = $1",
        appt["id"],
    )
    assert row is not None and row["category"] == "appointments.reminder"
    assert row["status"] == "SCHEDULED"
    assert json.loads(row["payload"]) == {"appointmentId": appt["id"]}
    assert row["run_at"] == datetime.fromisoformat(appt["startAt"]) - timedelta(hours=24)
    r = await client.delete(f"/api/appointments/{appt['id']}", headers=auth("patient", patient))
    assert r.status_code == 200
    status = await db.fetchval("SELECT status FROM scheduled_job WHERE id = $1", row["id"])
    assert status == "CANCELLED"


async def test_no_reminder_when_the_slot_starts_within_24h(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client, days_ahead=0, start="00:00", end="23:45")
    if not slots:  # late in the day: tomorrow's early slots are still < 24 h away
        _, slots = await make_slots(client, days_ahead=1, start="00:00", end="00:15")
    r = await book(client, slots[-1]["id"], new_id())
    assert r.status_code == 201, r.text
    job = await db.fetchval("SELECT reminder_job_id FROM appointment WHERE id = $1", r.json()["id"])
    assert job is None


async def test_reminder_handler_emits_one_notification_event(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client, days_ahead=3)
    r = await book(client, slots[1]["id"], new_id())
    appt = r.json()
    job = await container.scheduler.get(
        await db.fetchval("SELECT reminder_job_id FROM appointment WHERE id=$1", appt["id"])
    )
    await container.module(Appointments).service.remind(job)
    await container.module(Appointments).service.remind(job)  # a rerun sends nothing more
    events = await db.fetch(
        "SELECT payload FROM outbox WHERE topic = $1 AND key = $2",
        "appointments.appointment.reminder-due.v1",
        f"appointment:{appt['id']}",
    )
    assert len(events) == 1
    assert json.loads(events[0]["payload"])["appointmentId"] == appt["id"]
    await container.scheduler.cancel(job.id)


async def test_http_job_sends_idempotency_key_and_retries_until_2xx(
    database_url: str, redis_url: str, db: asyncpg.Connection
) -> None:
    # A real endpoint on 127.0.0.1, which the default destination policy
    # refuses: this test's handler allows it, as RESERVO_JOBS_HTTP_ALLOW would.
    # (It used to hand the handler an in-process ASGI client for a made-up
    # host; the handler now resolves and pins the address itself.)
    from reservo.scheduler.egress import parse_allow
    from reservo.scheduler.handlers import HttpHandler

    ns = f"http-{uuid.uuid4().hex[:8]}"
    s = make(database_url, redis_url, ns, backoff_base_s=0.2, max_attempts=5)
    handler = HttpHandler(allow=parse_allow("127.0.0.1"))
    s.register("http", handler)
    try:
        async with HookServer(lambda n: 503 if n < 3 else 204) as target:
            job = await s.enqueue("http", {"url": target.url, "method": "PUT"})
            async with running(s):

                async def done() -> bool:
                    return (await s.get(job.id)).status == "DONE"

                await wait_until(done, 20)
                await asyncio.sleep(0.3)
        assert [r["idempotency-key"] for r in target.requests] == [str(job.id)] * 3
        assert all(r[":request"].startswith("PUT /hook ") for r in target.requests)
        log = await s.executions(job.id)
        assert [e["outcome"] for e in log] == ["FAILED", "FAILED", "DONE"]
        assert "503" in (log[0]["error"] or "")
    finally:
        await handler.aclose()
        await s.close()
        await drop_namespace(redis_url, ns)
