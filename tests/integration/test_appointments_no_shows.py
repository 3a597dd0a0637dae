"""No-shows through HTTP: POST /api/appointments/{id}/no-show by the slot's doctor
or an admin after the start, its refusals, the race with the patient's cancel,
and the policy (N no-shows within 90 days block booking, rescheduling and the
waitlist; an admin clears it), on the hot booking path too."""

from __future__ import annotations

import re
import uuid
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import (
    assert_counters_match,
    make_overbookable,
    make_slots,
    overbook,
    wait,
)
from tests.helpers.auth import auth_at, new_id
from tests.helpers.console import signed_in
from tests.helpers.http import codes, problem, together

# Moves the app's clock for one request's task only (httpx's ASGI transport runs
# the app in the caller's task): two requests racing on one row can then each
# pass their own time check, as requests of two API processes would around a
# slot's start.
_skew: ContextVar[timedelta] = ContextVar("skew", default=timedelta(0))


class SkewClock(OffsetClock):
    def now(self) -> datetime:
        return super().now() + _skew.get()


@pytest.fixture
def clock() -> OffsetClock:
    return SkewClock()


@pytest.fixture
def base_settings(base_settings: Settings) -> Settings:
    """One patient books more often here than the per-patient rate limit allows."""
    return base_settings.with_(appointments_booking_rate_limit=100)


async def book_at(
    client: httpx.AsyncClient, clock: OffsetClock, slot_id: int, patient: int
) -> httpx.Response:
    """A booking on the hot path (exactly its body shape)."""
    return await client.post(
        "/api/appointments",
        json={"slotId": slot_id, "patientId": patient},
        headers={**auth_at(clock, "patient", patient), "Idempotency-Key": str(uuid.uuid4())},
    )


async def no_show(
    client: httpx.AsyncClient, appointment_id: int, headers: dict[str, str]
) -> httpx.Response:
    return await client.post(f"/api/appointments/{appointment_id}/no-show", headers=headers)


async def booked_and_started(
    client: httpx.AsyncClient, clock: OffsetClock, n: int, patient: int | None = None
) -> tuple[int, list[dict[str, Any]], list[dict[str, Any]]]:
    """A doctor with slots in 2 days, ``n`` of them booked (by ``patient``, or one
    new patient each), and slots in 6 days still to come; then the app's clock
    moves 3 days on, past the first ones' start. Returns the doctor, the
    appointments and the later slots."""
    doctor, slots = await make_slots(client, capacity=2)
    _, later = await make_slots(client, capacity=1, days_ahead=6)
    appts = []
    for s in slots[:n]:
        r = await book_at(client, clock, s["id"], patient or new_id())
        assert r.status_code == 201, r.text
        appts.append(r.json())
    clock.advance(timedelta(days=3))
    return doctor, appts, later


async def test_the_slots_doctor_marks_a_no_show_after_the_start(
    client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    doctor, slots = await make_slots(client, capacity=2)
    patient = new_id()
    appt = (await book_at(client, clock, slots[0]["id"], patient)).json()
    me = auth_at(clock, "doctor", doctor)
    problem(await no_show(client, appt["id"], me), 409, "not_started")

    clock.advance(timedelta(days=3))
    me = auth_at(clock, "doctor", doctor)
    for who in (auth_at(clock, "doctor", new_id()), auth_at(clock, "doctor", doctor + 1)):
        problem(await no_show(client, appt["id"], who), 404, "appointment_not_found")
    problem(await no_show(client, appt["id"], auth_at(clock, "patient", patient)), 403, "forbidden")
    problem(await no_show(client, 2**62, me), 404, "appointment_not_found")

    r = await no_show(client, appt["id"], me)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["id"], body["status"], body["patientId"]) == (appt["id"], "NO_SHOW", patient)
    problem(await no_show(client, appt["id"], me), 409, "not_booked")
    # The patient sees it, the seat counter follows the BOOKED ones.
    mine = await client.get(
        f"/api/appointments/{appt['id']}", headers=auth_at(clock, "patient", patient)
    )
    assert mine.json()["status"] == "NO_SHOW"
    listed = await client.get(
        f"/api/patients/{patient}/appointments",
        params={"status": "NO_SHOW"},
        headers=auth_at(clock, "patient", patient),
    )
    assert [a["id"] for a in listed.json()["items"]] == [appt["id"]]
    assert await assert_counters_match(db, slots[0]["id"]) == (0, 0)
    topics = await db.fetch(
        "SELECT topic FROM outbox WHERE key = $1 ORDER BY id", f"appointment:{appt['id']}"
    )
    assert [t["topic"] for t in topics][-1] == "appointments.appointment.no-show.v1"


