"""Staff overbooking through HTTP: a schedule's overbookLimit, POST /api/appointments
with "overbook": true by the slot's doctor or an admin (never a patient, on any
path), the seats counted apart, cancelling one, and the race of patients and
staff on one slot (ordinary bookings never exceed capacity, overbooked ones
never the limit)."""

from __future__ import annotations

import uuid
from datetime import date, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from tests.helpers.appointments import (
    assert_counters_match,
    book,
    make_doctor,
    make_overbookable,
    overbook,
    slot_list,
    wait,
)
from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.http import codes, problem, together


async def agenda_slot(
    client: httpx.AsyncClient, doctor: int, day: date, slot_id: int
) -> dict[str, Any]:
    r = await client.get(
        f"/api/doctors/{doctor}/agenda", params={"date": day.isoformat()}, headers=ADMIN
    )
    assert r.status_code == 200, r.text
    (slot,) = [s for s in r.json()["slots"] if s["id"] == slot_id]
    return dict(slot)


async def counters(db: asyncpg.Connection, slot_id: int) -> tuple[int, int]:
    row = await db.fetchrow(
        "SELECT booked_count, overbooked_count FROM time_slot WHERE id = $1", slot_id
    )
    assert row is not None
    return row["booked_count"], row["overbooked_count"]


