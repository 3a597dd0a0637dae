"""Recurring jobs: created through HTTP, materialised one job per occurrence
however many materialisers run, none skipped while the service is up,
DST-correct, stopped by DELETE."""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import asyncpg
import httpx
import pytest

from reservo.bootstrap import Container
from reservo.core.kernel.clock import OffsetClock
from reservo.scheduler import Scheduler, repo
from tests.helpers.auth import auth, new_id
from tests.helpers.scheduler import Recorder, category, drop_namespace, make, running
from tests.helpers.waiting import wait_until

SERVICE = auth("service", 1)
NY = ZoneInfo("America/New_York")
BODY = {
    "category": "http",
    "cron": "30 2 * * *",
    "timezone": "America/New_York",
    "payload": {"url": "http://x.test/nightly"},
    "urgency": 7,
}


def utc(*a: int) -> datetime:
    return datetime(*a, tzinfo=UTC)


@pytest.fixture
def ns() -> str:
    return f"rec-test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def sched(own_database: str, redis_url: str, ns: str) -> AsyncIterator[Scheduler]:
    s = make(own_database, redis_url, ns, clock=OffsetClock())
    yield s
    await s.close()
    await drop_namespace(redis_url, ns)


def set_now(s: Scheduler, when: datetime) -> None:
    clock = s.clock
    assert isinstance(clock, OffsetClock)
    clock.offset = when - datetime.now(UTC)


async def occurrences_of(db: asyncpg.Connection, rec_id: int) -> list[datetime]:
    rows = await db.fetch(
        "SELECT occurs_at, run_at FROM scheduled_job WHERE recurring_id = $1 ORDER BY occurs_at",
        rec_id,
    )
    assert all(r["occurs_at"] == r["run_at"] for r in rows)
    return [r["occurs_at"] for r in rows]


# -- the API ---------------------------------------------------------------------------


