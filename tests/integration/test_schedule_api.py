"""Schedules and the slot list through HTTP: local time zones (DST included), local
dates, visibility of full and past slots, and what cancelling gives back."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg
import httpx
import pytest

from reservo.core.http.auth import mint_token
from reservo.core.kernel.clock import OffsetClock
from tests.helpers.appointments import book, make_doctor, make_slots
from tests.helpers.auth import ADMIN, JWT_SECRET, auth, new_id

ALL_WEEK = [1, 2, 3, 4, 5, 6, 7]


def next_change(tz: ZoneInfo, forward: bool) -> date:
    """The next local date (at least two days away) on which the zone's offset
    jumps forward (spring) or back (fall)."""
    day = date.today() + timedelta(days=2)
    for _ in range(800):
        before = datetime.combine(day - timedelta(days=1), time(12), tzinfo=tz).utcoffset()
        after = datetime.combine(day, time(12), tzinfo=tz).utcoffset()
        assert before is not None and after is not None
        if (after > before) if forward else (after < before):
            return day
        day += timedelta(days=1)
    raise AssertionError(f"{tz} has no DST change ahead")


def iso(instant: datetime) -> datetime:
    return instant.astimezone(UTC)


def starts(slots: list[dict[str, Any]]) -> list[datetime]:
    return [iso(datetime.fromisoformat(s["startAt"])) for s in slots]


async def schedule(
    client: httpx.AsyncClient,
    doctor: int,
    first: date,
    last: date,
    start: str,
    end: str,
    minutes: int = 15,
    capacity: int = 1,
    weekdays: list[int] = ALL_WEEK,
    headers: dict[str, str] = ADMIN,
) -> dict[str, int]:
    r = await client.post(
        f"/api/doctors/{doctor}/schedules",
        headers=headers,
        json={
            "from": first.isoformat(),
            "to": last.isoformat(),
            "weekdays": weekdays,
            "startTime": start,
            "endTime": end,
            "slotMinutes": minutes,
            "capacity": capacity,
        },
    )
    assert r.status_code == 201, r.text
    out: dict[str, int] = r.json()
    return out


async def list_slots(
    client: httpx.AsyncClient, doctor: int, day: date, headers: dict[str, str] = ADMIN
) -> list[dict[str, Any]]:
    r = await client.get(
        f"/api/doctors/{doctor}/slots", params={"date": day.isoformat()}, headers=headers
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    slots: list[dict[str, Any]] = r.json()
    return slots


def auth_at(clock: OffsetClock, role: str, sub: int) -> dict[str, str]:
    tok = mint_token(JWT_SECRET, role, sub, timedelta(hours=1), clock.now())
    return {"Authorization": f"Bearer {tok}"}


def move_clock_before(clock: OffsetClock, day: date) -> dict[str, str]:
    """Move the server's clock to noon (UTC) two days before ``day``, inside the
    booking window, so ``day``'s slots are listed; an admin token valid then."""
    target = datetime.combine(day - timedelta(days=2), time(12), tzinfo=UTC)
    clock.advance(target - clock.now())
    return auth_at(clock, "admin", 1)


# -- schedules across DST changes ------------------------------------------------------


