"""Builders shared by the appointments tests."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import date, timedelta
from typing import Any

import asyncpg
import httpx

from reservo.app import create_app
from reservo.bootstrap import build
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.auth import ADMIN, auth
from tests.helpers.http import key


@asynccontextmanager
async def app_client(settings: Settings, clock: OffsetClock) -> AsyncIterator[httpx.AsyncClient]:
    """The real app on its own container built from ``settings`` (a test's own
    limits), closed after."""
    container = build(settings, clock)
    app = create_app(container, owns_container=False)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
        ) as c:
            yield c
    finally:
        await container.close()


async def make_doctor(client: httpx.AsyncClient, tz: str = "Europe/Lisbon") -> int:
    r = await client.post("/api/doctors", json={"name": "Dr. Test", "timezone": tz}, headers=ADMIN)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


async def make_slots(
    client: httpx.AsyncClient,
    *,
    capacity: int = 1,
    days_ahead: int = 2,
    start: str = "08:00",
    end: str = "09:00",
    minutes: int = 15,
    tz: str = "Europe/Lisbon",
) -> tuple[int, list[dict[str, Any]]]:
    doctor = await make_doctor(client, tz)
    day = date.today() + timedelta(days=days_ahead)
    await schedule_day(
        client, doctor, day, start=start, end=end, minutes=minutes, capacity=capacity
    )
    return doctor, await slot_list(client, doctor, day)


async def schedule_day(
    client: httpx.AsyncClient,
    doctor: int,
    day: date,
    *,
    start: str = "08:00",
    end: str = "09:00",
    minutes: int = 15,
    capacity: int = 1,
    to: date | None = None,
    **rules: Any,
) -> None:
    """A schedule of ``doctor`` on every weekday from ``day`` to ``to`` (that day
    alone by default); ``rules``: more of the schedule's fields (prepaid,
    overbookLimit, minNoticeMinutes, ...)."""
    r = await client.post(
        f"/api/doctors/{doctor}/schedules",
        headers=ADMIN,
        json={
            "from": day.isoformat(),
            "to": (to or day).isoformat(),
            "weekdays": list(range(1, 8)),
            "startTime": start,
            "endTime": end,
            "slotMinutes": minutes,
            "capacity": capacity,
            **rules,
        },
    )
    assert r.status_code == 201, r.text


async def book(
    client: httpx.AsyncClient, slot_id: int, patient_id: int, idem: str | None = None
) -> httpx.Response:
    headers = {**auth("patient", patient_id), "Idempotency-Key": idem or str(uuid.uuid4())}
    return await client.post(
        "/api/appointments", json={"slotId": slot_id, "patientId": patient_id}, headers=headers
    )


async def book_as(
    client: httpx.AsyncClient, headers: dict[str, str], slot_id: int, patient_id: int
) -> httpx.Response:
    return await client.post(
        "/api/appointments",
        json={"slotId": slot_id, "patientId": patient_id},
        headers={**headers, **key()},
    )


async def assert_slot_invariant(db: asyncpg.Connection, slot_ids: list[int]) -> list[Any]:
    rows = await db.fetch(
        """SELECT s.id, s.capacity, s.booked_count,
                  (SELECT count(*) FROM appointment a
                    WHERE a.slot_id = s.id AND a.status = 'BOOKED') AS booked
             FROM time_slot s WHERE s.id = ANY($1::bigint[]) ORDER BY s.id""",
        slot_ids,
    )
    assert len(rows) == len(set(slot_ids))
    for r in rows:
        assert r["booked_count"] == r["booked"], dict(r)
        assert 0 <= r["booked_count"] <= r["capacity"], dict(r)
    return rows


async def make_overbookable(
    client: httpx.AsyncClient, *, capacity: int = 1, limit: int = 2, days_ahead: int = 2
) -> tuple[int, date, list[dict[str, Any]]]:
    """A doctor with four 15-minute slots of ``capacity`` and ``limit`` overbooking
    seats each, the day and its slot list."""
    doctor = await make_doctor(client)
    day = date.today() + timedelta(days=days_ahead)
    await schedule_day(client, doctor, day, capacity=capacity, overbookLimit=limit)
    return doctor, day, await slot_list(client, doctor, day)


async def overbook(
    client: httpx.AsyncClient, slot_id: int, patient_id: int, headers: dict[str, str]
) -> httpx.Response:
    return await client.post(
        "/api/appointments",
        json={"slotId": slot_id, "patientId": patient_id, "overbook": True},
        headers={**headers, "Idempotency-Key": str(uuid.uuid4())},
    )


async def assert_counters_match(db: asyncpg.Connection, slot_id: int) -> tuple[int, int]:
    """Both counters equal their BOOKED appointments, each within its bound."""
    row = await db.fetchrow(
        """SELECT s.capacity, s.booked_count, s.overbook_limit, s.overbooked_count,
                  count(a.id) FILTER (WHERE NOT a.overbooked) AS regular,
                  count(a.id) FILTER (WHERE a.overbooked) AS extra
             FROM time_slot s
             LEFT JOIN appointment a ON a.slot_id = s.id AND a.status = 'BOOKED'
            WHERE s.id = $1
            GROUP BY s.id""",
        slot_id,
    )
    assert row is not None
    assert row["booked_count"] == row["regular"] <= row["capacity"], dict(row)
    assert row["overbooked_count"] == row["extra"] <= row["overbook_limit"], dict(row)
    return row["booked_count"], row["overbooked_count"]


async def reschedule(
    client: httpx.AsyncClient,
    appointment_id: int,
    slot_id: int,
    headers: dict[str, str],
    idem: str | None = None,
) -> httpx.Response:
    return await client.post(
        f"/api/appointments/{appointment_id}/reschedule",
        json={"slotId": slot_id},
        headers={**headers, "Idempotency-Key": idem or str(uuid.uuid4())},
    )


async def wait(
    client: httpx.AsyncClient, slot_id: int, patient: int, headers: dict[str, str] | None = None
) -> httpx.Response:
    return await client.post(
        f"/api/slots/{slot_id}/waitlist",
        json={"patientId": patient},
        headers=headers or auth("patient", patient),
    )


async def repeating(
    client: httpx.AsyncClient, doctor: int, first: date, minutes: int = 60
) -> dict[str, int]:
    r = await client.post(
        f"/api/doctors/{doctor}/schedules",
        headers=ADMIN,
        json={
            "from": first.isoformat(),
            "weekdays": [1, 2, 3, 4, 5, 6, 7],
            "startTime": "09:00",
            "endTime": "10:00",
            "slotMinutes": minutes,
        },
    )
    assert r.status_code == 201, r.text
    out: dict[str, int] = r.json()
    return out


async def days_with_slots(db: asyncpg.Connection, doctor: int) -> list[date]:
    rows = await db.fetch(
        """SELECT (start_at AT TIME ZONE 'UTC')::date AS day FROM time_slot
            WHERE doctor_id = $1 ORDER BY start_at""",
        doctor,
    )
    return [r["day"] for r in rows]


async def slot_list(client: httpx.AsyncClient, doctor: int, day: date) -> list[dict[str, Any]]:
    r = await client.get(
        f"/api/doctors/{doctor}/slots", params={"date": day.isoformat()}, headers=ADMIN
    )
    assert r.status_code == 200, r.text
    slots: list[dict[str, Any]] = r.json()
    return slots
