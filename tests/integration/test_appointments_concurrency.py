"""Many real concurrent clients released together against one slot.

Each request runs through the real app and takes its own pooled PostgreSQL
connection; afterwards the invariant is checked in SQL: a slot's booked_count
equals its BOOKED appointments and never exceeds its capacity.

Each test runs on a single Redis and on a Redis Cluster (the booking gate,
its rate limit and full marks, the slot list cache)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable

import asyncpg
import httpx
import pytest

from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import app_client, assert_slot_invariant, book, make_slots
from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.http import codes, together

pytestmark = pytest.mark.redis_cluster


@pytest.fixture
async def roomy_client(
    base_settings: Settings, clock: OffsetClock
) -> AsyncIterator[httpx.AsyncClient]:
    """The real app with a per-patient rate limit high enough for one patient's 20 retries."""
    async with app_client(base_settings.with_(appointments_booking_rate_limit=1000), clock) as c:
        yield c


@pytest.fixture
async def unhurried_client(
    base_settings: Settings, clock: OffsetClock
) -> AsyncIterator[httpx.AsyncClient]:
    """The real app with 2 s for a Redis call instead of 0.25 s. On a Redis Cluster
    under a loaded suite, a rush of 30 opens connections to every node, and a
    connect past 0.25 s fails the gate open: the attempt goes on to the database,
    as designed (tests/integration/test_resilience.py), but that is not what a
    test of the gate's refusals is about."""
    async with app_client(base_settings.with_(redis_timeout_s=2.0), clock) as c:
        yield c


@pytest.mark.parametrize(("patients", "capacity"), [(50, 1), (200, 10)])
async def test_concurrent_patients_never_overbook_a_slot(
    client: httpx.AsyncClient, db: asyncpg.Connection, patients: int, capacity: int
) -> None:
    _, slots = await make_slots(client, capacity=capacity)
    slot_id = slots[0]["id"]
    ids = [new_id() for _ in range(patients)]

    responses = await together(patients, lambda i: book(client, slot_id, ids[i]))

    assert codes(responses) == {(201, None): capacity, (409, "slot_full"): patients - capacity}
    winners = {r.json()["patientId"] for r in responses if r.status_code == 201}
    rows = await assert_slot_invariant(db, [slot_id])
    assert rows[0]["booked_count"] == capacity
    booked = await db.fetch(
        "SELECT patient_id FROM appointment WHERE slot_id = $1 AND status = 'BOOKED'", slot_id
    )
    assert {r["patient_id"] for r in booked} == winners
    assert await db.fetchval("SELECT count(*) FROM appointment WHERE slot_id = $1", slot_id) == (
        capacity
    )