@pytest.mark.parametrize(
    ("zone", "forward", "count"),
    [
        ("Europe/Lisbon", True, 20),
        ("Europe/Lisbon", False, 28),
        ("America/New_York", True, 20),
        ("America/New_York", False, 28),
    ],
    ids=["lisbon-spring", "lisbon-fall", "new-york-spring", "new-york-fall"],
)
async def test_a_night_schedule_across_a_dst_change_lands_on_the_right_instants(
    client: httpx.AsyncClient,
    db: asyncpg.Connection,
    clock: OffsetClock,
    zone: str,
    forward: bool,
    count: int,
) -> None:
    tz = ZoneInfo(zone)
    day = next_change(tz, forward)
    doctor = await make_doctor(client, zone)
    # 00:00-06:00 local on the day before, the day of, and the day after the change.
    first = await schedule(
        client, doctor, day - timedelta(days=1), day + timedelta(days=1), "00:00", "06:00"
    )
    total = 24 + count + 24
    assert first == {"created": total, "skipped": 0}
    # Re-running it creates nothing twice.
    again = await schedule(
        client, doctor, day - timedelta(days=1), day + timedelta(days=1), "00:00", "06:00"
    )
    assert again == {"created": 0, "skipped": total}
    rows = await db.fetch(
        "SELECT start_at, end_at FROM time_slot WHERE doctor_id = $1 ORDER BY start_at", doctor
    )
    assert len(rows) == total == len({r["start_at"] for r in rows})

    # The change may be months ahead, outside the booking window: list it from
    # two days before (the window is a second-release rule).
    listed = await list_slots(client, doctor, day, headers=move_clock_before(clock, day))
    midnight = datetime.combine(day, time(0), tzinfo=tz).astimezone(UTC)
    expected = [midnight + timedelta(minutes=15 * i) for i in range(count)]
    assert starts(listed) == expected
    # The last slot ends at local 06:00 of the new offset.
    last_end = datetime.fromisoformat(listed[-1]["endAt"]).astimezone(tz)
    assert (last_end.date(), last_end.time()) == (day, time(6))
    for s in listed:
        assert datetime.fromisoformat(s["endAt"]) - datetime.fromisoformat(
            s["startAt"]
        ) == timedelta(minutes=15)


async def test_lisbon_office_hours_follow_the_offset_of_each_day(
    client: httpx.AsyncClient, clock: OffsetClock
) -> None:
    tz = ZoneInfo("Europe/Lisbon")
    day = next_change(tz, forward=True)
    doctor = await make_doctor(client, "Europe/Lisbon")
    prev = day - timedelta(days=1)
    created = await schedule(client, doctor, prev, day, "08:00", "09:00", minutes=30)
    assert created == {"created": 4, "skipped": 0}
    admin = move_clock_before(clock, prev)  # inside the booking window of both days
    # 08:00 WET is 08:00Z; the next day 08:00 WEST is 07:00Z.
    assert starts(await list_slots(client, doctor, prev, headers=admin)) == [
        datetime.combine(prev, time(8), tzinfo=UTC),
        datetime.combine(prev, time(8, 30), tzinfo=UTC),
    ]
    assert starts(await list_slots(client, doctor, day, headers=admin)) == [
        datetime.combine(day, time(7), tzinfo=UTC),
        datetime.combine(day, time(7, 30), tzinfo=UTC),
    ]


async def test_sao_paulo_schedule_is_three_hours_behind_utc_and_listed_by_local_date(
    client: httpx.AsyncClient,
) -> None:
    doctor = await make_doctor(client, "America/Sao_Paulo")
    day = date.today() + timedelta(days=3)
    nxt = day + timedelta(days=1)
    assert await schedule(client, doctor, day, nxt, "08:00", "10:00", minutes=30) == {
        "created": 8,
        "skipped": 0,
    }
    # Evening hours: local 22:00 is 01:00Z of the next UTC date.
    assert (await schedule(client, doctor, day, nxt, "20:00", "23:00", minutes=60))["created"] == 6

    def at(d: date, h: int, m: int = 0) -> datetime:
        return datetime.combine(d, time(h, m), tzinfo=UTC)

    listed = await list_slots(client, doctor, day, headers=auth("patient", new_id()))
    assert starts(listed) == [
        at(day, 11),
        at(day, 11, 30),
        at(day, 12),
        at(day, 12, 30),
        at(day, 23),
        at(nxt, 0),
        at(nxt, 1),
    ]
    for s in listed:
        assert set(s) == {
            "id",
            "doctorId",
            "startAt",
            "endAt",
            "capacity",
            "bookedCount",
            "available",
            "overbookedCount",
        }
        assert s["doctorId"] == doctor
        assert (s["capacity"], s["bookedCount"], s["available"]) == (1, 0, 1)
        offset = datetime.fromisoformat(s["startAt"]).astimezone(ZoneInfo("America/Sao_Paulo"))
        assert offset.date() == day
    # The next local date starts at its own 08:00 (11:00Z), not with day's evening slots.
    assert starts(await list_slots(client, doctor, nxt))[0] == at(nxt, 11)


