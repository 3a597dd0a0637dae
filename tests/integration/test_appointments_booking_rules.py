"""A schedule's booking rules through HTTP: minNoticeMinutes (409
too_late_to_book for patients' bookings and reschedules, never for an admin,
decided by the server's clock) and maxPerPatientPerDay (409 daily_limit,
counted per doctor and local day in the doctor's zone, HELD and BOOKED but not
cancelled ones), and the daily limit's race: 20 bookings of one patient
released together give exactly the limit."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from datetime import date, datetime, timedelta
from functools import partial
from typing import Any

import asyncpg
import httpx
import pytest

from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import (
    app_client,
    assert_slot_invariant,
    book,
    book_as,
    make_doctor,
    reschedule,
    schedule_day,
    slot_list,
)
from tests.helpers.auth import ADMIN, auth, auth_at, new_id
from tests.helpers.http import codes, problem, together


async def ruled_slots(
    client: httpx.AsyncClient, *, days_ahead: int = 2, tz: str = "Europe/Lisbon", **kw: Any
) -> tuple[int, date, list[dict[str, Any]]]:
    doctor = await make_doctor(client, tz)
    day = date.today() + timedelta(days=days_ahead)
    await schedule_day(client, doctor, day, **{"end": "10:00", **kw})
    return doctor, day, await slot_list(client, doctor, day)


def starts(slot: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(slot["startAt"])


async def book_at(
    client: httpx.AsyncClient, clock: OffsetClock, slot_id: int, patient_id: int
) -> httpx.Response:
    """A patient's booking with a token valid by the app's (moved) clock."""
    return await book_as(client, auth_at(clock, "patient", patient_id), slot_id, patient_id)


# -- minimum notice -----------------------------------------------------------------------


async def test_a_patient_books_no_later_than_the_minimum_notice(
    client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    _, _, slots = await ruled_slots(client, minNoticeMinutes=60)
    # Far ahead: bookable.
    assert (await book(client, slots[0]["id"], new_id())).status_code == 201
    # The server's clock now 30 minutes before slot 1: slots 1 and 2 start
    # within the hour, slot 4 in 75 minutes.
    clock.advance(starts(slots[1]) - clock.now() - timedelta(minutes=30))
    for s in slots[1:3]:
        problem(await book_at(client, clock, s["id"], new_id()), 409, "too_late_to_book")
    assert starts(slots[4]) - clock.now() >= timedelta(minutes=70)
    assert (await book_at(client, clock, slots[4]["id"], new_id())).status_code == 201
    # An admin booking for a patient is not bound by it.
    r = await book_as(client, auth_at(clock, "admin", 1), slots[1]["id"], new_id())
    assert r.status_code == 201, r.text
    # The refusals booked nothing and left the slots' counters right.
    rows = await assert_slot_invariant(db, [s["id"] for s in slots])
    assert [r["booked_count"] for r in rows[:5]] == [1, 1, 0, 0, 1]


async def test_a_patient_reschedules_no_later_than_the_minimum_notice(
    client: httpx.AsyncClient, clock: OffsetClock
) -> None:
    _, _, slots = await ruled_slots(client, minNoticeMinutes=60)
    patient = new_id()
    booked = await book(client, slots[7]["id"], patient)
    assert booked.status_code == 201
    clock.advance(starts(slots[1]) - clock.now() - timedelta(minutes=30))
    me = auth_at(clock, "patient", patient)
    problem(
        await reschedule(client, booked.json()["id"], slots[2]["id"], me), 409, "too_late_to_book"
    )
    # The appointment stayed where it was; a slot beyond the notice takes it.
    moved = await reschedule(client, booked.json()["id"], slots[6]["id"], me)
    assert moved.status_code == 200, moved.text
    # An admin moves it inside the notice.
    admin = auth_at(clock, "admin", 1)
    by_admin = await reschedule(client, moved.json()["id"], slots[2]["id"], admin)
    assert by_admin.status_code == 200, by_admin.text


async def test_a_refusal_of_the_rules_never_marks_the_slot_full(
    client: httpx.AsyncClient, clock: OffsetClock
) -> None:
    """The slot still has seats for other patients: neither refusal may make the
    Redis gate refuse them slot_full."""
    _, _, slots = await ruled_slots(client, capacity=2, maxPerPatientPerDay=1)
    patient = new_id()
    assert (await book(client, slots[0]["id"], patient)).status_code == 201
    for _ in range(3):
        problem(await book(client, slots[1]["id"], patient), 409, "daily_limit")
    assert (await book(client, slots[1]["id"], new_id())).status_code == 201
    assert (await book(client, slots[1]["id"], new_id())).status_code == 201
    problem(await book(client, slots[1]["id"], new_id()), 409, "slot_full")


# -- daily limit ---------------------------------------------------------------------------


async def test_the_daily_limit_counts_live_appointments_per_doctor_and_day(
    roomy_client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    client = roomy_client  # one patient books more than the rate limit's 5 in 10 s
    doctor = await make_doctor(client)
    day = date.today() + timedelta(days=2)
    await schedule_day(
        client, doctor, day, end="10:00", to=day + timedelta(days=1), maxPerPatientPerDay=2
    )
    slots = await slot_list(client, doctor, day)
    tomorrow = await slot_list(client, doctor, day + timedelta(days=1))
    other, _, elsewhere = await ruled_slots(client, maxPerPatientPerDay=2)
    patient = new_id()
    first = await book(client, slots[0]["id"], patient)
    assert first.status_code == 201
    assert (await book(client, slots[1]["id"], patient)).status_code == 201
    body = problem(await book(client, slots[2]["id"], patient), 409, "daily_limit")
    assert "2" in body["detail"]
    # Another day of the doctor, another doctor's day, another patient: not counted.
    assert (await book(client, tomorrow[0]["id"], patient)).status_code == 201
    assert (await book(client, elsewhere[4]["id"], patient)).status_code == 201
    assert (await book(client, slots[2]["id"], new_id())).status_code == 201
    # A cancelled appointment no longer counts.
    r = await client.delete(
        f"/api/appointments/{first.json()['id']}", headers=auth("patient", patient)
    )
    assert r.status_code == 200
    assert (await book(client, slots[3]["id"], patient)).status_code == 201
    problem(await book(client, slots[5]["id"], patient), 409, "daily_limit")
    assert other != doctor
    live = await db.fetchval(
        "SELECT count(*) FROM appointment a JOIN time_slot s ON s.id = a.slot_id"
        " WHERE a.patient_id = $1 AND s.doctor_id = $2 AND a.status = 'BOOKED'",
        patient,
        doctor,
    )
    assert live == 3  # two on the day, one tomorrow


async def test_a_reschedule_within_the_day_keeps_the_count(client: httpx.AsyncClient) -> None:
    _, _, slots = await ruled_slots(client, maxPerPatientPerDay=1)
    patient = new_id()
    me = auth("patient", patient)
    booked = await book(client, slots[0]["id"], patient)
    assert booked.status_code == 201
    moved = await reschedule(client, booked.json()["id"], slots[3]["id"], me)
    assert moved.status_code == 200, moved.text
    problem(await book(client, slots[1]["id"], patient), 409, "daily_limit")


async def test_the_day_is_the_doctors_local_day(client: httpx.AsyncClient) -> None:
    """Kiritimati is UTC+14: its 08:00 is the UTC day before, its 23:00 the same
    UTC day as the next local day's 08:00."""
    doctor = await make_doctor(client, "Pacific/Kiritimati")
    day = date.today() + timedelta(days=3)
    nxt = day + timedelta(days=1)
    for start, end in (("08:00", "08:30"), ("23:00", "23:30")):
        await schedule_day(client, doctor, day, to=nxt, start=start, end=end, maxPerPatientPerDay=1)
    today_slots = await slot_list(client, doctor, day)
    next_slots = await slot_list(client, doctor, nxt)
    late = next(s for s in today_slots if starts(s).hour == 9)  # 23:00 local = 09:00 UTC
    early = next(s for s in today_slots if starts(s).hour == 18)  # 08:00 local, day before
    next_early = next(s for s in next_slots if starts(s).hour == 18)
    assert starts(late).date() == starts(next_early).date()  # one UTC day
    assert starts(early).date() != starts(late).date()  # two UTC days
    patient = new_id()
    assert (await book(client, late["id"], patient)).status_code == 201
    # The same UTC day, another local day: allowed.
    assert (await book(client, next_early["id"], patient)).status_code == 201
    # Another UTC day, the same local day: refused.
    problem(await book(client, early["id"], patient), 409, "daily_limit")


