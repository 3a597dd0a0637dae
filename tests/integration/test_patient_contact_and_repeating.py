"""A patient's contact (PUT through HTTP; notifications reach that address through
the SMTP or SMS/HTTP channel) and repeating schedules (kept generated up to the
horizon by the `appointments` role, idempotent with many workers)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, time, timedelta
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from reservo.appointments.setup import Appointments
from reservo.bootstrap import Container, build
from reservo.core.kernel.clock import OffsetClock
from reservo.core.messaging.transport.base import Event
from reservo.notifications.channels import HttpChannel, SmtpChannel
from reservo.notifications.consumer import NotificationConsumer
from reservo.notifications.setup import Notifications
from reservo.settings import Settings
from tests.helpers.appointments import book, days_with_slots, make_doctor, make_slots, repeating
from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.http import problem
from tests.helpers.notify import TEMPLATE, HttpSink, SmtpSink

# -- contact -------------------------------------------------------------------------------


async def put_contact(
    client: httpx.AsyncClient, patient: int, body: Any, headers: dict[str, str] | None = None
) -> httpx.Response:
    return await client.put(
        f"/api/patients/{patient}/contact", json=body, headers=headers or auth("patient", patient)
    )


async def test_a_patient_sets_and_clears_their_contact(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    patient = new_id()
    r = await put_contact(client, patient, {"email": "ana@example.com", "phone": "+351912345678"})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "patientId": patient,
        "email": "ana@example.com",
        "phone": "+351912345678",
        "pushSubscriptions": [],
    }
    # PUT replaces: an omitted field is cleared. An admin may set it too.
    r = await put_contact(client, patient, {"phone": "+84901234567"}, ADMIN)
    assert r.json() == {
        "patientId": patient,
        "email": None,
        "phone": "+84901234567",
        "pushSubscriptions": [],
    }
    row = await db.fetchrow("SELECT email, phone FROM contact WHERE user_id = $1", patient)
    assert dict(row) == {"email": None, "phone": "+84901234567"}


@pytest.mark.parametrize(
    "body",
    [
        {"email": "not-an-address"},
        {"email": "a@b"},
        {"email": "x" * 250 + "@example.com"},
        {"email": "a b@example.com"},
        {"phone": "912345678"},
        {"phone": "+0123456789"},
        {"phone": "+35191234567890123"},
        {"phone": 351912345678},
        {"fax": "+351912345678"},
        [],
    ],
)
async def test_bad_contact_data_is_422_and_changes_nothing(
    client: httpx.AsyncClient, db: asyncpg.Connection, body: Any
) -> None:
    patient = new_id()
    problem(await put_contact(client, patient, body), 422, "validation_error")
    assert await db.fetchval("SELECT count(*) FROM contact WHERE user_id = $1", patient) == 0


async def test_only_the_patient_or_an_admin_sets_the_contact(client: httpx.AsyncClient) -> None:
    patient = new_id()
    for headers in (auth("patient", new_id()), auth("doctor", patient), auth("customer", patient)):
        problem(await put_contact(client, patient, {}, headers), 403, "forbidden")


async def _booked_event(db: asyncpg.Connection, appointment_id: int) -> Event:
    row = await db.fetchrow(
        "SELECT event_id, topic, key, payload, created_at FROM outbox WHERE key = $1",
        f"appointment:{appointment_id}",
    )
    return Event(
        row["event_id"], row["topic"], row["key"], orjson.loads(row["payload"]), row["created_at"]
    )


async def test_a_confirmation_goes_to_the_patients_email_over_smtp(
    client: httpx.AsyncClient,
    db: asyncpg.Connection,
    container: Container,
    smtp_server: SmtpSink,
) -> None:
    _, slots = await make_slots(client)
    patient, nobody = new_id(), new_id()
    await put_contact(client, patient, {"email": "ana@example.com"})
    mine = (await book(client, slots[0]["id"], patient)).json()
    theirs = (await book(client, slots[1]["id"], nobody)).json()
    channel = SmtpChannel("127.0.0.1", smtp_server.port, "clinic@example.invalid", TEMPLATE)
    consumer = NotificationConsumer(
        container.db, channel, container.clock, container.module(Notifications).consumer.renderers
    )
    await consumer.handle_many(
        [await _booked_event(db, mine["id"]), await _booked_event(db, theirs["id"])]
    )
    rcpts = sorted(r for _, rs, _ in smtp_server.collector.messages for r in rs)
    # Without a contact, the template address applies as before.
    assert rcpts == sorted(["ana@example.com", f"user-{nobody}@example.invalid"])


async def test_a_confirmation_goes_to_the_patients_phone_over_sms(
    client: httpx.AsyncClient,
    db: asyncpg.Connection,
    container: Container,
    http_server: HttpSink,
) -> None:
    _, slots = await make_slots(client)
    patient = new_id()
    await put_contact(client, patient, {"phone": "+351912345678"})
    appt = (await book(client, slots[0]["id"], patient)).json()
    channel = HttpChannel(http_server.url)
    consumer = NotificationConsumer(
        container.db, channel, container.clock, container.module(Notifications).consumer.renderers
    )
    try:
        await consumer.handle(await _booked_event(db, appt["id"]))
    finally:
        await channel.aclose()
    (req,) = http_server.requests
    sent = json.loads(req.body)
    assert sent["phone"] == "+351912345678" and sent["to"] == patient


# -- repeating schedules -------------------------------------------------------------------


async def test_a_schedule_without_to_is_generated_up_to_the_horizon(
    client: httpx.AsyncClient, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    doctor = await make_doctor(client, "UTC")
    today = clock.now().date()
    out = await repeating(client, doctor, today - timedelta(days=30))
    # Today .. today + 14: never the past, never beyond the horizon.
    assert out["created"] == 15 and out["skipped"] == 0 and out["scheduleId"] >= 1
    assert await days_with_slots(db, doctor) == [today + timedelta(days=i) for i in range(15)]


async def test_the_role_keeps_extending_it_day_after_day_with_many_workers(
    client: httpx.AsyncClient, db: asyncpg.Connection, clock: OffsetClock, container: Container
) -> None:
    doctor = await make_doctor(client, "UTC")
    today = clock.now().date()
    await repeating(client, doctor, today + timedelta(days=3))
    assert (await days_with_slots(db, doctor))[-1] == today + timedelta(days=14)
    svc = container.module(Appointments).service

    # Nothing to do on the same day, however many workers run it.
    await asyncio.gather(*(svc.extend_schedules() for _ in range(4)))
    assert (await days_with_slots(db, doctor))[-1] == today + timedelta(days=14)

    # Three days later (nobody called the API): four workers at once.
    clock.advance(timedelta(days=3))
    await asyncio.gather(*(svc.extend_schedules() for _ in range(4)))
    days = await days_with_slots(db, doctor)
    assert days == [today + timedelta(days=i) for i in range(3, 18)]  # once each
    assert await db.fetchval(
        "SELECT generated_until FROM doctor_schedule WHERE doctor_id = $1", doctor
    ) == today + timedelta(days=17)
    # The new day opens in its window: 07:00 of the day that is now "today".
    opens = await db.fetchval(
        "SELECT opens_at FROM time_slot WHERE doctor_id = $1 ORDER BY start_at DESC LIMIT 1", doctor
    )
    assert opens == datetime.combine(today + timedelta(days=3), time(7), tzinfo=UTC)


async def test_the_appointments_role_runs_the_extension(
    container: Container, client: httpx.AsyncClient, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    doctor = await make_doctor(client, "UTC")
    await repeating(client, doctor, clock.now().date())
    clock.advance(timedelta(days=2))
    stop = asyncio.Event()
    task = asyncio.create_task(container.roles()["appointments"](stop))
    try:
        for _ in range(100):
            last = (await days_with_slots(db, doctor))[-1]
            if last == (clock.now() + timedelta(days=14)).date():
                break
            await asyncio.sleep(0.05)
        assert last == (clock.now() + timedelta(days=14)).date()
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


async def test_an_omitted_to_is_not_bounded_by_92_days_but_the_rest_is_checked(
    client: httpx.AsyncClient,
) -> None:
    doctor = await make_doctor(client, "UTC")
    r = await client.post(
        f"/api/doctors/{doctor}/schedules",
        headers=ADMIN,
        json={"from": "2030-01-01", "weekdays": [1], "startTime": "10:00", "endTime": "09:00"},
    )
    problem(r, 422, "validation_error")
    r = await client.post(
        f"/api/doctors/{2**62}/schedules",
        headers=ADMIN,
        json={"from": "2030-01-01", "weekdays": [1], "startTime": "09:00", "endTime": "10:00"},
    )
    problem(r, 404, "doctor_not_found")


# -- the demo data ---------------------------------------------------------------------------


async def test_the_demo_shows_a_repeating_schedule_and_a_waitlist(
    base_settings: Settings, own_database: str
) -> None:
    from reservo import demo

    # As `reservo up --demo` builds it: the sandbox, and its own address allowed.
    settings = demo.settings_for_demo(base_settings.with_(database_url=own_database))
    assert settings.jobs_http_allow == f"{settings.http_host}:{settings.http_port}"
    own = build(settings, OffsetClock())
    try:
        await demo.load(own)
        await demo.load(own)  # idempotent
        await _demo_shows_its_features(own, demo)
    finally:
        await own.close()


async def _demo_shows_its_features(own: Container, demo: Any) -> None:
    async with own.db.connection() as conn:
        schedules = await conn.fetch(
            "SELECT d.name FROM doctor_schedule s JOIN doctor d ON d.id = s.doctor_id"
        )
        waiting = await conn.fetch(
            """SELECT w.patient_id, s.capacity, s.booked_count FROM waitlist_entry w
                 JOIN time_slot s ON s.id = w.slot_id"""
        )
    assert [r["name"] for r in schedules] == [demo.REPEATING]
    assert [tuple(r) for r in waiting] == [(demo.WAITING_PATIENT, 1, 1)]
    async with own.db.connection() as conn:
        recurring = await conn.fetch("SELECT category, cron, payload FROM recurring_job")
    assert [(r["category"], r["cron"]) for r in recurring] == [("http", demo.RECURRING_CRON)]
