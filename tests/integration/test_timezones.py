"""One zone rule at every intake, and materialisers that park a bad row.

A time zone is accepted only when both Python and PostgreSQL know it
(core.kernel.timezones). A row written before the rule (inserted here straight into the
database) is parked, logged and counted by the loop that meets it (repeating
schedules, recurring jobs) while every other row goes on; a lost connection is
an outage, never a bad row."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Awaitable, Callable
from datetime import date, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from reservo.appointments.schedules import SCHEDULE_BATCH, SCHEDULES_LOOP
from reservo.appointments.setup import Appointments
from reservo.bootstrap import Container
from reservo.core.kernel.clock import OffsetClock
from reservo.core.kernel.errors import DomainError
from reservo.core.kernel.timezones import zone_names
from reservo.scheduler.service import MATERIALISER, RECURRING_BATCH
from tests.helpers.appointments import days_with_slots, make_doctor, repeating
from tests.helpers.auth import ADMIN, auth

SERVICE = auth("service", 1)
# Names zoneinfo may list that are no place (or that PostgreSQL may not know),
# and names nobody knows.
REFUSED = [
    "localtime",
    "Factory",
    "posixrules",
    "posix/Europe/Paris",
    "right/UTC",
    "Mars/Olympus",
    "europe/paris",
    "../../etc/passwd",
]
# What an older version could store: a name PostgreSQL refuses outright, and one
# it knows but the rule refuses.
LEGACY_ZONES = ["Mars/Olympus", "localtime"]


async def poisoned(client: httpx.AsyncClient, loop: str) -> float:
    text = (await client.get("/metrics")).text
    m = re.search(rf'^reservo_poison_rows_total{{loop="{re.escape(loop)}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def recurring_body(zone: str = "UTC", cron: str = "* * * * *") -> dict[str, Any]:
    return {
        "category": "http",
        "cron": cron,
        "timezone": zone,
        "payload": {"url": f"http://x.test/{uuid.uuid4().hex}"},
    }


# -- the rule ---------------------------------------------------------------------------


async def test_every_accepted_zone_is_known_to_postgresql(db: asyncpg.Connection) -> None:
    known = {r["name"] for r in await db.fetch("SELECT name FROM pg_timezone_names")}
    assert "Europe/Paris" in zone_names()
    assert zone_names() <= known, sorted(zone_names() - known)


@pytest.mark.parametrize("name", REFUSED)
@pytest.mark.parametrize(
    ("path", "body", "table"),
    [
        ("/api/doctors", lambda tz: {"name": "Dr. Zone", "timezone": tz}, "doctor"),
        ("/api/recurring-jobs", recurring_body, "recurring_job"),
    ],
    ids=["doctor", "recurring-job"],
)
async def test_a_zone_outside_the_rule_is_422_at_every_intake(
    client: httpx.AsyncClient,
    db: asyncpg.Connection,
    name: str,
    path: str,
    body: Callable[[str], dict[str, Any]],
    table: str,
) -> None:
    before = await db.fetchval(f"SELECT count(*) FROM {table}")
    r = await client.post(path, json=body(name), headers=ADMIN)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    problem = r.json()
    assert problem["code"] == "validation_error"
    assert any(e["loc"][-1] == "timezone" for e in problem["errors"]), problem
    assert await db.fetchval(f"SELECT count(*) FROM {table}") == before


async def test_a_zone_inside_the_rule_is_accepted(client: httpx.AsyncClient) -> None:
    for name in ("Europe/Paris", "America/Argentina/Buenos_Aires", "UTC"):
        r = await client.post(
            "/api/doctors", json={"name": "Dr. Z", "timezone": name}, headers=ADMIN
        )
        assert r.status_code == 201 and r.json()["timezone"] == name, r.text
        r = await client.post("/api/recurring-jobs", json=recurring_body(name), headers=SERVICE)
        assert r.status_code == 201 and r.json()["timezone"] == name, r.text


@pytest.mark.parametrize("legacy", LEGACY_ZONES)
async def test_a_doctor_stored_with_a_bad_zone_is_a_clear_409_not_a_500(
    client: httpx.AsyncClient, db: asyncpg.Connection, clock: OffsetClock, legacy: str
) -> None:
    doctor = await db.fetchval(
        "INSERT INTO doctor (name, timezone) VALUES ('Dr. Old', $1) RETURNING id", legacy
    )
    today = clock.now().date()
    r = await client.post(
        f"/api/doctors/{doctor}/schedules",
        headers=ADMIN,
        json={
            "from": today.isoformat(),
            "to": today.isoformat(),
            "weekdays": [1, 2, 3, 4, 5, 6, 7],
            "startTime": "09:00",
            "endTime": "10:00",
        },
    )
    assert r.status_code == 409 and r.json()["code"] == "unknown_timezone", r.text
    r = await client.get(
        f"/api/doctors/{doctor}/slots", params={"date": today.isoformat()}, headers=ADMIN
    )
    assert r.status_code == 409 and r.json()["code"] == "unknown_timezone", r.text
    assert await db.fetchval("SELECT count(*) FROM time_slot WHERE doctor_id = $1", doctor) == 0


# -- repeating schedules ----------------------------------------------------------------


async def extend_all(container: Container) -> None:
    """Runs the appointments role's batches until one comes back short."""
    while await container.module(Appointments).service.extend_schedules() >= SCHEDULE_BATCH:
        pass


