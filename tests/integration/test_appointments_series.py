"""Appointment series through HTTP: POST /api/appointment-series books every
slot or none (409 with the first refusal's code and slotId), Idempotency-Key
required, the owner patient or an admin; DELETE cancels the rest. And a series
racing single bookings (and other series) on the same slots, released
together: never a partial series, never a slot over capacity."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import date, datetime, timedelta
from functools import partial
from typing import Any

import asyncpg
import httpx
import pytest

from reservo.appointments import events
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import (
    app_client,
    assert_slot_invariant,
    book,
    make_doctor,
    schedule_day,
    slot_list,
)
from tests.helpers.auth import ADMIN, auth, auth_at, new_id
from tests.helpers.http import problem, together


async def slots_of(
    client: httpx.AsyncClient, *, capacity: int = 1, days_ahead: int = 2, **rules: Any
) -> list[dict[str, Any]]:
    doctor = await make_doctor(client)
    day = date.today() + timedelta(days=days_ahead)
    await schedule_day(client, doctor, day, end="10:00", capacity=capacity, **rules)
    return await slot_list(client, doctor, day)


async def series(
    client: httpx.AsyncClient,
    patient: int,
    slot_ids: list[int],
    headers: dict[str, str] | None = None,
    idem: str | None = None,
) -> httpx.Response:
    return await client.post(
        "/api/appointment-series",
        json={"patientId": patient, "slotIds": slot_ids},
        headers={
            **(headers or auth("patient", patient)),
            "Idempotency-Key": idem or str(uuid.uuid4()),
        },
    )


async def live_of(db: asyncpg.Connection, patient: int) -> list[asyncpg.Record]:
    return list(
        await db.fetch(
            "SELECT id, slot_id, series_id FROM appointment"
            " WHERE patient_id = $1 AND status IN ('BOOKED', 'HELD') ORDER BY slot_id",
            patient,
        )
    )


async def test_a_series_books_every_slot_and_replays_its_answer(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    slots = await slots_of(client)
    patient = new_id()
    ids = [slots[4]["id"], slots[0]["id"], slots[2]["id"]]
    r = await series(client, patient, ids, idem="series-1")
    assert r.status_code == 201, r.text
    body = r.json()
    assert [a["slotId"] for a in body["appointments"]] == sorted(ids)  # in time order
    assert {a["status"] for a in body["appointments"]} == {"BOOKED"}
    rows = await live_of(db, patient)
    assert [x["slot_id"] for x in rows] == sorted(ids)
    assert {x["series_id"] for x in rows} == {body["seriesId"]}
    # The same key replays the answer, booking nothing more.
    again = await series(client, patient, ids, idem="series-1")
    assert again.status_code == 200 and again.json() == body  # a stored 201 replays as 200
    assert len(await live_of(db, patient)) == 3
    await assert_slot_invariant(db, ids)
    # Each appointment's event went through the outbox.
    booked = await db.fetchval(
        "SELECT count(*) FROM outbox WHERE topic = $1 AND payload->>'patientId' = $2",
        events.BOOKED,
        str(patient),
    )
    assert booked == 3


async def test_one_refused_slot_books_nothing_and_names_the_slot(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    slots = await slots_of(client)
    taken = slots[3]["id"]
    assert (await book(client, taken, new_id())).status_code == 201
    patient = new_id()
    ids = [slots[0]["id"], slots[1]["id"], taken, slots[5]["id"]]
    body = problem(await series(client, patient, ids), 409, "slot_full")
    assert body["slotId"] == taken
    assert await live_of(db, patient) == []
    assert (
        await db.fetchval("SELECT count(*) FROM appointment_series WHERE patient_id = $1", patient)
        == 0
    )
    await assert_slot_invariant(db, ids)
    # Other refusals, each with its slot: an unknown slot, two overlapping slots.
    body = problem(await series(client, patient, [slots[0]["id"], 10**12]), 404, "slot_not_found")
    assert body["slotId"] == 10**12
    elsewhere = await slots_of(client)
    body = problem(
        await series(client, patient, [slots[0]["id"], elsewhere[0]["id"]]), 409, "patient_busy"
    )
    assert body["slotId"] == elsewhere[0]["id"]
    assert await live_of(db, patient) == []


async def test_a_series_obeys_the_booking_rules(
    client: httpx.AsyncClient, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    slots = await slots_of(client, maxPerPatientPerDay=2)
    patient = new_id()
    ids = [slots[0]["id"], slots[2]["id"], slots[4]["id"]]
    body = problem(await series(client, patient, ids), 409, "daily_limit")
    assert body["slotId"] == slots[4]["id"]
    assert await live_of(db, patient) == []
    assert (await series(client, patient, ids[:2])).status_code == 201

    noticed = await slots_of(client, minNoticeMinutes=60)
    clock.advance(
        datetime.fromisoformat(noticed[1]["startAt"]) - clock.now() - timedelta(minutes=30)
    )
    other = new_id()
    ids = [noticed[6]["id"], noticed[2]["id"]]
    body = problem(
        await series(client, other, ids, auth_at(clock, "patient", other)), 409, "too_late_to_book"
    )
    assert body["slotId"] == noticed[2]["id"]
    # An admin is not bound by the notice.
    r = await series(client, other, ids, auth_at(clock, "admin", 1))
    assert r.status_code == 201, r.text


async def test_who_may_book_and_cancel_a_series(client: httpx.AsyncClient) -> None:
    slots = await slots_of(client)
    patient, stranger = new_id(), new_id()
    problem(
        await series(client, patient, [slots[0]["id"]], auth("patient", stranger)), 403, "forbidden"
    )
    problem(
        await series(client, patient, [slots[0]["id"]], auth("doctor", new_id())), 403, "forbidden"
    )
    r = await client.post(
        "/api/appointment-series",
        json={"patientId": patient, "slotIds": [slots[0]["id"]]},
        headers=auth("patient", patient),
    )
    problem(r, 400, "idempotency_key_required")
    for bad in ([], [slots[0]["id"], slots[0]["id"]]):
        problem(await series(client, patient, bad), 422, "validation_error")
    made = await series(client, patient, [slots[0]["id"]], ADMIN)
    assert made.status_code == 201, made.text
    series_id = made.json()["seriesId"]
    url = f"/api/appointment-series/{series_id}"
    problem(await client.delete(url, headers=auth("patient", stranger)), 404, "series_not_found")
    problem(
        await client.delete("/api/appointment-series/999999999", headers=ADMIN),
        404,
        "series_not_found",
    )


async def test_cancelling_a_series_cancels_the_rest(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    slots = await slots_of(client)
    patient = new_id()
    me = auth("patient", patient)
    made = await series(client, patient, [s["id"] for s in slots[:3]])
    assert made.status_code == 201
    first = made.json()["appointments"][0]["id"]
    # One was cancelled on its own already.
    assert (await client.delete(f"/api/appointments/{first}", headers=me)).status_code == 200
    url = f"/api/appointment-series/{made.json()['seriesId']}"
    r = await client.delete(url, headers=me)
    assert r.status_code == 200, r.text
    assert [a["status"] for a in r.json()["appointments"]] == ["CANCELLED"] * 3
    assert await live_of(db, patient) == []
    await assert_slot_invariant(db, [s["id"] for s in slots[:3]])
    # Twice is fine; the seats are free for others.
    again = await client.delete(url, headers=me)
    assert again.status_code == 200 and again.json() == r.json()
    assert (await book(client, slots[1]["id"], new_id())).status_code == 201


async def test_cancelling_a_series_leaves_what_has_started(
    client: httpx.AsyncClient, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    slots = await slots_of(client)
    patient = new_id()
    made = await series(client, patient, [slots[0]["id"], slots[4]["id"]])
    assert made.status_code == 201
    clock.advance(datetime.fromisoformat(slots[1]["startAt"]) - clock.now())  # slot 0 started
    url = f"/api/appointment-series/{made.json()['seriesId']}"
    r = await client.delete(url, headers=auth_at(clock, "patient", patient))
    assert r.status_code == 200, r.text
    assert [a["status"] for a in r.json()["appointments"]] == ["BOOKED", "CANCELLED"]


# -- races ---------------------------------------------------------------------------------


@pytest.fixture
async def roomy_client(
    base_settings: Settings, clock: OffsetClock
) -> AsyncIterator[httpx.AsyncClient]:
    async with app_client(base_settings.with_(appointments_booking_rate_limit=1000), clock) as c:
        yield c


async def race_one(
    client: httpx.AsyncClient,
    ids: list[int],
    series_patients: tuple[int, int],
    singles: list[tuple[int, int]],
    i: int,
) -> httpx.Response:
    """Request ``i`` of a race: the two series first, then the single bookings."""
    if i < 2:
        return await series(client, series_patients[i], ids if i == 0 else ids[::-1])
    slot_id, patient = singles[i - 2]
    return await book(client, slot_id, patient)


async def test_a_series_racing_single_bookings_is_never_partial(
    roomy_client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """Each round: two series (the same four slots, in opposite orders) and 12
    single bookings of those slots by other patients, released together. Each
    series has all four appointments or none; no slot is over capacity."""
    client = roomy_client
    outcomes: set[str] = set()
    for _ in range(5):
        slots = await slots_of(client)
        ids = [s["id"] for s in slots[:4]]
        a, b = new_id(), new_id()
        singles = [(ids[i % 4], new_id()) for i in range(12)]

        results = await together(14, partial(race_one, client, ids, (a, b), singles))
        assert all(r.status_code in (201, 409) for r in results), [r.text for r in results]
        for patient, r in ((a, results[0]), (b, results[1])):
            rows = await live_of(db, patient)
            if r.status_code == 201:
                assert len(rows) == 4 and len(r.json()["appointments"]) == 4
                outcomes.add("whole")
            else:
                assert rows == [], rows  # never a partial series
                assert r.json()["code"] == "slot_full" and r.json()["slotId"] in ids
                outcomes.add("none")
        # Capacity 1: each slot has exactly one holder, whoever won it.
        rows = await assert_slot_invariant(db, ids)
        assert [x["booked_count"] for x in rows] == [1, 1, 1, 1]
        assert (
            sum(r.status_code == 201 for r in results[2:])
            + 4 * sum(r.status_code == 201 for r in results[:2])
            == 4
        )
        holders = await db.fetch(
            "SELECT a.patient_id, a.series_id FROM appointment a"
            " WHERE a.slot_id = ANY($1::bigint[]) AND a.status = 'BOOKED'",
            ids,
        )
        assert len(holders) == 4
    assert outcomes  # what happened is recorded; both are allowed outcomes
