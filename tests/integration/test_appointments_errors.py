"""Every error code of the Appointments section and of the Conventions, through HTTP.

Each refusal is an application/problem+json body with type/title/status/detail/code,
and bad input of any kind changes nothing in the database."""

from __future__ import annotations

import uuid
from datetime import date, timedelta
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from reservo.bootstrap import Container
from reservo.core.http.auth import mint_token
from reservo.core.http.idempotency import Claim
from reservo.core.kernel.clock import OffsetClock
from tests.helpers.appointments import book, book_as, make_doctor, make_slots
from tests.helpers.auth import ADMIN, JWT_SECRET, auth, auth_at, new_id, token
from tests.helpers.http import key, problem

FAR = 2**62  # a valid id no row will ever have


async def counts(db: asyncpg.Connection) -> dict[str, int]:
    """Row counts of every table a bad request could touch (tests run one at a time)."""
    out = {}
    for table in ("doctor", "time_slot", "appointment", "idempotency_key", "outbox"):
        out[table] = await db.fetchval(f"SELECT count(*) FROM {table}")
    return out


async def slot_row(db: asyncpg.Connection, slot_id: int) -> asyncpg.Record:
    return await db.fetchrow("SELECT capacity, booked_count FROM time_slot WHERE id = $1", slot_id)


# -- 401 unauthenticated -------------------------------------------------------------


def _bad_tokens() -> list[tuple[str, dict[str, str]]]:
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    expired = mint_token(JWT_SECRET, "patient", 7, timedelta(seconds=-30), now)
    forged = mint_token(
        "not-the-secret-but-long-enough-0123456789", "admin", 1, timedelta(hours=1), now
    )
    return [
        ("missing", {}),
        ("not a jwt", {"Authorization": "Bearer not-a-jwt"}),
        ("wrong scheme", {"Authorization": f"Basic {token('admin', 1)}"}),
        ("empty bearer", {"Authorization": "Bearer "}),
        ("bad signature", {"Authorization": f"Bearer {forged}"}),
        ("expired", {"Authorization": f"Bearer {expired}"}),
    ]


@pytest.mark.parametrize(("case", "headers"), _bad_tokens(), ids=[c for c, _ in _bad_tokens()])
async def test_every_endpoint_refuses_a_missing_or_invalid_token(
    client: httpx.AsyncClient, db: asyncpg.Connection, case: str, headers: dict[str, str]
) -> None:
    # Real targets, so a request that slipped through would visibly change something.
    doctor, slots = await make_slots(client, capacity=2)
    patient = new_id()
    r = await book(client, slots[0]["id"], patient)
    assert r.status_code == 201
    appt = r.json()["id"]
    before = await counts(db)
    day = (date.today() + timedelta(days=3)).isoformat()
    schedule = {
        "from": day,
        "to": day,
        "weekdays": [1, 2, 3, 4, 5, 6, 7],
        "startTime": "08:00",
        "endTime": "09:00",
    }
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/api/doctors", {"json": {"name": "X", "timezone": "UTC"}}),
        ("POST", f"/api/doctors/{doctor}/schedules", {"json": schedule}),
        ("GET", f"/api/doctors/{doctor}/slots", {"params": {"date": day}}),
        ("POST", "/api/appointments", {"json": {"slotId": slots[1]["id"], "patientId": patient}}),
        ("GET", f"/api/appointments/{appt}", {}),
        ("DELETE", f"/api/appointments/{appt}", {}),
    ]
    for method, url, kw in calls:
        r = await client.request(method, url, headers={**headers, **key()}, **kw)
        problem(r, 401, "unauthenticated")
        assert r.headers.get("www-authenticate", "").lower().startswith("bearer")
    assert await counts(db) == before
    assert await db.fetchval("SELECT status FROM appointment WHERE id = $1", appt) == "BOOKED"


