"""The booking window (a slot opens at 07:00 local, 14 days ahead) and slots of one
doctor that never overlap, whatever their lengths, through HTTP and in SQL."""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import asyncpg
import httpx
import pytest

from reservo.core.db.migrate import available
from reservo.core.kernel.clock import OffsetClock
from tests.helpers.appointments import book_as, make_doctor
from tests.helpers.auth import ADMIN, auth_at, new_id
from tests.helpers.databases import DatabaseAt
from tests.helpers.http import problem


async def schedule(
    client: httpx.AsyncClient,
    doctor: int,
    day: date,
    start: str,
    end: str,
    minutes: int,
    headers: dict[str, str] = ADMIN,
) -> dict[str, int]:
    r = await client.post(
        f"/api/doctors/{doctor}/schedules",
        headers=headers,
        json={
            "from": day.isoformat(),
            "to": day.isoformat(),
            "weekdays": [1, 2, 3, 4, 5, 6, 7],
            "startTime": start,
            "endTime": end,
            "slotMinutes": minutes,
        },
    )
    assert r.status_code == 201, r.text
    out: dict[str, int] = r.json()
    return out


async def test_a_slot_opens_at_seven_local_fourteen_days_ahead(
    client: httpx.AsyncClient, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    tz = ZoneInfo("Europe/Lisbon")
    doctor = await make_doctor(client, "Europe/Lisbon")
    day = date.today() + timedelta(days=20)
    await schedule(client, doctor, day, "09:00", "09:30", 15)
    rows = await db.fetch(
        "SELECT id, opens_at FROM time_slot WHERE doctor_id = $1 ORDER BY start_at", doctor
    )
    opens = datetime.combine(day - timedelta(days=14), time(7), tzinfo=tz)
    assert [r["opens_at"] for r in rows] == [opens, opens]
    slot_id, patient = rows[0]["id"], new_id()

    # Not listed and not bookable before it opens, by one second.
    listed = await client.get(
        f"/api/doctors/{doctor}/slots", params={"date": day.isoformat()}, headers=ADMIN
    )
    assert listed.status_code == 200 and listed.json() == []
    clock.advance(opens - timedelta(seconds=1) - clock.now())
    r = await book_as(client, auth_at(clock, "patient", patient), slot_id, patient)
    body = problem(r, 409, "slot_not_open")
    assert opens.astimezone(UTC).isoformat() in body["detail"]
    assert await db.fetchval("SELECT booked_count FROM time_slot WHERE id = $1", slot_id) == 0

    # From 07:00 local on, it is.
    clock.advance(timedelta(seconds=2))
    r = await book_as(client, auth_at(clock, "patient", patient), slot_id, patient)
    assert r.status_code == 201, r.text


async def test_the_slot_list_shows_a_slot_once_it_opens(
    client: httpx.AsyncClient, clock: OffsetClock
) -> None:
    doctor = await make_doctor(client, "Asia/Tokyo")
    day = date.today() + timedelta(days=30)
    await schedule(client, doctor, day, "10:00", "10:30", 30)
    opens = datetime.combine(day - timedelta(days=14), time(7), tzinfo=ZoneInfo("Asia/Tokyo"))
    clock.advance(opens - clock.now())
    listed = await client.get(
        f"/api/doctors/{doctor}/slots",
        params={"date": day.isoformat()},
        headers=auth_at(clock, "patient", new_id()),
    )
    assert listed.status_code == 200
    assert [s["startAt"] for s in listed.json()] == [
        datetime.combine(day, time(1), tzinfo=UTC).isoformat()
    ]


async def test_slots_of_different_lengths_never_overlap(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    doctor = await make_doctor(client, "UTC")
    day = date.today() + timedelta(days=3)
    assert await schedule(client, doctor, day, "08:00", "09:00", 15) == {
        "created": 4,
        "skipped": 0,
    }
    # 20-minute slots over the same hour: every one of them overlaps a 15-minute
    # slot, so all are skipped; the next hour is free and is created.
    assert await schedule(client, doctor, day, "08:00", "10:00", 20) == {
        "created": 3,
        "skipped": 3,
    }
    rows = await db.fetch(
        "SELECT start_at, end_at FROM time_slot WHERE doctor_id = $1 ORDER BY start_at", doctor
    )
    for a, b in itertools.pairwise(rows):
        assert a["end_at"] <= b["start_at"]
    assert [r["end_at"] - r["start_at"] for r in rows] == [timedelta(minutes=15)] * 4 + [
        timedelta(minutes=20)
    ] * 3
    # The database itself refuses an overlapping slot, whoever writes it.
    with pytest.raises(asyncpg.ExclusionViolationError, match="ex_doctor_slot_overlap"):
        await db.execute(
            """INSERT INTO time_slot (doctor_id, start_at, end_at, capacity, opens_at)
               VALUES ($1, $2, $3, 1, $2)""",
            doctor,
            rows[0]["start_at"] + timedelta(minutes=5),
            rows[0]["start_at"] + timedelta(minutes=25),
        )


# -- the migration and existing overlapping data -----------------------------------------


def _mig_0018() -> str:
    return next(m.sql for m in available() if m.version == 18)


async def _old_slots(conn: asyncpg.Connection) -> tuple[int, list[int]]:
    """Two overlapping schedules as the first release could write them: 15-minute
    slots 08:00-09:00 and 20-minute slots 08:00-09:00 (the first one shares 08:00
    and was skipped), plus one far away."""
    doctor = await conn.fetchval(
        "INSERT INTO doctor (name, timezone) VALUES ('old', 'UTC') RETURNING id"
    )
    base = datetime(2030, 1, 7, 8, tzinfo=UTC)
    spans = [(0, 15), (15, 30), (30, 45), (45, 60), (20, 40), (40, 60), (300, 320)]
    ids = [
        await conn.fetchval(
            """INSERT INTO time_slot (doctor_id, start_at, end_at, capacity)
               VALUES ($1, $2, $3, 1) RETURNING id""",
            doctor,
            base + timedelta(minutes=a),
            base + timedelta(minutes=b),
        )
        for a, b in spans
    ]
    return doctor, ids


async def test_the_migration_drops_empty_overlapping_slots_and_backfills_opens_at(
    database_at: DatabaseAt,
) -> None:
    conn = await asyncpg.connect(await database_at(17))
    try:
        _, ids = await _old_slots(conn)
        async with conn.transaction():
            await conn.execute(_mig_0018())
        left = await conn.fetch("SELECT id, start_at, opens_at FROM time_slot ORDER BY start_at")
        # The 20-minute ones (08:20, 08:40) overlapped the kept 15-minute ones.
        assert [r["id"] for r in left] == [ids[0], ids[1], ids[2], ids[3], ids[6]]
        assert all(
            r["opens_at"]
            == datetime.combine(r["start_at"].date() - timedelta(days=14), time(7), UTC)
            for r in left
        )
    finally:
        await conn.close()


async def test_the_migration_stops_when_overlapping_slots_hold_appointments(
    database_at: DatabaseAt,
) -> None:
    conn = await asyncpg.connect(await database_at(17))
    try:
        _, ids = await _old_slots(conn)
        booked = ids[4]  # the 08:20-08:40 slot overlaps kept ones and was booked
        await conn.execute(
            """INSERT INTO appointment (slot_id, patient_id, status, period, created_at)
               SELECT id, 7, 'BOOKED', tstzrange(start_at, end_at), now()
                 FROM time_slot WHERE id = $1""",
            booked,
        )
        with pytest.raises(asyncpg.RaiseError, match="overlapping slot"):
            async with conn.transaction():
                await conn.execute(_mig_0018())
        # Nothing changed: the operator resolves it, then migrates again.
        assert await conn.fetchval("SELECT count(*) FROM time_slot") == len(ids)
    finally:
        await conn.close()