async def test_a_schedule_with_a_bad_zone_is_parked_and_the_others_are_extended(
    client: httpx.AsyncClient, db: asyncpg.Connection, clock: OffsetClock, container: Container
) -> None:
    today = clock.now().date()
    good = [await make_doctor(client, tz) for tz in ("UTC", "Europe/Paris")]
    bad = [await make_doctor(client, "UTC") for _ in LEGACY_ZONES]
    for doctor in good + bad:
        await repeating(client, doctor, today)
    # What an older version let through.
    for doctor, legacy in zip(bad, LEGACY_ZONES, strict=True):
        await db.execute("UPDATE doctor SET timezone = $2 WHERE id = $1", doctor, legacy)
    before = await poisoned(client, SCHEDULES_LOOP)

    clock.advance(timedelta(days=3))
    await extend_all(container)
    horizon = clock.now().date() + timedelta(days=14)
    for doctor in good:
        assert horizon - (await days_with_slots(db, doctor))[-1] <= timedelta(days=1)
    for doctor, legacy in zip(bad, LEGACY_ZONES, strict=True):
        row = await db.fetchrow(
            "SELECT parked_at, last_error, generated_until FROM doctor_schedule"
            " WHERE doctor_id = $1",
            doctor,
        )
        assert row["parked_at"] is not None, (legacy, dict(row))
        assert SCHEDULES_LOOP in row["last_error"] and legacy in row["last_error"]
        assert row["generated_until"] == today + timedelta(days=14)  # not extended
    assert await poisoned(client, SCHEDULES_LOOP) == before + len(bad)

    # Parked once: the next runs skip them and count nothing more.
    clock.advance(timedelta(days=1))
    await extend_all(container)
    assert await poisoned(client, SCHEDULES_LOOP) == before + len(bad)
    assert (await days_with_slots(db, good[0]))[-1] == clock.now().date() + timedelta(days=14)


async def test_the_appointments_role_keeps_running_past_a_bad_zone(
    client: httpx.AsyncClient, db: asyncpg.Connection, clock: OffsetClock, container: Container
) -> None:
    today = clock.now().date()
    bad, good = await make_doctor(client, "UTC"), await make_doctor(client, "UTC")
    await repeating(client, bad, today)
    await repeating(client, good, today)
    await db.execute("UPDATE doctor SET timezone = 'Mars/Olympus' WHERE id = $1", bad)
    clock.advance(timedelta(days=2))
    stop = asyncio.Event()
    task = asyncio.create_task(container.roles()["appointments"](stop))
    try:

        async def extended() -> bool:
            return (await days_with_slots(db, good))[-1] == today + timedelta(days=16)

        await until(extended)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
    assert await db.fetchval(
        "SELECT parked_at IS NOT NULL FROM doctor_schedule WHERE doctor_id = $1", bad
    )


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")


# -- recurring jobs ---------------------------------------------------------------------


async def create_recurring(client: httpx.AsyncClient, zone: str = "UTC") -> int:
    r = await client.post("/api/recurring-jobs", json=recurring_body(zone), headers=SERVICE)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


async def materialise_all(container: Container) -> None:
    """Runs materialiser passes until one comes back short."""
    sched = container.scheduler
    while (await sched.materialise())[0] >= RECURRING_BATCH:
        pass


async def jobs_of(db: asyncpg.Connection, recurring_id: int) -> int:
    n = await db.fetchval(
        "SELECT count(*) FROM scheduled_job WHERE recurring_id = $1", recurring_id
    )
    return int(n)