async def test_a_token_expires_by_the_servers_clock(
    client: httpx.AsyncClient, clock: OffsetClock
) -> None:
    headers = auth("admin", 1)  # valid for one hour of real time
    url = f"/api/appointments/{FAR}"
    problem(await client.get(url, headers=headers), 404, "appointment_not_found")
    clock.advance(timedelta(hours=2))
    problem(await client.get(url, headers=headers), 401, "unauthenticated")


# -- 403 forbidden -----------------------------------------------------------------------


async def test_wrong_roles_and_non_owners_are_forbidden(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    doctor, slots = await make_slots(client, capacity=3)
    slot_id, owner, other = slots[0]["id"], new_id(), new_id()
    r = await book(client, slot_id, owner)
    assert r.status_code == 201
    appt = r.json()["id"]
    before = await counts(db)

    # Booking: a customer, a doctor, a patient booking for someone else.
    for role, sub in [("customer", owner), ("doctor", doctor), ("patient", other), ("bettor", 1)]:
        problem(await book_as(client, auth(role, sub), slot_id, owner), 403, "forbidden")
    # Reading and cancelling as a non-patient role: 403.
    for headers in [auth("doctor", doctor), auth("customer", owner)]:
        problem(await client.get(f"/api/appointments/{appt}", headers=headers), 403, "forbidden")
        problem(await client.delete(f"/api/appointments/{appt}", headers=headers), 403, "forbidden")
    # Another patient's appointment is answered as one that does not exist.
    theirs = auth("patient", other)
    for r in (
        await client.get(f"/api/appointments/{appt}", headers=theirs),
        await client.delete(f"/api/appointments/{appt}", headers=theirs),
    ):
        problem(r, 404, "appointment_not_found")
    # Only admin creates doctors.
    for role in ("doctor", "patient", "service"):
        r = await client.post(
            "/api/doctors", json={"name": "X", "timezone": "UTC"}, headers=auth(role, 1)
        )
        problem(r, 403, "forbidden")

    assert await counts(db) == before
    appt_row = await db.fetchrow("SELECT status FROM appointment WHERE id = $1", appt)
    assert appt_row["status"] == "BOOKED"
    assert (await slot_row(db, slot_id))["booked_count"] == 1


async def test_a_doctor_writes_only_their_own_schedule(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    mine, theirs = await make_doctor(client), await make_doctor(client)
    day = (date.today() + timedelta(days=3)).isoformat()
    body = {
        "from": day,
        "to": day,
        "weekdays": [1, 2, 3, 4, 5, 6, 7],
        "startTime": "10:00",
        "endTime": "11:00",
        "slotMinutes": 30,
    }
    before = await counts(db)
    for headers in [auth("doctor", mine), auth("patient", theirs), auth("customer", theirs)]:
        r = await client.post(f"/api/doctors/{theirs}/schedules", json=body, headers=headers)
        problem(r, 403, "forbidden")
    assert await counts(db) == before
    r = await client.post(
        f"/api/doctors/{theirs}/schedules", json=body, headers=auth("doctor", theirs)
    )
    assert r.status_code == 201 and r.json() == {"created": 2, "skipped": 0}


# -- 404 -----------------------------------------------------------------------------------


async def test_unknown_doctor_slot_and_appointment_are_404(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    day = (date.today() + timedelta(days=2)).isoformat()
    body = {
        "from": day,
        "to": day,
        "weekdays": [1, 2, 3, 4, 5, 6, 7],
        "startTime": "08:00",
        "endTime": "09:00",
    }
    before = await counts(db)
    problem(
        await client.post(f"/api/doctors/{FAR}/schedules", json=body, headers=ADMIN),
        404,
        "doctor_not_found",
    )
    problem(
        await client.get(
            f"/api/doctors/{FAR}/slots", params={"date": day}, headers=auth("patient", 5)
        ),
        404,
        "doctor_not_found",
    )
    patient = new_id()
    problem(await book(client, FAR, patient), 404, "slot_not_found")
    for headers in (ADMIN, auth("patient", patient)):
        problem(
            await client.get(f"/api/appointments/{FAR}", headers=headers),
            404,
            "appointment_not_found",
        )
        problem(
            await client.delete(f"/api/appointments/{FAR}", headers=headers),
            404,
            "appointment_not_found",
        )
    after = await counts(db)
    # The refused booking stored its refusal under its key (so a retry gets the same 404);
    # nothing else was written.
    assert after == {**before, "idempotency_key": before["idempotency_key"] + 1}


# -- 409 -------------------------------------------------------------------------------------


async def test_slot_full(client: httpx.AsyncClient, db: asyncpg.Connection) -> None:
    _, slots = await make_slots(client, capacity=1)
    slot_id = slots[0]["id"]
    assert (await book(client, slot_id, new_id())).status_code == 201
    late = new_id()
    problem(await book(client, slot_id, late), 409, "slot_full")
    row = await slot_row(db, slot_id)
    assert (row["capacity"], row["booked_count"]) == (1, 1)
    assert not await db.fetchval("SELECT count(*) FROM appointment WHERE patient_id = $1", late)


async def test_already_booked(client: httpx.AsyncClient, db: asyncpg.Connection) -> None:
    _, slots = await make_slots(client, capacity=3)
    slot_id, patient = slots[0]["id"], new_id()
    assert (await book(client, slot_id, patient)).status_code == 201
    problem(await book(client, slot_id, patient), 409, "already_booked")
    assert (await slot_row(db, slot_id))["booked_count"] == 1
    assert await db.fetchval("SELECT count(*) FROM appointment WHERE patient_id = $1", patient) == 1


async def test_patient_busy_with_an_overlapping_slot_of_another_doctor(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    # Doctor A: 08:00-09:00 in 15 min; doctor B: 08:00-09:00 in 30 min (same zone, day).
    _, a_slots = await make_slots(client, capacity=2)
    _, b_slots = await make_slots(client, capacity=2, minutes=30)
    patient = new_id()
    assert (await book(client, a_slots[1]["id"], patient)).status_code == 201  # 08:15-08:30
    # B's 08:00-08:30 overlaps; B's 08:30-09:00 merely touches and is fine.
    problem(await book(client, b_slots[0]["id"], patient), 409, "patient_busy")
    assert (await slot_row(db, b_slots[0]["id"]))["booked_count"] == 0
    assert (await book(client, b_slots[1]["id"], patient)).status_code == 201
    # Another patient is not affected by this patient's bookings.
    assert (await book(client, b_slots[0]["id"], new_id())).status_code == 201


async def test_slot_in_past_for_booking_a_slot_that_started(
    client: httpx.AsyncClient, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    _, slots = await make_slots(client, capacity=2, days_ahead=1)
    slot_id, patient = slots[0]["id"], new_id()
    clock.advance(timedelta(days=3))
    r = await book_as(client, auth_at(clock, "patient", patient), slot_id, patient)
    problem(r, 409, "slot_in_past")
    assert (await slot_row(db, slot_id))["booked_count"] == 0
    assert not await db.fetchval("SELECT count(*) FROM appointment WHERE patient_id = $1", patient)


async def test_slot_in_past_for_cancelling_an_appointment_that_started(
    client: httpx.AsyncClient, db: asyncpg.Connection, clock: OffsetClock
) -> None:
    _, slots = await make_slots(client, capacity=1, days_ahead=1)
    slot_id, patient = slots[0]["id"], new_id()
    r = await book(client, slot_id, patient)
    assert r.status_code == 201
    appt = r.json()["id"]
    clock.advance(timedelta(days=3))
    for headers in (auth_at(clock, "patient", patient), auth_at(clock, "admin", 1)):
        r = await client.delete(f"/api/appointments/{appt}", headers=headers)
        problem(r, 409, "slot_in_past")
    row = await db.fetchrow("SELECT status, cancelled_at FROM appointment WHERE id = $1", appt)
    assert (row["status"], row["cancelled_at"]) == ("BOOKED", None)
    assert (await slot_row(db, slot_id))["booked_count"] == 1


# -- 422 validation_error ------------------------------------------------------------------


def _validation_problem(r: httpx.Response) -> None:
    body = problem(r, 422, "validation_error")
    assert isinstance(body["errors"], list) and body["errors"]
    for e in body["errors"]:
        assert {"loc", "msg", "type"} <= set(e)


BAD_BOOKINGS: list[tuple[str, Any]] = [
    ("malformed json", b'{"slotId": 1, "patientId": '),
    ("not an object", b"[1, 2]"),
    ("empty body", b""),
    ("slotId as string", {"slotId": "5", "patientId": "P"}),
    ("slotId float", {"slotId": 5.0, "patientId": "P"}),
    ("slotId bool", {"slotId": True, "patientId": "P"}),
    ("slotId null", {"slotId": None, "patientId": "P"}),
    ("slotId zero", {"slotId": 0, "patientId": "P"}),
    ("slotId negative", {"slotId": -3, "patientId": "P"}),
    ("slotId too big", {"slotId": 2**63, "patientId": "P"}),
    ("unknown field", {"slotId": 1, "patientId": "P", "note": "hi"}),
    ("missing patientId", {"slotId": 1}),
    ("missing slotId", {"patientId": "P"}),
]


@pytest.mark.parametrize(("case", "body"), BAD_BOOKINGS, ids=[c for c, _ in BAD_BOOKINGS])
async def test_bad_booking_bodies_are_422_and_change_nothing(
    client: httpx.AsyncClient, db: asyncpg.Connection, case: str, body: Any
) -> None:
    patient = new_id()
    before = await counts(db)
    headers = {**auth("patient", patient), **key(), "Content-Type": "application/json"}
    if isinstance(body, bytes):
        r = await client.post("/api/appointments", content=body, headers=headers)
    else:
        body = {k: (patient if v == "P" else v) for k, v in body.items()}
        r = await client.post("/api/appointments", json=body, headers=headers)
    _validation_problem(r)
    assert await counts(db) == before


def _schedule(**over: Any) -> dict[str, Any]:
    day = (date.today() + timedelta(days=5)).isoformat()
    body: dict[str, Any] = {
        "from": day,
        "to": day,
        "weekdays": [1, 2, 3, 4, 5, 6, 7],
        "startTime": "08:00",
        "endTime": "10:00",
        "slotMinutes": 15,
        "capacity": 1,
    }
    body.update(over)
    return {k: v for k, v in body.items() if v is not ...}


_today = date.today()
BAD_SCHEDULES: list[tuple[str, dict[str, Any]]] = [
    ("year 9999", _schedule(**{"from": "9999-12-30", "to": "9999-12-31"})),
    ("year 1900", _schedule(**{"from": "1900-01-01", "to": "1900-01-02"})),
    ("not a date", _schedule(**{"from": "2026-02-30"})),
    ("datetime as date", _schedule(**{"from": "2027-01-01T00:00:00Z"})),
    ("to before from", _schedule(to=(_today + timedelta(days=1)).isoformat())),
    (
        "93 days",
        _schedule(
            **{
                "from": (_today + timedelta(days=5)).isoformat(),
                "to": (_today + timedelta(days=5 + 92)).isoformat(),
            }
        ),
    ),
    ("slotMinutes 0", _schedule(slotMinutes=0)),
    ("slotMinutes negative", _schedule(slotMinutes=-15)),
    ("slotMinutes string", _schedule(slotMinutes="15")),
    ("capacity 0", _schedule(capacity=0)),
    ("capacity huge", _schedule(capacity=10**12)),
    ("weekday 0", _schedule(weekdays=[0])),
    ("weekday 8", _schedule(weekdays=[8])),
    ("weekdays empty", _schedule(weekdays=[])),
    ("weekdays repeat", _schedule(weekdays=[1, 1])),
    ("weekday name", _schedule(weekdays=["MON"])),
    ("startTime 25:00", _schedule(startTime="25:00")),
    ("end before start", _schedule(startTime="10:00", endTime="08:00")),
    ("end equals start", _schedule(startTime="10:00", endTime="10:00")),
    ("time with offset", _schedule(startTime="08:00+02:00")),
    # Whole minutes or seconds only: no slot starts at 08:00:00.5.
    ("startTime half a second", _schedule(startTime="08:00:00.5")),
    ("endTime milliseconds", _schedule(endTime="10:00:00.250")),
    ("startTime zero fraction", _schedule(startTime="08:00:00.000")),
    ("startTime comma fraction", _schedule(startTime="08:00:00,5")),
    ("repeating, fractional", _schedule(to=..., startTime="08:00:30.5")),
    ("startTime in seconds", _schedule(startTime=28800)),
    ("startTime one-digit hour", _schedule(startTime="8:00")),
    ("missing from", _schedule(**{"from": ...})),
    ("missing weekdays", _schedule(weekdays=...)),
    ("unknown field", _schedule(timezone="UTC")),
]


@pytest.mark.parametrize(("case", "body"), BAD_SCHEDULES, ids=[c for c, _ in BAD_SCHEDULES])
async def test_bad_schedules_are_422_and_create_no_slot(
    client: httpx.AsyncClient, db: asyncpg.Connection, case: str, body: dict[str, Any]
) -> None:
    doctor = await make_doctor(client)
    before = await counts(db)
    r = await client.post(f"/api/doctors/{doctor}/schedules", json=body, headers=ADMIN)
    _validation_problem(r)
    assert await counts(db) == before


async def test_schedule_times_may_name_whole_seconds(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    doctor = await make_doctor(client)
    body = _schedule(startTime="08:00:30", endTime="08:30:30")
    r = await client.post(f"/api/doctors/{doctor}/schedules", json=body, headers=ADMIN)
    assert r.status_code == 201, r.text
    starts = await db.fetch(
        "SELECT start_at FROM time_slot WHERE doctor_id = $1 ORDER BY start_at", doctor
    )
    assert len(starts) == 2
    assert {(s["start_at"].second, s["start_at"].microsecond) for s in starts} == {(30, 0)}


@pytest.mark.parametrize(
    "body",
    [
        {"name": "Dr. X", "timezone": "Mars/Olympus"},
        {"name": "Dr. X", "timezone": "../../etc/passwd"},
        {"name": "Dr. X", "timezone": ""},
        {"name": "Dr. X", "timezone": "+02:00"},
        {"name": "", "timezone": "UTC"},
        {"name": "Dr. X"},
        {"name": "Dr. X", "timezone": "UTC", "rating": 5},
        {"name": 7, "timezone": "UTC"},
    ],
)
async def test_bad_doctors_are_422_and_create_nothing(
    client: httpx.AsyncClient, db: asyncpg.Connection, body: dict[str, Any]
) -> None:
    before = await counts(db)
    _validation_problem(await client.post("/api/doctors", json=body, headers=ADMIN))
    assert await counts(db) == before


@pytest.mark.parametrize(
    "params", [{"date": "9999-12-31"}, {"date": "1900-01-01"}, {"date": "2026-13-01"}, {}]
)
async def test_bad_slot_list_dates_are_422(
    client: httpx.AsyncClient, params: dict[str, str]
) -> None:
    doctor = await make_doctor(client)
    r = await client.get(f"/api/doctors/{doctor}/slots", params=params, headers=ADMIN)
    _validation_problem(r)


@pytest.mark.parametrize(
    "path", ["/api/appointments/0", "/api/appointments/abc", f"/api/appointments/{2**64}"]
)
async def test_bad_path_ids_are_422(client: httpx.AsyncClient, path: str) -> None:
    _validation_problem(await client.get(path, headers=ADMIN))
    _validation_problem(await client.delete(path, headers=ADMIN))


# -- 400 idempotency_key_required ------------------------------------------------------------


@pytest.mark.parametrize(
    "idem",
    [None, "", "k" * 256, "x" * 300, "has space", "caf\u00e9", "tab\there", "new\nline"],
    ids=["missing", "empty", "256 chars", "300 chars", "space", "non-ascii", "tab", "newline"],
)
async def test_missing_or_malformed_idempotency_key_is_400(
    client: httpx.AsyncClient, db: asyncpg.Connection, idem: str | None
) -> None:
    _, slots = await make_slots(client, capacity=2)
    patient = new_id()
    before = await counts(db)
    headers = auth("patient", patient)
    if idem is not None:
        # httpx refuses to send some of these as str; send the raw bytes.
        headers = {**headers, "Idempotency-Key": idem.encode("utf-8")}  # type: ignore[dict-item]
    r = await client.post(
        "/api/appointments",
        json={"slotId": slots[0]["id"], "patientId": patient},
        headers=headers,
    )
    problem(r, 400, "idempotency_key_required")
    assert await counts(db) == before


async def test_the_longest_valid_idempotency_key_is_accepted(client: httpx.AsyncClient) -> None:
    _, slots = await make_slots(client)
    r = await book(client, slots[0]["id"], new_id(), idem="~" * 255)
    assert r.status_code == 201, r.text


# -- 429 rate_limited ------------------------------------------------------------------------


async def test_the_sixth_booking_attempt_in_ten_seconds_is_rate_limited(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client, capacity=1, end="10:00")
    patient = new_id()
    # Five attempts, allowed whatever their outcome (one books, the rest are refused).
    first = await book(client, slots[0]["id"], patient)
    assert first.status_code == 201
    for _ in range(2):
        problem(await book(client, slots[0]["id"], patient), 409, "slot_full")
    for _ in range(2):
        problem(await book(client, FAR, patient), 404, "slot_not_found")
    before = await counts(db)
    r = await book(client, slots[4]["id"], patient)
    problem(r, 429, "rate_limited")
    retry_after = int(r.headers["retry-after"])
    assert 1 <= retry_after <= 10
    assert await counts(db) == before
    assert (await slot_row(db, slots[4]["id"]))["booked_count"] == 0
    # The limit is per patient: someone else books that slot right away.
    assert (await book(client, slots[4]["id"], new_id())).status_code == 201


# -- idempotency conflicts -------------------------------------------------------------------


async def test_idempotency_key_reused_with_another_body_is_422(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client, capacity=2)
    patient, idem = new_id(), f"reuse-{uuid.uuid4()}"
    assert (await book(client, slots[0]["id"], patient, idem)).status_code == 201
    before = await counts(db)
    problem(await book(client, slots[1]["id"], patient, idem), 422, "idempotency_key_reused")
    assert await counts(db) == before
    assert (await slot_row(db, slots[1]["id"]))["booked_count"] == 0


async def test_request_in_progress_while_the_first_request_holds_the_key(
    client: httpx.AsyncClient, db: asyncpg.Connection, container: Container, clock: OffsetClock
) -> None:
    _, slots = await make_slots(client, capacity=2)
    patient, idem = new_id(), f"inflight-{uuid.uuid4()}"
    body = {"slotId": slots[0]["id"], "patientId": patient}
    # A first request claimed the key and has not finished (e.g. it is still running):
    # a retry waits for it (RESERVO_IDEMPOTENCY_WAIT_MS), then is 409.
    claim = await container.idempotency.begin(
        str(patient), "POST /api/appointments", idem, orjson.dumps(body)
    )
    assert isinstance(claim, Claim)
    before = await counts(db)
    r = await book(client, slots[0]["id"], patient, idem)
    problem(r, 409, "request_in_progress")
    assert await counts(db) == before
    # A first request that died never completes: once its lease ran out, a retry runs.
    clock.advance(timedelta(seconds=container.settings.idempotency_lease_s + 1))
    r = await book(client, slots[0]["id"], patient, idem)
    assert r.status_code == 201, r.text
    assert (await slot_row(db, slots[0]["id"]))["booked_count"] == 1
