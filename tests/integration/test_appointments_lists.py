"""A patient's appointments (keyset pages, index-backed) and a doctor's agenda,
through HTTP: shapes, owner rules and every error code."""

from __future__ import annotations

import base64
from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

import asyncpg
import httpx
import pytest

from reservo.appointments.repo import Q
from tests.helpers.appointments import book, make_slots
from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.http import problem


async def test_a_patients_appointments_soonest_first_in_keyset_pages(
    client: httpx.AsyncClient,
) -> None:
    _, slots = await make_slots(client, capacity=2, start="08:00", end="10:00")
    patient = new_id()
    # Booked out of order; one of them cancelled afterwards.
    order = [5, 0, 7, 2, 3]
    ids = {}
    for i in order:
        r = await book(client, slots[i]["id"], patient)
        assert r.status_code == 201, r.text
        ids[i] = r.json()["id"]
    c = await client.delete(f"/api/appointments/{ids[2]}", headers=auth("patient", patient))
    assert c.status_code == 200
    other = new_id()
    assert (await book(client, slots[0]["id"], other)).status_code == 201

    me = auth("patient", patient)
    url = f"/api/patients/{patient}/appointments"
    seen: list[int] = []
    after: str | None = None
    while True:
        params: dict[str, str | int] = {"limit": 2}
        if after:
            params["after"] = after
        r = await client.get(url, params=params, headers=me)
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"items", "next"}
        assert len(body["items"]) <= 2
        seen += [a["id"] for a in body["items"]]
        after = body["next"]
        if after is None:
            break
    assert seen == [ids[i] for i in sorted(order)]

    booked = await client.get(url, params={"status": "BOOKED"}, headers=me)
    assert [a["id"] for a in booked.json()["items"]] == [ids[i] for i in (0, 3, 5, 7)]
    assert all(
        a["status"] == "BOOKED" and a["patientId"] == patient for a in booked.json()["items"]
    )
    cancelled = await client.get(url, params={"status": "CANCELLED"}, headers=ADMIN)
    assert [a["id"] for a in cancelled.json()["items"]] == [ids[2]]
    assert cancelled.json()["next"] is None
    first = booked.json()["items"][0]
    assert set(first) == {
        *("id", "slotId", "patientId", "status", "startAt", "endAt", "createdAt", "overbooked")
    }


async def test_the_patient_list_is_an_index_scan_without_a_sort(db: asyncpg.Connection) -> None:
    """The list's own statement: its first and a later page start at an index
    position (seq scans off: a test database is too small for the planner to
    prefer an index, as a production one is not)."""
    await db.execute("SET enable_seqscan = off")
    try:
        for status, after in (
            (None, datetime(1, 1, 1, tzinfo=UTC)),
            ("BOOKED", datetime(2030, 1, 1, tzinfo=UTC)),
        ):
            rows = await db.fetch(
                "EXPLAIN " + Q.patient_appointments, 42, status, after, 7, 51, datetime.now(UTC)
            )
            plan = "\n".join(r[0] for r in rows)
            assert "Index Scan using appointment_patient_start" in plan, plan
            assert "Index Cond" in plan and "period" in plan, plan
            assert "Sort" not in plan, plan
    finally:
        await db.execute("RESET enable_seqscan")


@pytest.mark.parametrize(
    "cursor",
    [
        "not-base64!",
        base64.urlsafe_b64encode(b"[1]").decode(),
        base64.urlsafe_b64encode(b'["yesterday", 3]').decode(),
        base64.urlsafe_b64encode(b'["2030-01-01T00:00:00", 3]').decode(),  # no offset
        base64.urlsafe_b64encode(b'[3, "2030-01-01T00:00:00Z"]').decode(),
    ],
)
async def test_a_malformed_cursor_is_422(client: httpx.AsyncClient, cursor: str) -> None:
    patient = new_id()
    r = await client.get(
        f"/api/patients/{patient}/appointments",
        params={"after": cursor},
        headers=auth("patient", patient),
    )
    problem(r, 422, "validation_error")


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 201}, {"status": "LOST"}])
async def test_bad_list_parameters_are_422(
    client: httpx.AsyncClient, params: dict[str, object]
) -> None:
    patient = new_id()
    r = await client.get(
        f"/api/patients/{patient}/appointments",
        params=params,  # type: ignore[arg-type]
        headers=auth("patient", patient),
    )
    problem(r, 422, "validation_error")


