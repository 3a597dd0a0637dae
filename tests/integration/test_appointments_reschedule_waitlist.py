"""Reschedule (atomic: the new booking and the old cancellation commit together)
and the waitlist (a freed seat goes to the first waiting patient still free, in
the freeing transaction), through HTTP: each success, error code and race."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from reservo.appointments import events
from reservo.core.kernel.clock import OffsetClock
from tests.helpers.appointments import (
    assert_slot_invariant,
    book,
    make_doctor,
    make_slots,
    reschedule,
    wait,
)
from tests.helpers.auth import ADMIN, auth, auth_at, new_id
from tests.helpers.http import codes, problem, together

FAR = 2**62


async def booked(db: asyncpg.Connection, slot_id: int) -> set[int]:
    rows = await db.fetch(
        "SELECT patient_id FROM appointment WHERE slot_id = $1 AND status = 'BOOKED'", slot_id
    )
    return {r["patient_id"] for r in rows}


async def topics(db: asyncpg.Connection, key: str) -> list[str]:
    rows = await db.fetch("SELECT topic FROM outbox WHERE key = $1 ORDER BY id", key)
    return [r["topic"] for r in rows]


# -- reschedule ------------------------------------------------------------------------------


async def test_reschedule_moves_the_booking_atomically(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client, capacity=1)
    patient = new_id()
    old = (await book(client, slots[0]["id"], patient)).json()
    me = auth("patient", patient)
    idem = str(uuid.uuid4())
    r = await reschedule(client, old["id"], slots[2]["id"], me, idem)
    assert r.status_code == 200, r.text
    new = r.json()
    assert new["rescheduledFrom"] == old["id"] and new["id"] != old["id"]
    assert (new["slotId"], new["patientId"], new["status"]) == (slots[2]["id"], patient, "BOOKED")
    assert datetime.fromisoformat(new["startAt"]) == datetime.fromisoformat(slots[2]["startAt"])
    got = await client.get(f"/api/appointments/{old['id']}", headers=me)
    assert got.json()["status"] == "CANCELLED"
    await assert_slot_invariant(db, [slots[0]["id"], slots[2]["id"]])
    assert await booked(db, slots[0]["id"]) == set()
    assert await booked(db, slots[2]["id"]) == {patient}
    # One appointment's life, one key (its first appointment's): the move is
    # ordered after the booking on the same partition.
    chain = f"appointment:{old['id']}"
    assert await topics(db, chain) == [events.BOOKED, events.RESCHEDULED]
    assert await topics(db, f"appointment:{new['id']}") == []
    # A retry with the same key replays the answer and moves nothing again.
    again = await reschedule(client, old["id"], slots[2]["id"], me, idem)
    assert again.status_code == 200 and again.json() == new
    # An admin may move it too (adjacent slot: the old one no longer blocks).
    moved = await reschedule(client, new["id"], slots[3]["id"], ADMIN)
    assert moved.status_code == 200 and moved.json()["rescheduledFrom"] == new["id"]
    cancelled = await client.delete(f"/api/appointments/{moved.json()['id']}", headers=me)
    assert cancelled.status_code == 200, cancelled.text
    assert await topics(db, chain) == [
        events.BOOKED,
        events.RESCHEDULED,
        events.RESCHEDULED,
        events.CANCELLED,
    ]


async def test_a_refused_reschedule_changes_nothing(
    client: httpx.AsyncClient, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    doctor, slots = await make_slots(client, capacity=1)
    patient, other = new_id(), new_id()
    me = auth("patient", patient)
    old = (await book(client, slots[0]["id"], patient)).json()
    assert (await book(client, slots[1]["id"], other)).status_code == 201
    problem(await reschedule(client, old["id"], slots[1]["id"], me), 409, "slot_full")
    problem(await reschedule(client, old["id"], FAR, me), 404, "slot_not_found")
    problem(await reschedule(client, old["id"], slots[0]["id"], me), 409, "already_booked")

    # patient_busy: the patient holds another booking (another doctor) at that time.
    _, others = await make_slots(client, capacity=1)
    assert (await book(client, others[3]["id"], patient)).status_code == 201
    problem(await reschedule(client, old["id"], slots[3]["id"], me), 409, "patient_busy")

    # slot_not_open: a slot beyond the booking window.
    far_day = (clock.now() + timedelta(days=30)).date()
    r = await client.post(
        f"/api/doctors/{doctor}/schedules",
        headers=ADMIN,
        json={
            "from": far_day.isoformat(),
            "to": far_day.isoformat(),
            "weekdays": [1, 2, 3, 4, 5, 6, 7],
            "startTime": "08:00",
            "endTime": "08:15",
        },
    )
    assert r.status_code == 201
    far = await db.fetchval(
        "SELECT id FROM time_slot WHERE doctor_id = $1 ORDER BY start_at DESC LIMIT 1", doctor
    )
    problem(await reschedule(client, old["id"], far, me), 409, "slot_not_open")

    # Nothing of it moved the old booking.
    assert (await client.get(f"/api/appointments/{old['id']}", headers=me)).json()[
        "status"
    ] == "BOOKED"
    await assert_slot_invariant(db, [s["id"] for s in slots])

    # slot_in_past: the new slot started (the server's clock moved past it).
    target = slots[2]
    _, later = await make_slots(client, capacity=1, days_ahead=3)
    late = (await book(client, later[0]["id"], patient)).json()
    # Just after the target started, before the booking's own slot (a day later) does:
    # a fixed offset would land past both when the suite runs late in the day.
    clock.advance(datetime.fromisoformat(target["startAt"]) + timedelta(minutes=1) - clock.now())
    r = await reschedule(client, late["id"], target["id"], auth_at(clock, "patient", patient))
    problem(r, 409, "slot_in_past")


async def _blocking_me(db: asyncpg.Connection) -> None:
    """Until another backend waits for a lock this connection holds."""
    for _ in range(500):
        if await db.fetchval(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted"
            " AND pg_backend_pid() = ANY (pg_blocking_pids(pid)))"
        ):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("nobody waits for this connection's locks")


async def test_a_reschedule_deadlocked_on_every_try_is_503_contention_and_not_stored(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """A transaction that holds the new slot's row and then wants the old
    appointment's (the reverse of the reschedule's lock order) deadlocks each of
    its tries: the answer is a passing 503 (not the Idempotency-Key's 409
    request_in_progress), nothing is stored under the key, and the retry runs."""
    _, slots = await make_slots(client, capacity=1)
    patient = new_id()
    me, idem = auth("patient", patient), str(uuid.uuid4())
    old = (await book(client, slots[0]["id"], patient)).json()
    # The request's backend (deadlock_timeout 1 s) finds each deadlock first and
    # is the one PostgreSQL aborts.
    await db.execute("SET deadlock_timeout = '1min'")
    async with db.transaction():
        await db.execute("SELECT 1 FROM time_slot WHERE id = $1 FOR UPDATE", slots[2]["id"])
        moving = asyncio.create_task(reschedule(client, old["id"], slots[2]["id"], me, idem))
        for _ in range(3):  # _DEADLOCK_RETRIES
            await _blocking_me(db)  # the try holds the appointment, waits for the slot
            await db.execute("SAVEPOINT crossing")
            await db.execute("SELECT 1 FROM appointment WHERE id = $1 FOR UPDATE", old["id"])
            await db.execute("ROLLBACK TO SAVEPOINT crossing")
        r = await asyncio.wait_for(moving, 30)
    problem(r, 503, "contention")
    assert r.headers["retry-after"] == "1"
    got = await client.get(f"/api/appointments/{old['id']}", headers=me)
    assert got.json()["status"] == "BOOKED"
    retried = await reschedule(client, old["id"], slots[2]["id"], me, idem)
    assert retried.status_code == 200, retried.text
    assert retried.json()["rescheduledFrom"] == old["id"]


async def test_only_a_booked_future_appointment_is_reschedulable(
    client: httpx.AsyncClient,
) -> None:
    _, slots = await make_slots(client, capacity=1)
    patient = new_id()
    me = auth("patient", patient)
    appt = (await book(client, slots[0]["id"], patient)).json()
    await client.delete(f"/api/appointments/{appt['id']}", headers=me)
    problem(await reschedule(client, appt["id"], slots[1]["id"], me), 409, "not_reschedulable")
    problem(await reschedule(client, FAR, slots[1]["id"], me), 404, "appointment_not_found")
    mine = (await book(client, slots[2]["id"], patient)).json()
    problem(  # another patient's: as if it did not exist
        await reschedule(client, mine["id"], slots[1]["id"], auth("patient", new_id())),
        404,
        "appointment_not_found",
    )
    problem(
        await reschedule(client, mine["id"], slots[1]["id"], auth("doctor", 1)), 403, "forbidden"
    )
    r = await client.post(
        f"/api/appointments/{mine['id']}/reschedule", json={"slotId": slots[1]["id"]}, headers=me
    )
    problem(r, 400, "idempotency_key_required")
    for body in ({}, {"slotId": "1"}, {"slotId": 0}, {"slotId": 1, "extra": 1}):
        r = await client.post(
            f"/api/appointments/{mine['id']}/reschedule",
            json=body,
            headers={**me, "Idempotency-Key": str(uuid.uuid4())},
        )
        problem(r, 422, "validation_error")


@pytest.fixture
def many_patients() -> list[int]:
    return [new_id() for _ in range(24)]


async def test_racing_reschedules_and_bookings_keep_both_slots_exact(
    client: httpx.AsyncClient, db: asyncpg.Connection, many_patients: list[int]
) -> None:
    """Half the patients hold a seat in slot A and move to slot B, half hold a seat
    in B and move to A, while newcomers book A and B: all released together."""
    _, slots = await make_slots(client, capacity=6, start="08:00", end="08:30")
    a, b = slots[0]["id"], slots[1]["id"]
    movers = many_patients[:8]
    holdings = {}
    for i, p in enumerate(movers):
        r = await book(client, a if i % 2 == 0 else b, p)
        assert r.status_code == 201, r.text
        holdings[p] = r.json()["id"]
    newcomers = many_patients[8:]

    async def go(i: int) -> httpx.Response:
        if i < len(movers):
            p = movers[i]
            return await reschedule(client, holdings[p], b if i % 2 == 0 else a, auth("patient", p))
        p = newcomers[i - len(movers)]
        return await book(client, a if i % 2 == 0 else b, p)

    responses = await together(len(movers) + len(newcomers), go)
    assert set(codes(responses)) <= {(200, None), (201, None), (409, "slot_full")}, [
        r.text for r in responses if r.status_code >= 400
    ]
    rows = await assert_slot_invariant(db, [a, b])
    assert sum(r["booked_count"] for r in rows) <= 12
    # Every mover holds exactly one BOOKED appointment (moved or not); nobody twice.
    for p in movers:
        n = await db.fetchval(
            "SELECT count(*) FROM appointment WHERE patient_id = $1 AND status = 'BOOKED'", p
        )
        assert n == 1, p
    dupes = await db.fetchval(
        """SELECT count(*) FROM (SELECT patient_id FROM appointment
             WHERE slot_id = ANY($1::bigint[]) AND status = 'BOOKED'
             GROUP BY patient_id HAVING count(*) > 1) d""",
        [a, b],
    )
    assert dupes == 0


# -- waitlist --------------------------------------------------------------------------------


async def test_a_freed_seat_goes_to_the_first_free_waiting_patient(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client, capacity=1)
    slot = slots[1]["id"]
    holder, busy, second, third = new_id(), new_id(), new_id(), new_id()
    held = (await book(client, slot, holder)).json()
    for pos, p in enumerate((busy, second, third), 1):
        r = await wait(client, slot, p)
        assert r.status_code == 201, r.text
        assert r.json() == {"slotId": slot, "patientId": p, "position": pos}
    # The first in line became busy at that time (another doctor, same hour).
    _, others = await make_slots(client, capacity=1)
    assert (await book(client, others[1]["id"], busy)).status_code == 201

    c = await client.delete(f"/api/appointments/{held['id']}", headers=auth("patient", holder))
    assert c.status_code == 200
    assert await booked(db, slot) == {second}
    await assert_slot_invariant(db, [slot])
    assert await db.fetchval(
        "SELECT array_agg(patient_id ORDER BY id) FROM waitlist_entry WHERE slot_id = $1", slot
    ) == [third]
    won = await db.fetchval(
        "SELECT id FROM appointment WHERE slot_id = $1 AND patient_id = $2", slot, second
    )
    assert await topics(db, f"appointment:{won}") == [events.WAITLIST_BOOKED]
    skipped = await db.fetch(
        "SELECT payload FROM outbox WHERE key = $1 AND topic = $2",
        f"slot:{slot}",
        events.WAITLIST_SKIPPED,
    )
    assert [orjson.loads(r["payload"])["patientId"] for r in skipped] == [busy]
    # The winner sees it in their list; the next freed seat goes to the third.
    mine = await client.get(f"/api/patients/{second}/appointments", headers=auth("patient", second))
    assert [a["id"] for a in mine.json()["items"]] == [won]
    await client.delete(f"/api/appointments/{won}", headers=auth("patient", second))
    assert await booked(db, slot) == {third}


async def test_rescheduling_away_gives_the_seat_to_the_waitlist(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client, capacity=1)
    holder, waiting = new_id(), new_id()
    held = (await book(client, slots[0]["id"], holder)).json()
    assert (await wait(client, slots[0]["id"], waiting)).status_code == 201
    r = await reschedule(client, held["id"], slots[2]["id"], auth("patient", holder))
    assert r.status_code == 200, r.text
    assert await booked(db, slots[0]["id"]) == {waiting}
    assert await booked(db, slots[2]["id"]) == {holder}
    await assert_slot_invariant(db, [slots[0]["id"], slots[2]["id"]])


async def test_waitlist_errors(
    client: httpx.AsyncClient, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    _, slots = await make_slots(client, capacity=1)
    full, free = slots[0]["id"], slots[1]["id"]
    holder, patient = new_id(), new_id()
    assert (await book(client, full, holder)).status_code == 201
    problem(await wait(client, free, patient), 409, "slot_available")
    problem(await wait(client, FAR, patient), 404, "slot_not_found")
    problem(await wait(client, full, holder), 409, "already_booked")
    assert (await wait(client, full, patient, ADMIN)).status_code == 201
    problem(await wait(client, full, patient), 409, "already_waiting")
    problem(await wait(client, full, patient, auth("patient", new_id())), 403, "forbidden")
    problem(await wait(client, full, patient, auth("doctor", patient)), 403, "forbidden")
    for body in ({}, {"patientId": "1"}, {"patientId": 0}):
        r = await client.post(f"/api/slots/{full}/waitlist", json=body, headers=ADMIN)
        problem(r, 422, "validation_error")

    # Leaving: 204, then 404; others may not remove a patient.
    url = f"/api/slots/{full}/waitlist/{patient}"
    problem(await client.delete(url, headers=auth("patient", new_id())), 403, "forbidden")
    r = await client.delete(url, headers=auth("patient", patient))
    assert r.status_code == 204 and r.content == b""
    problem(await client.delete(url, headers=auth("patient", patient)), 404, "not_waiting")
    problem(
        await client.delete(f"/api/slots/{FAR}/waitlist/{patient}", headers=ADMIN),
        404,
        "slot_not_found",
    )
    assert await db.fetchval("SELECT count(*) FROM waitlist_entry WHERE slot_id = $1", full) == 0

    # A started slot has no waitlist.
    clock.advance(timedelta(days=3))
    r = await wait(client, full, new_id(), auth_at(clock, "admin", 1))
    problem(r, 409, "slot_in_past")


async def test_a_not_yet_open_slot_has_no_waitlist(
    client: httpx.AsyncClient, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    doctor = await make_doctor(client, "UTC")
    day = (clock.now() + timedelta(days=20)).date().isoformat()
    r = await client.post(
        f"/api/doctors/{doctor}/schedules",
        headers=ADMIN,
        json={
            "from": day,
            "to": day,
            "weekdays": [1, 2, 3, 4, 5, 6, 7],
            "startTime": "08:00",
            "endTime": "08:15",
        },
    )
    assert r.status_code == 201
    slot = await db.fetchval("SELECT id FROM time_slot WHERE doctor_id = $1", doctor)
    problem(await wait(client, slot, new_id(), ADMIN), 409, "slot_not_open")


@pytest.mark.parametrize(("waiting", "capacity", "cancels"), [(12, 4, 4), (6, 5, 5)])
async def test_racing_cancels_give_each_freed_seat_to_exactly_one_waiting_patient(
    client: httpx.AsyncClient,
    db: asyncpg.Connection,
    waiting: int,
    capacity: int,
    cancels: int,
) -> None:
    _, slots = await make_slots(client, capacity=capacity)
    slot = slots[0]["id"]
    holders = [new_id() for _ in range(capacity)]
    held = {}
    for p in holders:
        r = await book(client, slot, p)
        held[p] = r.json()["id"]
    line = [new_id() for _ in range(waiting)]
    for p in line:
        assert (await wait(client, slot, p)).status_code == 201

    def go(i: int) -> Any:
        p = holders[i]
        return client.delete(f"/api/appointments/{held[p]}", headers=auth("patient", p))

    responses = await together(cancels, go)
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    (row,) = await assert_slot_invariant(db, [slot])
    assert row["booked_count"] == capacity  # every freed seat was taken again
    now_booked = await booked(db, slot)
    winners = now_booked - set(holders)
    # The first `cancels` of the line got them, in order, each exactly once.
    assert winners == set(line[: min(cancels, waiting)])
    assert await db.fetchval(
        """SELECT count(*) FROM appointment WHERE slot_id = $1 AND status = 'BOOKED'""", slot
    ) == len(now_booked)
    left = await db.fetchval(
        """SELECT coalesce(array_agg(patient_id ORDER BY id), '{}')
             FROM waitlist_entry WHERE slot_id = $1""",
        slot,
    )
    assert left == line[cancels:]


async def test_joins_racing_cancels_never_leave_a_seat_free_with_someone_waiting(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """A join either sees the freed seat (slot_available: book it) or is seen by the
    cancel and gets the seat: never a free seat and a waiting patient."""
    _, slots = await make_slots(client, capacity=3)
    slot = slots[2]["id"]
    holders = [new_id() for _ in range(3)]
    held = {p: (await book(client, slot, p)).json()["id"] for p in holders}
    joiners = [new_id() for _ in range(10)]

    def go(i: int) -> Any:
        if i < 3:
            p = holders[i]
            return client.delete(f"/api/appointments/{held[p]}", headers=auth("patient", p))
        return wait(client, slot, joiners[i - 3])

    responses = await together(13, go)
    assert set(codes(responses)) <= {(200, None), (201, None), (409, "slot_available")}
    (row,) = await assert_slot_invariant(db, [slot])
    in_line = await db.fetchval("SELECT count(*) FROM waitlist_entry WHERE slot_id = $1", slot)
    assert in_line == 0 or row["booked_count"] == row["capacity"]


async def test_joining_a_waitlist_with_an_idempotency_key_replays_on_retry(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client, capacity=1)
    slot = slots[0]["id"]
    assert (await book(client, slot, new_id())).status_code == 201
    patient = new_id()
    headers = {**auth("patient", patient), "Idempotency-Key": f"wait-{patient}"}
    first = await wait(client, slot, patient, headers)
    assert first.status_code == 201, first.text
    again = await wait(client, slot, patient, headers)
    assert again.status_code == 200 and again.json() == first.json()
    assert (
        await db.fetchval(
            "SELECT count(*) FROM waitlist_entry WHERE slot_id = $1 AND patient_id = $2",
            slot,
            patient,
        )
        == 1
    )
    bad = {**headers, "Idempotency-Key": "\x7f"}
    problem(await wait(client, slot, patient, bad), 400, "idempotency_key_required")