async def test_a_held_appointment_counts_an_expired_one_does_not(
    client: httpx.AsyncClient, clock: OffsetClock
) -> None:
    _, _, slots = await ruled_slots(
        client,
        maxPerPatientPerDay=1,
        prepaid={"amount": 1000, "currency": "EUR", "holdMinutes": 5},
    )
    patient = new_id()
    held = await book(client, slots[0]["id"], patient)
    assert held.status_code == 201 and held.json()["status"] == "HELD"
    problem(await book(client, slots[1]["id"], patient), 409, "daily_limit")
    clock.advance(timedelta(minutes=6))  # the hold ended unpaid
    again = await book_at(client, clock, slots[1]["id"], patient)
    assert again.status_code == 201, again.text


async def test_rules_are_checked_on_the_schedule(client: httpx.AsyncClient) -> None:
    doctor = await make_doctor(client)
    day = date.today() + timedelta(days=2)
    for bad in ({"minNoticeMinutes": -1}, {"maxPerPatientPerDay": 0}):
        r = await client.post(
            f"/api/doctors/{doctor}/schedules",
            headers=ADMIN,
            json={
                "from": day.isoformat(),
                "to": day.isoformat(),
                "weekdays": [1, 2, 3, 4, 5, 6, 7],
                "startTime": "08:00",
                "endTime": "09:00",
                **bad,
            },
        )
        problem(r, 422, "validation_error")
    assert await slot_list(client, doctor, day) == []