async def test_only_a_booked_appointment_becomes_a_no_show(
    client: httpx.AsyncClient, clock: OffsetClock
) -> None:
    _, slots = await make_slots(client, capacity=2)
    patient = new_id()
    appt = (await book_at(client, clock, slots[0]["id"], patient)).json()
    cancelled = await client.delete(
        f"/api/appointments/{appt['id']}", headers=auth_at(clock, "patient", patient)
    )
    assert cancelled.status_code == 200
    clock.advance(timedelta(days=3))
    admin = auth_at(clock, "admin", 1)
    problem(await no_show(client, appt["id"], admin), 409, "not_booked")


async def test_a_no_show_racing_the_patients_cancel_ends_in_one_state(
    client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    """Each cancel runs a second before the slot's start, each no-show a second
    after it (so both pass their time checks), all released together: every
    appointment ends CANCELLED or NO_SHOW, the request that lost is refused, and
    the slot's counter freed each seat exactly once."""
    n = 15
    doctor, slots = await make_slots(client, capacity=n)
    slot_id = slots[0]["id"]
    start = datetime.fromisoformat(slots[0]["startAt"])
    patients = [new_id() for _ in range(n)]
    appts = [(await book_at(client, clock, slot_id, p)).json()["id"] for p in patients]
    before = start - timedelta(seconds=1) - clock.now()
    after = start + timedelta(seconds=1) - clock.now()

    async def one(i: int) -> httpx.Response:
        k = i // 2
        if i % 2 == 0:
            _skew.set(before)
            who = auth_at(clock, "patient", patients[k])
            return await client.delete(f"/api/appointments/{appts[k]}", headers=who)
        _skew.set(after)
        return await no_show(client, appts[k], auth_at(clock, "doctor", doctor))

    responses = await together(2 * n, one)

    states = dict(
        await db.fetch("SELECT id, status FROM appointment WHERE id = ANY($1::bigint[])", appts)
    )
    for k, appt in enumerate(appts):
        cancel, mark = responses[2 * k], responses[2 * k + 1]
        assert {cancel.status_code, mark.status_code} == {200, 409}, (cancel.text, mark.text)
        if cancel.status_code == 200:
            assert states[appt] == "CANCELLED" and mark.json()["code"] == "not_booked"
        else:
            assert states[appt] == "NO_SHOW" and mark.json()["status"] == "NO_SHOW"
    assert sum(codes(responses).values()) == 2 * n
    assert await assert_counters_match(db, slot_id) == (0, 0)


async def test_the_limit_of_no_shows_blocks_booking_until_an_admin_clears_it(
    client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    patient = new_id()
    doctor, appts, later = await booked_and_started(client, clock, 3, patient)
    me = auth_at(clock, "patient", patient)
    doc = auth_at(clock, "doctor", doctor)
    for appt in appts[:2]:
        assert (await no_show(client, appt["id"], doc)).status_code == 200
    # Two no-shows: still free to book (and to cancel again).
    ok = await book_at(client, clock, later[0]["id"], patient)
    assert ok.status_code == 201, ok.text
    assert (await no_show(client, appts[2]["id"], doc)).status_code == 200

    # The third: blocked on the hot path (book_at's shape), for a reschedule and the waitlist.
    body = problem(await book_at(client, clock, later[1]["id"], patient), 409, "no_show_limit")
    assert "blocked until" in body["detail"]
    moved = await client.post(
        f"/api/appointments/{ok.json()['id']}/reschedule",
        json={"slotId": later[2]["id"]},
        headers={**me, "Idempotency-Key": str(uuid.uuid4())},
    )
    problem(moved, 409, "no_show_limit")
    filler = new_id()
    assert (await book_at(client, clock, later[3]["id"], filler)).status_code == 201
    problem(await wait(client, later[3]["id"], patient, me), 409, "no_show_limit")
    assert (
        await db.fetchval(
            "SELECT count(*) FROM appointment WHERE patient_id = $1 AND status = 'BOOKED'", patient
        )
        == 1
    )  # only the booking made before the block, unmoved
    assert (await assert_counters_match(db, later[2]["id"])) == (0, 0)

    # Only an admin lifts it.
    for who in (me, doc):
        r = await client.delete(f"/api/patients/{patient}/no-shows", headers=who)
        problem(r, 403, "forbidden")
    r = await client.delete(f"/api/patients/{patient}/no-shows", headers=auth_at(clock, "admin", 1))
    assert r.status_code == 204 and r.content == b""
    assert (await book_at(client, clock, later[1]["id"], patient)).status_code == 201


async def test_the_block_lasts_block_days_from_the_last_no_show(
    client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    patient = new_id()
    # Slots 40 days on, open by the time the block runs out.
    far_doctor, _ = await make_slots(client, capacity=1, days_ahead=40)  # not open yet: unlisted
    far = await db.fetch("SELECT id FROM time_slot WHERE doctor_id = $1 ORDER BY id", far_doctor)
    doctor, appts, _ = await booked_and_started(client, clock, 3, patient)
    doc = auth_at(clock, "doctor", doctor)
    for appt in appts:
        assert (await no_show(client, appt["id"], doc)).status_code == 200
    until = await db.fetchval(
        "SELECT blocked_until FROM patient_block WHERE patient_id = $1", patient
    )
    last = max(datetime.fromisoformat(a["startAt"]) for a in appts)
    assert until == last + timedelta(days=30)
    clock.advance(until - clock.now() - timedelta(minutes=1))
    problem(await book_at(client, clock, far[0]["id"], patient), 409, "no_show_limit")
    clock.advance(timedelta(minutes=2))
    assert (await book_at(client, clock, far[0]["id"], patient)).status_code == 201


async def test_clearing_forgets_the_earlier_no_shows(
    client: httpx.AsyncClient, clock: OffsetClock
) -> None:
    patient = new_id()
    doctor, appts, later = await booked_and_started(client, clock, 4, patient)
    doc, admin = auth_at(clock, "doctor", doctor), auth_at(clock, "admin", 1)
    for appt in appts[:3]:
        assert (await no_show(client, appt["id"], doc)).status_code == 200
    assert (
        await client.delete(f"/api/patients/{patient}/no-shows", headers=admin)
    ).status_code == 204
    # A fourth no-show does not block again: those marked up to the clearing
    # are forgiven.
    assert (await no_show(client, appts[3]["id"], admin)).status_code == 200
    assert (await book_at(client, clock, later[0]["id"], patient)).status_code == 201
    # Clearing a patient who has none is fine too.
    r = await client.delete(f"/api/patients/{new_id()}/no-shows", headers=admin)
    assert r.status_code == 204


async def test_no_shows_marked_at_once_count_each_other(
    client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    """Three no-shows of one patient marked together still reach the limit."""
    patient = new_id()
    doctor, appts, later = await booked_and_started(client, clock, 3, patient)
    doc = auth_at(clock, "doctor", doctor)
    responses = await together(3, lambda i: no_show(client, appts[i]["id"], doc))
    assert [r.status_code for r in responses] == [200, 200, 200]
    problem(await book_at(client, clock, later[0]["id"], patient), 409, "no_show_limit")


async def test_a_blocked_patient_on_a_waitlist_is_skipped(
    client: httpx.AsyncClient, clock: OffsetClock, db: asyncpg.Connection
) -> None:
    patient = new_id()
    doctor, appts, later = await booked_and_started(client, clock, 3, patient)
    slot_id = later[0]["id"]
    holder, next_in_line = new_id(), new_id()
    held = await book_at(client, clock, slot_id, holder)
    # Waiting before the block, then blocked, then a seat frees.
    assert (
        await wait(client, slot_id, patient, auth_at(clock, "patient", patient))
    ).status_code == 201
    assert (
        await wait(client, slot_id, next_in_line, auth_at(clock, "patient", next_in_line))
    ).status_code == 201
    doc = auth_at(clock, "doctor", doctor)
    for appt in appts:
        assert (await no_show(client, appt["id"], doc)).status_code == 200
    r = await client.delete(
        f"/api/appointments/{held.json()['id']}", headers=auth_at(clock, "patient", holder)
    )
    assert r.status_code == 200
    got = await db.fetch(
        "SELECT patient_id FROM appointment WHERE slot_id = $1 AND status = 'BOOKED'", slot_id
    )
    assert [g["patient_id"] for g in got] == [next_in_line]
    reason = await db.fetchval(
        "SELECT payload->>'reason' FROM outbox"
        " WHERE topic = 'appointments.waitlist.patient-skipped.v1'"
        " AND (payload->>'patientId')::bigint = $1",
        patient,
    )
    assert reason == "no_show_limit"


async def test_the_console_shows_a_patients_no_shows_and_the_overbooked_seats(
    client: httpx.AsyncClient, clock: OffsetClock
) -> None:
    await signed_in(client)  # by today's clock: the session outlives what follows
    doctor, day, slots = await make_overbookable(client, capacity=1, limit=2)
    patient = new_id()
    appts = [(await book_at(client, clock, s["id"], patient)).json() for s in slots[:3]]
    extra = await overbook(client, slots[3]["id"], new_id(), auth_at(clock, "doctor", doctor))
    assert extra.status_code == 201
    later = _skew.set(timedelta(days=3))  # the doctor marks them once the slots started
    try:
        for appt in appts:
            r = await no_show(client, appt["id"], auth_at(clock, "doctor", doctor))
            assert r.status_code == 200
    finally:
        _skew.reset(later)

    page = await client.get("/console/clinic/appointments", params={"patient": patient})
    assert page.status_code == 200, page.text
    standing = re.search(r'<p class="card" id="no-shows">(.*?)</p>', page.text, re.S)
    assert standing is not None
    assert "<strong>3</strong> counted" in standing[1] and "3 in all" in standing[1]
    assert "Booking blocked until" in standing[1]
    assert page.text.count("<td>NO_SHOW</td>") == 3

    agenda = await client.get("/console/clinic", params={"doctor": doctor, "day": day.isoformat()})
    assert agenda.status_code == 200
    card = re.search(
        rf'<article class="card slot" id="slot-{slots[3]["id"]}">(.*?)</article>', agenda.text, re.S
    )
    assert card is not None
    assert "<strong>1/2</strong> overbooked seats" in card[1]
    assert f'<tr id="appointment-{extra.json()["id"]}">' in card[1]
    assert "BOOKED · overbooked" in card[1]

    # Cleared by an admin (after the marking): the page says so.
    later = _skew.set(timedelta(days=3, minutes=1))
    try:
        admin = auth_at(clock, "admin", 1)
        r = await client.delete(f"/api/patients/{patient}/no-shows", headers=admin)
    finally:
        _skew.reset(later)
    assert r.status_code == 204
    page = await client.get("/console/clinic/appointments", params={"patient": patient})
    assert "Not blocked." in page.text and "<strong>0</strong> counted" in page.text