async def test_a_schedule_of_exactly_92_days_with_chosen_weekdays(
    client: httpx.AsyncClient,
) -> None:
    doctor = await make_doctor(client, "UTC")
    first = date.today() + timedelta(days=1)
    last = first + timedelta(days=91)
    out = await schedule(client, doctor, first, last, "12:00", "12:15", weekdays=[1, 3])
    expected = sum(1 for i in range(92) if (first + timedelta(days=i)).isoweekday() in (1, 3))
    assert out == {"created": expected, "skipped": 0}
    # A partly overlapping re-run skips only what exists.
    out = await schedule(client, doctor, first, last, "12:00", "12:30", weekdays=[1, 3])
    assert out == {"created": expected, "skipped": expected}


async def test_a_doctor_may_write_their_own_schedule(client: httpx.AsyncClient) -> None:
    doctor = await make_doctor(client, "Europe/Lisbon")
    day = date.today() + timedelta(days=4)
    out = await schedule(
        client, doctor, day, day, "09:00", "10:00", minutes=20, headers=auth("doctor", doctor)
    )
    assert out == {"created": 3, "skipped": 0}


# -- what the list shows -----------------------------------------------------------------


async def test_the_list_holds_only_future_slots(
    client: httpx.AsyncClient, clock: OffsetClock
) -> None:
    doctor, slots = await make_slots(client, capacity=1, days_ahead=2)
    assert len(slots) == 4
    day = datetime.fromisoformat(slots[0]["startAt"]).astimezone(ZoneInfo("Europe/Lisbon")).date()
    # Move the server's clock to just after the second slot started.
    target = datetime.fromisoformat(slots[1]["startAt"]) + timedelta(seconds=1)
    clock.advance(target - clock.now())
    listed = await list_slots(client, doctor, day, headers=auth_at(clock, "patient", new_id()))
    assert [s["id"] for s in listed] == [slots[2]["id"], slots[3]["id"]]


async def test_a_full_slot_leaves_the_list_at_once_and_comes_back_on_cancel(
    client: httpx.AsyncClient,
) -> None:
    doctor, slots = await make_slots(client, capacity=1)
    day = datetime.fromisoformat(slots[0]["startAt"]).astimezone(ZoneInfo("Europe/Lisbon")).date()
    target = slots[0]["id"]
    assert target in [s["id"] for s in await list_slots(client, doctor, day)]  # cached now
    patient = new_id()
    r = await book(client, target, patient)
    assert r.status_code == 201
    # No waiting for the cache to expire: the booking invalidated it.
    after = await list_slots(client, doctor, day)
    assert target not in [s["id"] for s in after]
    assert len(after) == len(slots) - 1
    cancel = await client.delete(
        f"/api/appointments/{r.json()['id']}", headers=auth("patient", patient)
    )
    assert cancel.status_code == 200
    back = {s["id"]: s for s in await list_slots(client, doctor, day)}
    assert back[target]["bookedCount"] == 0 and back[target]["available"] == 1


async def test_a_partly_booked_slot_shows_what_is_left(client: httpx.AsyncClient) -> None:
    doctor, slots = await make_slots(client, capacity=3)
    day = datetime.fromisoformat(slots[0]["startAt"]).astimezone(ZoneInfo("Europe/Lisbon")).date()
    await list_slots(client, doctor, day)
    for _ in range(2):
        assert (await book(client, slots[0]["id"], new_id())).status_code == 201
    first = (await list_slots(client, doctor, day))[0]
    assert (first["id"], first["capacity"], first["bookedCount"], first["available"]) == (
        slots[0]["id"],
        3,
        2,
        1,
    )