async def test_concurrent_retries_of_one_idempotency_key_book_once(
    roomy_client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(roomy_client, capacity=5)
    slot_id, patient = slots[0]["id"], new_id()
    idem = f"retry-{patient}"

    responses = await together(20, lambda _: book(roomy_client, slot_id, patient, idem))

    by_status = Counter(r.status_code for r in responses)
    # The one request that ran; the others waited for it and replayed its answer.
    assert by_status == {201: 1, 200: 19}, [r.text for r in responses]
    ok = [r.json() for r in responses]
    assert len({b["id"] for b in ok}) == 1
    assert all(b == ok[0] for b in ok)  # a replay is the same body
    rows = await db.fetch("SELECT id FROM appointment WHERE patient_id = $1", patient)
    assert [r["id"] for r in rows] == [ok[0]["id"]]
    # A late retry, once everything settled, still gets the same booking back.
    late = await book(roomy_client, slot_id, patient, idem)
    assert late.status_code == 200 and late.json() == ok[0]
    (row,) = await assert_slot_invariant(db, [slot_id])
    assert row["booked_count"] == 1


async def test_concurrent_cancels_free_the_capacity_exactly_once(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client, capacity=3)
    slot_id = slots[0]["id"]
    keeper, canceller = new_id(), new_id()
    assert (await book(client, slot_id, keeper)).status_code == 201
    r = await book(client, slot_id, canceller)
    assert r.status_code == 201
    appt = r.json()["id"]

    def cancel(i: int) -> Awaitable[httpx.Response]:
        # Owner and admin race each other; both are allowed to cancel.
        headers = ADMIN if i % 2 else auth("patient", canceller)
        return client.delete(f"/api/appointments/{appt}", headers=headers)

    responses = await together(10, cancel)

    assert [r.status_code for r in responses] == [200] * 10, [r.text for r in responses]
    assert {r.json()["status"] for r in responses} == {"CANCELLED"}
    assert {r.json()["id"] for r in responses} == {appt}
    (row,) = await assert_slot_invariant(db, [slot_id])
    assert row["booked_count"] == 1  # 2 booked, one cancelled ten times -> 1


async def test_one_patient_racing_for_overlapping_slots_of_different_doctors_gets_one(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    # Five doctors with the same hours: their first slots are the same instant.
    firsts = [(await make_slots(client, capacity=2))[1][0] for _ in range(5)]
    assert len({s["startAt"] for s in firsts}) == 1
    patient = new_id()

    responses = await together(5, lambda i: book(client, firsts[i]["id"], patient))

    assert codes(responses) == {(201, None): 1, (409, "patient_busy"): 4}
    assert (
        await db.fetchval(
            "SELECT count(*) FROM appointment WHERE patient_id = $1 AND status = 'BOOKED'", patient
        )
        == 1
    )
    rows = await assert_slot_invariant(db, [s["id"] for s in firsts])
    assert sorted(r["booked_count"] for r in rows) == [0, 0, 0, 0, 1]


async def test_one_patient_racing_for_one_slot_with_fresh_keys_books_it_once(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client, capacity=10)
    slot_id, patient = slots[0]["id"], new_id()

    responses = await together(5, lambda _: book(client, slot_id, patient))

    assert codes(responses) == {(201, None): 1, (409, "already_booked"): 4}
    (row,) = await assert_slot_invariant(db, [slot_id])
    assert row["booked_count"] == 1


async def test_booking_and_cancelling_race_on_a_full_slot_keeps_the_count_right(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """While the holder of a capacity-1 slot cancels, 20 others try to book it:
    at most one of them gets it, and the count matches the rows."""
    _, slots = await make_slots(client, capacity=1)
    slot_id, holder = slots[0]["id"], new_id()
    r = await book(client, slot_id, holder)
    assert r.status_code == 201
    appt = r.json()["id"]
    others = [new_id() for _ in range(20)]

    def act(i: int) -> Awaitable[httpx.Response]:
        if i == 0:
            return client.delete(f"/api/appointments/{appt}", headers=auth("patient", holder))
        return book(client, slot_id, others[i - 1])

    responses = await together(21, act)

    assert responses[0].status_code == 200
    tally = codes(responses[1:])
    assert set(tally) <= {(201, None), (409, "slot_full")}, tally
    assert tally[(201, None)] <= 1
    (row,) = await assert_slot_invariant(db, [slot_id])
    assert row["booked_count"] == tally[(201, None)]
    # Whatever the interleaving, the freed seat is not lost: if nobody got it, it is bookable now.
    if tally[(201, None)] == 0:
        assert (await book(client, slot_id, new_id())).status_code == 201
    await assert_slot_invariant(db, [slot_id])


async def test_attempts_in_line_behind_the_one_that_filled_a_slot_never_reach_the_database(
    unhurried_client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """Attempts at one slot go on to the database one at a time per process; the
    ones that waited while the first filled the slot are refused from its full
    mark, as the gate would refuse them: none of them claims its key."""
    client = unhurried_client
    _, slots = await make_slots(client, capacity=1)
    slot_id = slots[0]["id"]
    ids = [new_id() for _ in range(30)]

    responses = await together(30, lambda i: book(client, slot_id, ids[i]))

    assert codes(responses) == {(201, None): 1, (409, "slot_full"): 29}
    callers = [str(i) for i in ids]
    claimed = await db.fetchval(
        "SELECT count(*) FROM idempotency_key WHERE caller = ANY($1::text[])", callers
    )
    assert claimed == 1
    (row,) = await assert_slot_invariant(db, [slot_id])
    assert row["booked_count"] == 1


async def test_a_retry_in_line_behind_the_attempt_that_filled_the_slot_gets_its_answer(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """A retry whose key already reached the database is never refused from the
    full mark, even when the attempt it waited for filled the slot."""
    _, slots = await make_slots(client, capacity=2)
    slot_id, patient = slots[0]["id"], new_id()
    first = await book(client, slot_id, patient, f"mine-{patient}")
    assert first.status_code == 201
    others = [new_id() for _ in range(10)]

    def act(i: int) -> Awaitable[httpx.Response]:
        if i == len(others):  # started last: in line behind the others
            return book(client, slot_id, patient, f"mine-{patient}")
        return book(client, slot_id, others[i])

    responses = await together(len(others) + 1, act)

    retry = responses[-1]
    assert retry.status_code == 200 and retry.json() == first.json()
    assert codes(responses[:-1]) == {(201, None): 1, (409, "slot_full"): 9}
    (row,) = await assert_slot_invariant(db, [slot_id])
    assert row["booked_count"] == 2