async def test_create_answers_the_next_run_and_delete_stops_it(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    r = await client.post("/api/recurring-jobs", json=BODY, headers=SERVICE)
    assert r.status_code == 201, r.text
    body = r.json()
    assert set(body) == {"id", "category", "cron", "timezone", "nextRunAt"}
    assert (body["category"], body["cron"], body["timezone"]) == (
        "http",
        "30 2 * * *",
        "America/New_York",
    )
    nxt = datetime.fromisoformat(body["nextRunAt"])
    local = nxt.astimezone(NY)
    # 02:30 New York time, or 03:00 on the day the clocks skip 02:30.
    assert (local.hour, local.minute) in ((2, 30), (3, 0))
    assert datetime.now(UTC) < nxt <= datetime.now(UTC) + timedelta(days=1, hours=1)
    r = await client.delete(f"/api/recurring-jobs/{body['id']}", headers=auth("admin", 1))
    assert r.status_code == 204 and r.content == b""
    r = await client.delete(f"/api/recurring-jobs/{body['id']}", headers=SERVICE)
    assert (r.status_code, r.json()["code"]) == (404, "recurring_job_not_found")
    assert await db.fetchval("SELECT count(*) FROM recurring_job WHERE id = $1", body["id"]) == 0


async def test_bad_input_is_422_and_creates_nothing(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    before = await db.fetchval("SELECT count(*) FROM recurring_job")
    bad = [
        ({**BODY, "cron": "61 * * * *"}, "validation_error"),
        ({**BODY, "cron": "* * * *"}, "validation_error"),
        ({**BODY, "cron": "0 * * * * *"}, "validation_error"),  # 6 fields
        ({**BODY, "cron": "0 0 30 2 *"}, "validation_error"),  # never matches
        ({**BODY, "cron": "@daily"}, "validation_error"),
        ({**BODY, "timezone": "Mars/Olympus"}, "validation_error"),
        ({**BODY, "timezone": "localtime"}, "validation_error"),
        ({**BODY, "timezone": "../../etc/passwd"}, "validation_error"),
        ({**BODY, "category": "no.such.handler"}, "unknown_category"),
        ({**BODY, "category": "BAD CAT"}, "validation_error"),
        ({**BODY, "urgency": 10}, "validation_error"),
        ({**BODY, "payload": {"url": "not a url"}}, "validation_error"),
        ({**BODY, "payload": {"url": "http://127.0.0.1/"}}, "destination_not_allowed"),
        ({**BODY, "extra": 1}, "validation_error"),
        ({k: v for k, v in BODY.items() if k != "cron"}, "validation_error"),
        ({k: v for k, v in BODY.items() if k != "timezone"}, "validation_error"),
    ]
    for body, code in bad:
        r = await client.post("/api/recurring-jobs", json=body, headers=SERVICE)
        assert (r.status_code, r.json()["code"]) == (422, code), (body, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
    r = await client.post("/api/recurring-jobs", content=b"{nope", headers=SERVICE)
    assert r.status_code == 422
    r = await client.delete("/api/recurring-jobs/abc", headers=SERVICE)
    assert r.status_code == 422
    assert await db.fetchval("SELECT count(*) FROM recurring_job") == before


async def test_only_service_and_admin(client: httpx.AsyncClient) -> None:
    assert (await client.post("/api/recurring-jobs", json=BODY)).status_code == 401
    assert (await client.delete("/api/recurring-jobs/1")).status_code == 401
    for role in ("patient", "customer", "doctor", "bettor", "host"):
        headers = auth(role, new_id())
        r = await client.post("/api/recurring-jobs", json=BODY, headers=headers)
        assert (r.status_code, r.json()["code"]) == (403, "forbidden")
        r = await client.delete("/api/recurring-jobs/1", headers=headers)
        assert (r.status_code, r.json()["code"]) == (403, "forbidden")


async def test_idempotency_key_replays_the_same_recurring_job(
    client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    headers = {**auth("service", new_id()), "Idempotency-Key": f"rec-{new_id()}"}
    first = await client.post("/api/recurring-jobs", json=BODY, headers=headers)
    second = await client.post("/api/recurring-jobs", json=BODY, headers=headers)
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json() == second.json()
    other = await client.post("/api/recurring-jobs", json={**BODY, "urgency": 1}, headers=headers)
    assert (other.status_code, other.json()["code"]) == (422, "idempotency_key_reused")
    n = await db.fetchval("SELECT count(*) FROM recurring_job WHERE id = $1", first.json()["id"])
    assert n == 1
    await client.delete(f"/api/recurring-jobs/{first.json()['id']}", headers=SERVICE)


# -- materialising -----------------------------------------------------------------------


async def test_each_occurrence_once_none_skipped_across_passes(
    sched: Scheduler, own_database: str
) -> None:
    cat = category()
    sched.register(cat, Recorder())
    start = utc(2031, 5, 4, 10, 0, 30)
    set_now(sched, start)
    rec = await sched.create_recurring(cat, "*/2 * * * *", "Europe/Paris", {"n": 1}, 3)
    assert rec.next_at == utc(2031, 5, 4, 10, 2)
    # Passes at irregular moments, some closer together than the window, one
    # 50 minutes later (within the catch-up period): every even minute, once.
    for minutes in (0, 1, 4, 4, 9, 59, 60):
        set_now(sched, start + timedelta(minutes=minutes))
        await sched.materialise()
    db = await asyncpg.connect(own_database)
    try:
        got = await occurrences_of(db, rec.id)
        horizon = start + timedelta(minutes=60, seconds=sched.config.window_s)
        expected = []
        t = utc(2031, 5, 4, 10, 2)
        while t < horizon:
            expected.append(t)
            t += timedelta(minutes=2)
        assert got == expected
        row = await db.fetchrow(
            "SELECT category, urgency, payload::text AS payload FROM scheduled_job"
            " WHERE recurring_id = $1 LIMIT 1",
            rec.id,
        )
        assert (row["category"], row["urgency"], json.loads(row["payload"])) == (cat, 3, {"n": 1})
        nxt = await db.fetchval("SELECT next_at FROM recurring_job WHERE id = $1", rec.id)
        assert nxt == expected[-1] + timedelta(minutes=2)
    finally:
        await db.close()


async def test_after_a_long_outage_only_the_catch_up_period_runs_late(
    sched: Scheduler, own_database: str
) -> None:
    cat = category()
    sched.register(cat, Recorder())
    start = utc(2031, 6, 1, 0, 0, 30)
    set_now(sched, start)
    rec = await sched.create_recurring(cat, "0 * * * *", "UTC", {}, 5)
    later = start + timedelta(hours=10)  # down for 10 hours; catch-up is 1 hour
    set_now(sched, later)
    await sched.materialise()
    db = await asyncpg.connect(own_database)
    try:
        assert await occurrences_of(db, rec.id) == [utc(2031, 6, 1, 10)]
    finally:
        await db.close()


async def test_dst_skipped_and_repeated_hours(own_database: str, redis_url: str, ns: str) -> None:
    """New York, 2030: 02:30 does not exist on 10 March (it runs at 03:00 EDT,
    once); 01:30 happens twice on 3 November (it runs once, the first time)."""
    cat = category()
    # A window of three days: one pass sees the whole transition.
    wide = make(own_database, redis_url, ns, clock=OffsetClock(), window_s=3 * 86400)
    try:
        wide.register(cat, Recorder())
        set_now(wide, utc(2030, 3, 8, 12))
        spring = await wide.create_recurring(cat, "30 2 * * *", "America/New_York", {}, 5)
        set_now(wide, utc(2030, 11, 1, 12))
        fall = await wide.create_recurring(cat, "30 1 * * *", "America/New_York", {}, 5)
        set_now(wide, utc(2030, 3, 8, 12))
        await wide.materialise()
        set_now(wide, utc(2030, 11, 1, 12))
        await wide.materialise()
        db = await asyncpg.connect(own_database)
        try:
            got = await occurrences_of(db, spring.id)
            assert [t.astimezone(NY).isoformat() for t in got if t.month == 3] == [
                "2030-03-09T02:30:00-05:00",
                "2030-03-10T03:00:00-04:00",
                "2030-03-11T02:30:00-04:00",
            ]
            got = await occurrences_of(db, fall.id)
            assert [t.astimezone(NY).isoformat() for t in got] == [
                "2030-11-02T01:30:00-04:00",
                "2030-11-03T01:30:00-04:00",
                "2030-11-04T01:30:00-05:00",
            ]
        finally:
            await db.close()
    finally:
        await wide.close()


async def test_concurrent_materialisers_never_create_two_jobs_for_one_occurrence(
    own_database: str, redis_url: str, ns: str
) -> None:
    cat = category()
    many = [make(own_database, redis_url, ns, clock=OffsetClock()) for _ in range(8)]
    try:
        for s in many:
            s.register(cat, Recorder())
        recs = [await many[0].create_recurring(cat, "* * * * *", "UTC", {}, 5) for _ in range(3)]
        for _ in range(3):
            barrier = asyncio.Barrier(len(many))

            async def one(s: Scheduler, b: asyncio.Barrier = barrier) -> None:
                await b.wait()
                await s.materialise()

            await asyncio.gather(*(one(s) for s in many))
            for s in many:  # the next round: the window moved on
                assert isinstance(s.clock, OffsetClock)
                s.clock.advance(timedelta(minutes=3))
        db = await asyncpg.connect(own_database)
        try:
            for rec in recs:
                got = await occurrences_of(db, rec.id)
                assert len(got) == len(set(got)) >= 5
                assert all(b - a == timedelta(minutes=1) for a, b in itertools.pairwise(got))
        finally:
            await db.close()
    finally:
        for s in many:
            await s.close()
        await drop_namespace(redis_url, ns)


async def test_the_unique_key_refuses_a_second_job_for_one_occurrence(
    sched: Scheduler, own_database: str
) -> None:
    """Even writers that skip the recurring row's lock (a bug, an older version)
    cannot create two jobs for one occurrence: the database refuses them."""
    cat = category()
    sched.register(cat, Recorder())
    rec = await sched.create_recurring(cat, "* * * * *", "UTC", {}, 5)
    assert rec.next_at is not None
    instants = [rec.next_at + timedelta(minutes=i) for i in range(10)]
    conns = [await asyncpg.connect(own_database) for _ in range(8)]
    try:
        barrier = asyncio.Barrier(len(conns))

        async def insert(c: asyncpg.Connection) -> int:
            await barrier.wait()
            async with c.transaction():
                return len(
                    await c.fetch(
                        repo.Q.insert_occurrences,
                        rec.id,
                        cat,
                        5,
                        "{}",
                        3,
                        datetime.now(UTC),
                        instants,
                    )
                )

        created = await asyncio.gather(*(insert(c) for c in conns))
        assert sum(created) == len(instants)
        assert await occurrences_of(conns[0], rec.id) == instants
    finally:
        for c in conns:
            await c.close()


async def test_the_scheduler_role_materialises_and_runs_and_delete_cancels(
    container: Container, client: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    """`reservo worker --roles scheduler` (and `all`, and `reservo up`) runs the
    materialiser: a recurring job's next occurrences appear as jobs without
    anyone asking; DELETE cancels those that have not run."""
    cat = category()
    s = container.scheduler
    s.register(cat, Recorder())
    body = {"category": cat, "cron": "* * * * *", "timezone": "Asia/Kolkata", "payload": {}}
    r = await client.post("/api/recurring-jobs", json=body, headers=SERVICE)
    assert r.status_code == 201, r.text
    rec_id = r.json()["id"]

    async def created() -> bool:
        n = await db.fetchval("SELECT count(*) FROM scheduled_job WHERE recurring_id = $1", rec_id)
        return bool(n >= 2)

    async with running(s):
        await wait_until(created, 15)
    r = await client.delete(f"/api/recurring-jobs/{rec_id}", headers=SERVICE)
    assert r.status_code == 204
    left = await db.fetch(
        "SELECT status FROM scheduled_job WHERE recurring_id = $1 AND status NOT IN"
        " ('CANCELLED', 'DONE', 'RUNNING')",
        rec_id,
    )
    assert left == []
    n = await db.fetchval("SELECT count(*) FROM scheduled_job WHERE recurring_id = $1", rec_id)
    await s.materialise()
    n2 = await db.fetchval("SELECT count(*) FROM scheduled_job WHERE recurring_id = $1", rec_id)
    assert n2 == n  # nothing after the DELETE
