"""One accepted range for every instant and date a client sends: an absurd time
is 422 at every endpoint that takes one, and nothing is written."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import httpx
import pytest

from tests.helpers.appointments import make_doctor
from tests.helpers.auth import ADMIN, auth, new_id
from tests.helpers.betting import ODDS
from tests.helpers.rentals import make_car

SERVICE = auth("service", 1)
ABSURD_INSTANTS = [
    "0001-01-01T00:00:00Z",
    "0001-01-01T00:00:00+14:00",  # year 0 once converted to UTC
    "1999-12-31T23:59:59Z",
    "2100-01-01T00:00:00Z",
    "9999-12-31T23:59:59-12:00",
]
ABSURD_DAYS = ["0001-01-01", "1999-12-31", "2100-01-01", "9999-12-31"]
TABLES = ("scheduled_job", "betting_match", "booking", "time_slot")


async def row_counts(db: asyncpg.Connection) -> dict[str, int]:
    return {t: await db.fetchval(f"SELECT count(*) FROM {t}") for t in TABLES}


def assert_422(r: httpx.Response) -> None:
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["code"] == "validation_error"


@pytest.mark.parametrize("instant", ABSURD_INSTANTS)
async def test_absurd_instants_are_refused_everywhere(
    client: httpx.AsyncClient, db: asyncpg.Connection, instant: str
) -> None:
    car = await make_car(client)
    customer = new_id()
    before = await row_counts(db)
    job: dict[str, Any] = {"category": "http", "runAt": instant, "payload": {"url": "https://e.x/"}}
    assert_422(await client.post("/api/jobs", json=job, headers=SERVICE))
    match = {
        "externalId": f"ext-{uuid.uuid4()}",
        "home": "A",
        "away": "B",
        "startsAt": instant,
        "odds": ODDS,
    }
    assert_422(await client.post("/api/matches", json=match, headers=ADMIN))
    sane = "2030-01-01T10:00:00Z"
    for period in ({"from": instant, "to": sane}, {"from": sane, "to": instant}):
        booking = {"carId": car["id"], "customerId": customer, **period}
        headers = {**auth("customer", customer), "Idempotency-Key": str(uuid.uuid4())}
        assert_422(await client.post("/api/bookings", json=booking, headers=headers))
        assert_422(
            await client.get("/api/cars", params={"city": "Lisbon", **period}, headers=ADMIN)
        )
    assert await row_counts(db) == before


@pytest.mark.parametrize("day", ABSURD_DAYS)
async def test_absurd_dates_are_refused_everywhere(
    client: httpx.AsyncClient, db: asyncpg.Connection, day: str
) -> None:
    doctor = await make_doctor(client)
    before = await row_counts(db)
    schedule = {
        "from": day,
        "to": day,
        "weekdays": list(range(1, 8)),
        "startTime": "08:00",
        "endTime": "09:00",
        "slotMinutes": 15,
        "capacity": 1,
    }
    r = await client.post(f"/api/doctors/{doctor}/schedules", json=schedule, headers=ADMIN)
    assert_422(r)
    r = await client.get(f"/api/doctors/{doctor}/slots", params={"date": day}, headers=ADMIN)
    assert_422(r)
    assert await row_counts(db) == before