async def test_an_empty_day_and_a_day_without_schedule_are_empty_lists(
    client: httpx.AsyncClient,
) -> None:
    doctor = await make_doctor(client, "Asia/Tokyo")
    assert await list_slots(client, doctor, date.today() + timedelta(days=10)) == []
    assert await list_slots(client, doctor, date(2001, 1, 1)) == []  # past dates: nothing


# -- cancelling ------------------------------------------------------------------------------


async def test_cancelling_twice_returns_200_and_frees_the_capacity_once(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client, capacity=2)
    slot_id, keeper, patient = slots[0]["id"], new_id(), new_id()
    assert (await book(client, slot_id, keeper)).status_code == 201
    r = await book(client, slot_id, patient)
    appt = r.json()
    bodies = []
    for _ in range(2):
        c = await client.delete(f"/api/appointments/{appt['id']}", headers=auth("patient", patient))
        assert c.status_code == 200
        bodies.append(c.json())
    assert bodies[0]["status"] == bodies[1]["status"] == "CANCELLED"
    assert {k: v for k, v in bodies[0].items() if k != "status"} == {
        k: v for k, v in appt.items() if k != "status"
    }
    assert bodies[1] == bodies[0]
    assert await db.fetchval("SELECT booked_count FROM time_slot WHERE id = $1", slot_id) == 1
    got = await client.get(f"/api/appointments/{appt['id']}", headers=auth("patient", patient))
    assert got.status_code == 200 and got.json()["status"] == "CANCELLED"


async def test_a_cancelled_appointment_lets_the_patient_rebook_the_same_slot(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client, capacity=1)
    slot_id, patient = slots[0]["id"], new_id()
    first = await book(client, slot_id, patient)
    assert first.status_code == 201
    c = await client.delete(
        f"/api/appointments/{first.json()['id']}", headers=auth("patient", patient)
    )
    assert c.status_code == 200
    again = await book(client, slot_id, patient)
    assert again.status_code == 201, again.text
    assert again.json()["id"] != first.json()["id"]
    rows = await db.fetch(
        "SELECT status FROM appointment WHERE patient_id = $1 ORDER BY id", patient
    )
    assert [r["status"] for r in rows] == ["CANCELLED", "BOOKED"]
    assert await db.fetchval("SELECT booked_count FROM time_slot WHERE id = $1", slot_id) == 1


async def test_cancel_clears_the_full_mark_so_another_patient_books_at_once(
    client: httpx.AsyncClient,
) -> None:
    _, slots = await make_slots(client, capacity=1)
    slot_id, holder, waiting = slots[0]["id"], new_id(), new_id()
    r = await book(client, slot_id, holder)
    assert r.status_code == 201
    # The slot is known full (this refusal comes from the Redis mark, set for 30 s).
    assert (await book(client, slot_id, waiting)).json()["code"] == "slot_full"
    c = await client.delete(f"/api/appointments/{r.json()['id']}", headers=ADMIN)
    assert c.status_code == 200
    # Immediately bookable, long before the mark would have expired on its own.
    got = await book(client, slot_id, waiting)
    assert got.status_code == 201, got.text


async def test_owner_and_admin_read_an_appointment(client: httpx.AsyncClient) -> None:
    _, slots = await make_slots(client)
    patient = new_id()
    made = await book(client, slots[0]["id"], patient)
    appt = made.json()
    assert set(appt) == {
        *("id", "slotId", "patientId", "status", "startAt", "endAt", "createdAt", "overbooked")
    }
    assert appt["overbooked"] is False
    assert (appt["slotId"], appt["patientId"], appt["status"]) == (
        slots[0]["id"],
        patient,
        "BOOKED",
    )
    # Same instants (the two bodies may spell UTC as "Z" or "+00:00").
    for field in ("startAt", "endAt"):
        assert datetime.fromisoformat(appt[field]) == datetime.fromisoformat(slots[0][field])
    for headers in (auth("patient", patient), ADMIN):
        r = await client.get(f"/api/appointments/{appt['id']}", headers=headers)
        assert r.status_code == 200 and r.json() == appt