async def test_a_recurring_job_with_a_bad_row_is_parked_and_the_others_materialise(
    client: httpx.AsyncClient, db: asyncpg.Connection, container: Container
) -> None:
    good = [await create_recurring(client), await create_recurring(client, "Asia/Kolkata")]
    bad_zones = [await create_recurring(client) for _ in LEGACY_ZONES]
    bad_cron = await create_recurring(client)
    for rec, legacy in zip(bad_zones, LEGACY_ZONES, strict=True):
        await db.execute("UPDATE recurring_job SET timezone = $2 WHERE id = $1", rec, legacy)
    await db.execute("UPDATE recurring_job SET cron = '61 * * * *' WHERE id = $1", bad_cron)
    bad = [*bad_zones, bad_cron]
    before = await poisoned(client, MATERIALISER)

    while (await container.scheduler.materialise())[0] >= RECURRING_BATCH:
        pass

    for rec in good:
        assert await jobs_of(db, rec) >= 4  # every minute of the 5-minute window
        assert await db.fetchval("SELECT parked_at FROM recurring_job WHERE id = $1", rec) is None
    for rec in bad:
        row = await db.fetchrow("SELECT * FROM recurring_job WHERE id = $1", rec)
        assert row["parked_at"] is not None and MATERIALISER in row["last_error"], dict(row)
        assert row["next_at"] is not None  # kept: an operator may fix the row and clear it
        assert await jobs_of(db, rec) == 0
    assert await poisoned(client, MATERIALISER) == before + len(bad)
    # Parked: the next pass skips them.
    await container.scheduler.materialise()
    assert await poisoned(client, MATERIALISER) == before + len(bad)


# -- an outage is not a bad row -----------------------------------------------------------


async def terminate_when_waiting(dsn: str, table: str) -> None:
    """Kills the backend that waits for ``table``'s lock: a lost connection."""
    conn = await asyncpg.connect(dsn)
    try:
        for _ in range(200):
            pid = await conn.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND query ILIKE '%' || $1 || '%'",
                table,
            )
            if pid is not None:
                await conn.execute("SELECT pg_terminate_backend($1)", pid)
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"nobody waited for {table}")
    finally:
        await conn.close()


async def lost_connection_during(
    db: asyncpg.Connection, database_url: str, table: str, work: Awaitable[object]
) -> None:
    """Runs ``work`` while ``table`` is locked, and kills its connection once it waits."""
    async with db.transaction():
        await db.execute(f"LOCK TABLE {table} IN SHARE MODE")
        task = asyncio.ensure_future(work)
        await terminate_when_waiting(database_url, table)
        with pytest.raises(DomainError) as caught:
            await task
    assert caught.value.code == "unavailable"


async def test_a_lost_connection_parks_no_schedule(
    client: httpx.AsyncClient,
    db: asyncpg.Connection,
    clock: OffsetClock,
    container: Container,
    database_url: str,
) -> None:
    doctor = await make_doctor(client, "UTC")
    today: date = clock.now().date()
    await repeating(client, doctor, today)
    await extend_all(container)  # nothing else due: only this one waits below
    clock.advance(timedelta(days=1))
    before = await poisoned(client, SCHEDULES_LOOP)
    await lost_connection_during(
        db, database_url, "time_slot", container.module(Appointments).service.extend_schedules()
    )
    assert await poisoned(client, SCHEDULES_LOOP) == before
    assert (
        await db.fetchval("SELECT parked_at FROM doctor_schedule WHERE doctor_id = $1", doctor)
        is None
    )
    # The database is back; the pool answers 503 at once for the hold after an
    # outage (RESERVO_DB_UNAVAILABLE_HOLD_S), as a loop's next turn would find.
    await asyncio.sleep(container.settings.db_unavailable_hold_s)
    await extend_all(container)  # it goes on
    assert (await days_with_slots(db, doctor))[-1] == today + timedelta(days=15)


async def test_a_lost_connection_parks_no_recurring_job(
    client: httpx.AsyncClient, db: asyncpg.Connection, container: Container, database_url: str
) -> None:
    sched = container.scheduler
    await materialise_all(container)
    rec = await create_recurring(client)
    before = await poisoned(client, MATERIALISER)
    await lost_connection_during(db, database_url, "scheduled_job", sched.materialise())
    assert await poisoned(client, MATERIALISER) == before
    assert await db.fetchval("SELECT parked_at FROM recurring_job WHERE id = $1", rec) is None
    assert await jobs_of(db, rec) == 0
    await asyncio.sleep(container.settings.db_unavailable_hold_s)  # the outage's hold
    await sched.materialise()
    assert await jobs_of(db, rec) >= 4