async def test_a_repeating_schedule_keeps_its_rules(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    doctor = await make_doctor(client)
    day = date.today() + timedelta(days=1)
    r = await client.post(
        f"/api/doctors/{doctor}/schedules",
        headers=ADMIN,
        json={
            "from": day.isoformat(),
            "weekdays": [1, 2, 3, 4, 5, 6, 7],
            "startTime": "08:00",
            "endTime": "09:00",
            "minNoticeMinutes": 30,
            "maxPerPatientPerDay": 3,
        },
    )
    assert r.status_code == 201, r.text
    row = await db.fetchrow(
        "SELECT min_notice_minutes, max_per_patient_day FROM doctor_schedule WHERE id = $1",
        r.json()["scheduleId"],
    )
    assert row is not None and (row[0], row[1]) == (30, 3)
    rules = await db.fetch(
        "SELECT DISTINCT min_notice_minutes, max_per_patient_day FROM time_slot"
        " WHERE doctor_id = $1",
        doctor,
    )
    assert [tuple(x) for x in rules] == [(30, 3)]


def book_nth(
    client: httpx.AsyncClient, slot_ids: list[int], patient: int, i: int
) -> Awaitable[httpx.Response]:
    return book(client, slot_ids[i], patient)


# -- the race -------------------------------------------------------------------------------


@pytest.fixture
async def roomy_client(
    base_settings: Settings, clock: OffsetClock
) -> AsyncIterator[httpx.AsyncClient]:
    """A rate limit high enough for one patient's 20 attempts at once."""
    async with app_client(base_settings.with_(appointments_booking_rate_limit=1000), clock) as c:
        yield c


async def test_twenty_bookings_of_one_patient_at_once_give_exactly_the_limit(
    roomy_client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    client = roomy_client
    for _ in range(3):  # three rounds, each on a new doctor's day
        _, _, slots = await ruled_slots(client, start="08:00", end="13:00", maxPerPatientPerDay=2)
        assert len(slots) == 20
        patient = new_id()
        results = await together(20, partial(book_nth, client, [s["id"] for s in slots], patient))
        assert codes(results) == {(201, None): 2, (409, "daily_limit"): 18}, codes(results)
        rows = await db.fetch(
            "SELECT slot_id FROM appointment WHERE patient_id = $1 AND status = 'BOOKED'",
            patient,
        )
        assert len(rows) == 2 and rows[0]["slot_id"] != rows[1]["slot_id"]
        await assert_slot_invariant(db, [s["id"] for s in slots])