@pytest.mark.parametrize("role", ["patient", "doctor", "customer"])
async def test_only_the_patient_or_an_admin_lists_their_appointments(
    client: httpx.AsyncClient, role: str
) -> None:
    patient = new_id()
    r = await client.get(f"/api/patients/{patient}/appointments", headers=auth(role, new_id()))
    problem(r, 403, "forbidden")
    r = await client.get(f"/api/patients/{patient}/appointments")
    problem(r, 401, "unauthenticated")


async def test_a_doctors_agenda_holds_every_slot_of_the_day_with_its_appointments(
    client: httpx.AsyncClient,
) -> None:
    doctor, slots = await make_slots(client, capacity=1)
    day = datetime.fromisoformat(slots[0]["startAt"]).astimezone(ZoneInfo("Europe/Lisbon")).date()
    a, b = new_id(), new_id()
    first = await book(client, slots[0]["id"], a)
    assert first.status_code == 201
    await client.delete(f"/api/appointments/{first.json()['id']}", headers=auth("patient", a))
    second = await book(client, slots[0]["id"], b)
    full = await book(client, slots[1]["id"], a)
    assert second.status_code == full.status_code == 201

    r = await client.get(
        f"/api/doctors/{doctor}/agenda",
        params={"date": day.isoformat()},
        headers=auth("doctor", doctor),
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["doctorId"] == doctor and body["date"] == day.isoformat()
    assert [s["id"] for s in body["slots"]] == [s["id"] for s in slots]  # full ones too
    s0, s1 = body["slots"][0], body["slots"][1]
    ordinary = {"overbooked": False}
    assert s0["appointments"] == [
        {"id": first.json()["id"], "patientId": a, "status": "CANCELLED", **ordinary},
        {"id": second.json()["id"], "patientId": b, "status": "BOOKED", **ordinary},
    ]
    assert (s0["capacity"], s0["bookedCount"], s0["available"]) == (1, 1, 0)
    assert s1["appointments"] == [
        {"id": full.json()["id"], "patientId": a, "status": "BOOKED", **ordinary}
    ]
    assert body["slots"][2]["appointments"] == []
    assert {"id", "doctorId", "startAt", "endAt", "opensAt", "capacity", "bookedCount"} <= set(s0)
    # An admin sees it too; a day without slots is an empty agenda.
    empty = await client.get(
        f"/api/doctors/{doctor}/agenda", params={"date": "2001-01-01"}, headers=ADMIN
    )
    assert empty.status_code == 200 and empty.json()["slots"] == []


async def test_agenda_errors(client: httpx.AsyncClient) -> None:
    doctor, _ = await make_slots(client)
    day = date.today().isoformat()
    for headers in (auth("doctor", doctor + 1), auth("patient", doctor), auth("doctor", new_id())):
        r = await client.get(f"/api/doctors/{doctor}/agenda", params={"date": day}, headers=headers)
        problem(r, 403, "forbidden")
    r = await client.get(f"/api/doctors/{2**62}/agenda", params={"date": day}, headers=ADMIN)
    problem(r, 404, "doctor_not_found")
    for bad in ("2026-02-30", "9999-12-31", "today"):
        r = await client.get(f"/api/doctors/{doctor}/agenda", params={"date": bad}, headers=ADMIN)
        problem(r, 422, "validation_error")
    r = await client.get(f"/api/doctors/{doctor}/agenda", headers=ADMIN)
    problem(r, 422, "validation_error")