async def test_the_slots_doctor_and_an_admin_overbook_up_to_the_limit(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    doctor, day, slots = await make_overbookable(client, capacity=1, limit=2)
    slot_id = slots[0]["id"]
    assert slots[0]["overbookedCount"] == 0
    assert (await book(client, slot_id, new_id())).status_code == 201  # the ordinary seat

    first = await overbook(client, slot_id, new_id(), auth("doctor", doctor))
    assert first.status_code == 201, first.text
    assert first.json()["overbooked"] is True and first.json()["status"] == "BOOKED"
    second = await overbook(client, slot_id, new_id(), ADMIN)
    assert second.status_code == 201, second.text
    assert second.json()["overbooked"] is True
    problem(
        await overbook(client, slot_id, new_id(), auth("doctor", doctor)), 409, "overbook_limit"
    )
    assert await assert_counters_match(db, slot_id) == (1, 2)

    # The agenda shows the overbooked seats and which appointments hold them.
    seen = await agenda_slot(client, doctor, day, slot_id)
    assert (seen["capacity"], seen["bookedCount"], seen["available"]) == (1, 1, 0)
    assert (seen["overbookLimit"], seen["overbookedCount"]) == (2, 2)
    flags = {a["id"]: a["overbooked"] for a in seen["appointments"]}
    assert flags[first.json()["id"]] and flags[second.json()["id"]]
    assert sorted(flags.values()) == [False, True, True]
    # The slot list (dropped by the overbooking) shows them too, on a slot with room.
    await overbook(client, slots[1]["id"], new_id(), ADMIN)
    listed = {s["id"]: s for s in await slot_list(client, doctor, day)}
    assert listed[slots[1]["id"]]["overbookedCount"] == 1
    assert listed[slots[1]["id"]]["bookedCount"] == 0


async def test_an_overbook_request_always_takes_an_overbooked_seat(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """Decided: staff overbooking never takes an ordinary seat, even a free one,
    so patients booking online never lose a seat to it."""
    doctor, _, slots = await make_overbookable(client, capacity=3, limit=1)
    slot_id = slots[0]["id"]
    r = await overbook(client, slot_id, new_id(), auth("doctor", doctor))
    assert r.status_code == 201 and r.json()["overbooked"] is True
    assert await assert_counters_match(db, slot_id) == (0, 1)
    for _ in range(3):
        assert (await book(client, slot_id, new_id())).status_code == 201
    problem(await book(client, slot_id, new_id()), 409, "slot_full")
    assert await assert_counters_match(db, slot_id) == (3, 1)


async def test_without_an_overbook_limit_nobody_overbooks(client: httpx.AsyncClient) -> None:
    doctor, _, slots = await make_overbookable(client, capacity=1, limit=0)
    problem(await overbook(client, slots[0]["id"], new_id(), ADMIN), 409, "overbook_limit")
    problem(
        await overbook(client, slots[0]["id"], new_id(), auth("doctor", doctor)),
        409,
        "overbook_limit",
    )


async def test_patients_never_overbook_whatever_they_send(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, _, slots = await make_overbookable(client, capacity=1, limit=3)
    slot_id = slots[0]["id"]
    holder, patient = new_id(), new_id()
    assert (await book(client, slot_id, holder)).status_code == 201
    me = auth("patient", patient)
    # For themself, with every spelling the hot path might take for its own.
    for content in (
        b'{"slotId":%d,"patientId":%d,"overbook":true}' % (slot_id, patient),
        b'{"overbook":true,"slotId":%d,"patientId":%d}' % (slot_id, patient),
    ):
        r = await client.post(
            "/api/appointments",
            content=content,
            headers={
                **me,
                "Content-Type": "application/json",
                "Idempotency-Key": "k" + str(uuid.uuid4()),
            },
        )
        problem(r, 403, "forbidden")
    problem(await overbook(client, slot_id, patient, me), 403, "forbidden")
    # Not a boolean: bad input, not a way in.
    r = await client.post(
        "/api/appointments",
        json={"slotId": slot_id, "patientId": patient, "overbook": "yes"},
        headers={**me, "Idempotency-Key": str(uuid.uuid4())},
    )
    problem(r, 422, "validation_error")
    # "overbook": false is an ordinary booking: the slot is full.
    r = await client.post(
        "/api/appointments",
        json={"slotId": slot_id, "patientId": patient, "overbook": False},
        headers={**me, "Idempotency-Key": str(uuid.uuid4())},
    )
    problem(r, 409, "slot_full")
    assert await counters(db, slot_id) == (1, 0)
    assert await db.fetchval("SELECT count(*) FROM appointment WHERE patient_id = $1", patient) == 0


async def test_only_the_slots_doctor_overbooks_and_doctors_do_not_book(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    doctor, _, slots = await make_overbookable(client, capacity=1, limit=2)
    other = await make_doctor(client)
    slot_id = slots[0]["id"]
    # Another doctor's slot does not exist for them (a 403 would tell which ids exist).
    problem(await overbook(client, slot_id, new_id(), auth("doctor", other)), 404, "slot_not_found")
    problem(await overbook(client, 2**62, new_id(), ADMIN), 404, "slot_not_found")
    # A doctor books only to overbook.
    r = await client.post(
        "/api/appointments",
        json={"slotId": slot_id, "patientId": new_id()},
        headers={**auth("doctor", doctor), "Idempotency-Key": str(uuid.uuid4())},
    )
    problem(r, 403, "forbidden")
    # The Idempotency-Key is required, as for every booking.
    r = await client.post(
        "/api/appointments",
        json={"slotId": slot_id, "patientId": new_id(), "overbook": True},
        headers=auth("doctor", doctor),
    )
    assert r.status_code == 400, r.text
    assert await counters(db, slot_id) == (0, 0)


async def test_an_overbook_replays_with_its_idempotency_key(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    doctor, _, slots = await make_overbookable(client, capacity=1, limit=2)
    headers = {**auth("doctor", doctor), "Idempotency-Key": str(uuid.uuid4())}
    body = {"slotId": slots[0]["id"], "patientId": new_id(), "overbook": True}
    first = await client.post("/api/appointments", json=body, headers=headers)
    again = await client.post("/api/appointments", json=body, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json() == again.json()
    assert await counters(db, slots[0]["id"]) == (0, 1)


async def test_cancelling_an_overbooked_appointment_frees_an_overbooked_seat(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    doctor, _, slots = await make_overbookable(client, capacity=1, limit=1)
    slot_id = slots[0]["id"]
    assert (await book(client, slot_id, new_id())).status_code == 201
    waiting = new_id()
    assert (await wait(client, slot_id, waiting)).status_code == 201
    extra_patient = new_id()
    extra = await overbook(client, slot_id, extra_patient, auth("doctor", doctor))
    assert extra.status_code == 201

    r = await client.delete(
        f"/api/appointments/{extra.json()['id']}", headers=auth("patient", extra_patient)
    )
    assert r.status_code == 200 and r.json()["status"] == "CANCELLED"
    assert r.json()["overbooked"] is True
    # The ordinary seat is still taken: the waitlist got nothing, the slot is full.
    assert await assert_counters_match(db, slot_id) == (1, 0)
    assert await db.fetchval("SELECT count(*) FROM appointment WHERE patient_id = $1", waiting) == 0
    problem(await book(client, slot_id, new_id()), 409, "slot_full")
    # The overbooked seat is free again.
    assert (await overbook(client, slot_id, new_id(), ADMIN)).status_code == 201
    assert await assert_counters_match(db, slot_id) == (1, 1)


async def test_rescheduling_an_overbooked_appointment_frees_its_overbooked_seat(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    doctor, _, slots = await make_overbookable(client, capacity=1, limit=1)
    old_slot, new_slot = slots[0]["id"], slots[2]["id"]
    assert (await book(client, old_slot, new_id())).status_code == 201
    assert (await wait(client, old_slot, new_id())).status_code == 201
    patient = new_id()
    extra = await overbook(client, old_slot, patient, auth("doctor", doctor))
    r = await client.post(
        f"/api/appointments/{extra.json()['id']}/reschedule",
        json={"slotId": new_slot},
        headers={**auth("patient", patient), "Idempotency-Key": str(uuid.uuid4())},
    )
    assert r.status_code == 200, r.text
    assert r.json()["overbooked"] is False  # an ordinary booking of the new slot
    assert await assert_counters_match(db, old_slot) == (1, 0)
    assert await assert_counters_match(db, new_slot) == (1, 0)


@pytest.mark.parametrize(("patients", "cheats", "staff", "capacity", "limit"), [(40, 10, 12, 5, 3)])
async def test_racing_patients_and_staff_respect_both_bounds(
    client: httpx.AsyncClient,
    db: asyncpg.Connection,
    patients: int,
    cheats: int,
    staff: int,
    capacity: int,
    limit: int,
) -> None:
    """Patients book, other patients send "overbook": true for themselves, and
    the doctor and an admin overbook, all released together on one slot."""
    doctor, _, slots = await make_overbookable(client, capacity=capacity, limit=limit)
    slot_id = slots[0]["id"]
    ids = [new_id() for _ in range(patients + cheats + staff)]

    async def one(i: int) -> httpx.Response:
        if i < patients:
            return await book(client, slot_id, ids[i])
        if i < patients + cheats:
            return await overbook(client, slot_id, ids[i], auth("patient", ids[i]))
        return await overbook(client, slot_id, ids[i], auth("doctor", doctor) if i % 2 else ADMIN)

    responses = await together(patients + cheats + staff, one)

    ordinary = responses[:patients]
    refused = responses[patients : patients + cheats]
    extra = responses[patients + cheats :]
    assert codes(ordinary) == {(201, None): capacity, (409, "slot_full"): patients - capacity}
    assert codes(refused) == {(403, "forbidden"): cheats}
    assert codes(extra) == {(201, None): limit, (409, "overbook_limit"): staff - limit}
    assert all(r.json()["overbooked"] is False for r in ordinary if r.status_code == 201)
    assert all(r.json()["overbooked"] is True for r in extra if r.status_code == 201)
    assert await assert_counters_match(db, slot_id) == (capacity, limit)
    cheaters = ids[patients : patients + cheats]
    assert (
        await db.fetchval(
            "SELECT count(*) FROM appointment WHERE patient_id = ANY($1::bigint[])", cheaters
        )
        == 0
    )


async def test_the_check_covers_both_counters(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """The last line of defence, whatever a code path does."""
    _, _, slots = await make_overbookable(client, capacity=1, limit=1)
    slot_id = slots[0]["id"]
    for bad in (
        "UPDATE time_slot SET overbooked_count = overbook_limit + 1 WHERE id = $1",
        "UPDATE time_slot SET overbooked_count = -1 WHERE id = $1",
        "UPDATE time_slot SET booked_count = capacity + 1 WHERE id = $1",
    ):
        with pytest.raises(asyncpg.exceptions.CheckViolationError):
            await db.execute(bad, slot_id)


async def test_a_schedules_overbook_limit_is_checked(client: httpx.AsyncClient) -> None:
    doctor = await make_doctor(client)
    day = (date.today() + timedelta(days=2)).isoformat()
    for limit in (-1, "2", 10_001, 1.5):
        r = await client.post(
            f"/api/doctors/{doctor}/schedules",
            headers=ADMIN,
            json={
                "from": day,
                "to": day,
                "weekdays": list(range(1, 8)),
                "startTime": "08:00",
                "endTime": "09:00",
                "overbookLimit": limit,
            },
        )
        problem(r, 422, "validation_error")


async def test_a_repeating_schedule_keeps_its_overbook_limit(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    doctor = await make_doctor(client)
    r = await client.post(
        f"/api/doctors/{doctor}/schedules",
        headers=ADMIN,
        json={
            "from": date.today().isoformat(),
            "weekdays": list(range(1, 8)),
            "startTime": "08:00",
            "endTime": "09:00",
            "slotMinutes": 30,
            "overbookLimit": 4,
        },
    )
    assert r.status_code == 201, r.text
    limits = await db.fetch(
        "SELECT DISTINCT overbook_limit FROM time_slot WHERE doctor_id = $1", doctor
    )
    assert [x["overbook_limit"] for x in limits] == [4]
    stored = await db.fetchval(
        "SELECT overbook_limit FROM doctor_schedule WHERE doctor_id = $1", doctor
    )
    assert stored == 4
