"""Second release of the Delayed jobs API, through HTTP: the job list (keyset
pages backed by indexes), retry of DEAD/FAILED jobs, and rescheduling a job
that no worker has claimed, including the races with the executor."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from reservo.bootstrap import Container
from reservo.scheduler import repo
from reservo.settings import Settings
from tests.helpers.auth import auth, new_id
from tests.helpers.scheduler import Recorder, Stack, api_stack, category, running
from tests.helpers.waiting import wait_until

SERVICE = auth("service", 1)
ADMIN = auth("admin", 1)


def now() -> datetime:
    return datetime.now(UTC)


def at(seconds: float) -> str:
    return (now() + timedelta(seconds=seconds)).isoformat()


async def _create(client: httpx.AsyncClient, cat: str, run_at: str, urgency: int = 5) -> int:
    body = {"category": cat, "urgency": urgency, "runAt": run_at, "payload": {}}
    r = await client.post("/api/jobs", json=body, headers=SERVICE)
    assert r.status_code == 201, r.text
    return int(r.json()["jobId"])


async def _pages(client: httpx.AsyncClient, params: dict[str, Any]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        q = {**params, **({"after": after} if after else {})}
        r = await client.get("/api/jobs", params=q, headers=SERVICE)
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"items", "next"}
        assert len(body["items"]) <= int(params.get("limit", 50))
        items += body["items"]
        after = body["next"]
        if after is None:
            return items


@pytest.fixture
async def stack(base_settings: Settings, own_database: str) -> AsyncIterator[Stack]:
    # A window wide enough that jobs a minute away are already in Redis.
    async with api_stack(base_settings, own_database, scheduler_window_s=300) as s:
        yield s


# -- the list --------------------------------------------------------------------------


async def test_list_newest_first_by_status_and_category_in_pages(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection
) -> None:
    cat = category()
    container.scheduler.register(cat, Recorder())
    ids = [await _create(client, cat, at(3600)) for _ in range(7)]
    dead = ids[1:4]
    await db.execute("UPDATE scheduled_job SET status = 'DEAD' WHERE id = ANY($1)", dead)

    listed = await _pages(client, {"category": cat, "limit": 3})
    assert [j["jobId"] for j in listed] == sorted(ids, reverse=True)
    assert set(listed[0]) == {
        "jobId",
        "category",
        "urgency",
        "status",
        "runAt",
        "attempts",
        "startedAt",
        "finishedAt",
        "lastError",
    }
    both = await _pages(client, {"category": cat, "status": "DEAD", "limit": 2})
    assert [j["jobId"] for j in both] == sorted(dead, reverse=True)
    by_status = await _pages(client, {"status": "DEAD", "limit": 200})
    assert {j["status"] for j in by_status} == {"DEAD"}
    assert set(dead) <= {j["jobId"] for j in by_status}
    got = [j["jobId"] for j in by_status]
    assert got == sorted(got, reverse=True)
    r = await client.get("/api/jobs", params={"limit": 2}, headers=ADMIN)
    first = r.json()
    assert len(first["items"]) == 2 and first["next"] is not None
    assert (
        first["items"][0]["jobId"] >= max(ids)
        and first["items"][0]["jobId"] > first["items"][1]["jobId"]
    )


async def test_a_filtered_list_is_planned_for_its_values_every_time(
    db: asyncpg.Connection,
) -> None:
    # PostgreSQL switches a prepared statement to a generic plan after five runs;
    # for a filtered page that plan walks the primary key and filters, reading
    # the whole table when nothing matches (1.2 s at 1,000,000 jobs,
    # docs/BENCHMARKS.md "Console"). Every run must be planned for its values.
    for _ in range(8):
        for status, cat in (("FAILED", "test.none"), ("DEAD", None), (None, "test.none")):
            # Other tests of the session may have left DEAD jobs: the rows don't
            # matter here, the plans do.
            await repo.jobs_page(db, status, cat, None, 51)
    plans = await db.fetch(
        "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
        " WHERE statement = ANY($1::text[])",
        [repo.Q.jobs_page_status_category, repo.Q.jobs_page_status, repo.Q.jobs_page_category],
    )
    assert len(plans) == 3
    for p in plans:
        assert (p["generic_plans"], p["custom_plans"]) == (0, 8), p["statement"]


async def test_list_errors(client: httpx.AsyncClient) -> None:
    bad: list[dict[str, Any]] = [
        {"status": "NOPE"},
        {"status": "dead"},
        {"category": "BAD CAT"},
        {"category": ""},
        {"limit": 0},
        {"limit": 201},
        {"limit": "x"},
        {"after": "not-a-cursor"},
        {"after": "WyJhIl0"},  # ["a"]
        {"after": "Wy0xXQ"},  # [-1]
    ]
    for params in bad:
        r = await client.get("/api/jobs", params=params, headers=SERVICE)
        assert r.status_code == 422, (params, r.text)
        assert r.json()["code"] == "validation_error"
        assert r.headers["content-type"].startswith("application/problem+json")
    assert (await client.get("/api/jobs")).status_code == 401
    for role in ("patient", "bettor", "host"):
        r = await client.get("/api/jobs", headers=auth(role, new_id()))
        assert (r.status_code, r.json()["code"]) == (403, "forbidden")


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", []):
        out += _nodes(child)
    return out


async def test_every_list_filter_is_an_index_range_scan_without_a_sort(
    own_database: str,
) -> None:
    """Among 60,000 jobs (statistics gathered; DEAD and http jobs are rare among
    them, as in life), a page deep in the list is a backward scan of the
    index made for its filter from the cursor: no Sort node, no scan of the
    whole set, whichever page."""
    conn = await asyncpg.connect(own_database)
    try:
        await conn.execute(
            """INSERT INTO scheduled_job (category, urgency, run_at, status, max_attempts,
                                          created_at)
               SELECT CASE WHEN i % 200 = 0 THEN 'http' WHEN i % 2 = 0 THEN 'a.b'
                           ELSE 'c.d' END, 5, now(),
                      CASE WHEN i % 500 = 0 THEN 'DEAD' WHEN i % 7 = 0 THEN 'SCHEDULED'
                           ELSE 'DONE' END, 3, now()
                 FROM generate_series(1, 60000) AS i"""
        )
        await conn.execute("ANALYZE scheduled_job")
        cursor = 30_000
        cases = [
            (repo.Q.jobs_page, (cursor, 51), "scheduled_job_pkey"),
            (repo.Q.jobs_page_status, (cursor, 51, "DEAD"), "scheduled_job_status_id"),
            (repo.Q.jobs_page_category, (cursor, 51, "http"), "scheduled_job_category_id"),
            (repo.Q.jobs_page_status_category, (cursor, 51, "DEAD", "http"), None),
        ]
        for sql, args, index in cases:
            raw = await conn.fetchval("EXPLAIN (FORMAT JSON) " + sql, *args)
            plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
            nodes = _nodes(plan)
            kinds = {n["Node Type"] for n in nodes}
            assert "Sort" not in kinds and "Seq Scan" not in kinds, (sql, nodes)
            scans = [n for n in nodes if n["Node Type"] in ("Index Scan", "Index Only Scan")]
            assert scans and scans[0]["Scan Direction"] == "Backward", (sql, nodes)
            if index is not None:
                assert scans[0]["Index Name"] == index, (sql, nodes)
            else:
                assert scans[0]["Index Name"] in (
                    "scheduled_job_status_id",
                    "scheduled_job_category_id",
                )
    finally:
        await conn.close()


# -- retry -----------------------------------------------------------------------------


async def test_retry_errors(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection
) -> None:
    cat = category()
    container.scheduler.register(cat, Recorder())
    r = await client.post("/api/jobs/999999999999/retry", headers=SERVICE)
    assert (r.status_code, r.json()["code"]) == (404, "job_not_found")
    r = await client.post("/api/jobs/abc/retry", headers=SERVICE)
    assert r.status_code == 422
    job = await _create(client, cat, at(3600))
    for status in ("SCHEDULED", "QUEUED", "RUNNING", "DONE", "CANCELLED"):
        await db.execute("UPDATE scheduled_job SET status = $2 WHERE id = $1", job, status)
        r = await client.post(f"/api/jobs/{job}/retry", headers=SERVICE)
        assert (r.status_code, r.json()["code"]) == (409, "not_retryable"), status
        got = await client.get(f"/api/jobs/{job}", headers=SERVICE)
        assert got.json()["status"] == status  # unchanged
    assert (await client.post(f"/api/jobs/{job}/retry")).status_code == 401
    r = await client.post(f"/api/jobs/{job}/retry", headers=auth("customer", new_id()))
    assert (r.status_code, r.json()["code"]) == (403, "forbidden")


async def test_retry_of_a_dead_job_schedules_it_now_with_a_fresh_budget(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection
) -> None:
    cat = category()
    container.scheduler.register(cat, Recorder())
    job = await _create(client, cat, at(3600))
    await db.execute(
        """UPDATE scheduled_job SET status = 'DEAD', attempts = 5, max_attempts = 5,
                  finished_at = now(), last_error = 'boom' WHERE id = $1""",
        job,
    )
    before = now()
    r = await client.post(f"/api/jobs/{job}/retry", headers=ADMIN)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] in ("SCHEDULED", "QUEUED") and body["attempts"] == 5
    assert body["finishedAt"] is None
    assert before - timedelta(seconds=1) <= datetime.fromisoformat(body["runAt"]) <= now()
    row = await db.fetchrow("SELECT max_attempts, pushed FROM scheduled_job WHERE id = $1", job)
    assert row["max_attempts"] == 5 + container.scheduler.config.max_attempts
    r = await client.post(f"/api/jobs/{job}/retry", headers=ADMIN)
    assert (r.status_code, r.json()["code"]) == (409, "not_retryable")


async def test_concurrent_retries_of_one_dead_job_run_it_once(stack: Stack) -> None:
    cat, rec = category(), Recorder()
    stack.container.scheduler.register(cat, rec)
    job = await _create(stack.client, cat, at(3600))
    await stack.db.execute(
        "UPDATE scheduled_job SET status = 'DEAD', attempts = 3, max_attempts = 3 WHERE id = $1",
        job,
    )
    barrier = asyncio.Barrier(12)

    async def retry() -> httpx.Response:
        await barrier.wait()
        return await stack.client.post(f"/api/jobs/{job}/retry", headers=SERVICE)

    async with running(stack.container.scheduler):
        answers = await asyncio.gather(*(retry() for _ in range(12)))
        codes = sorted(r.status_code for r in answers)
        assert codes == [200] + [409] * 11, [r.text for r in answers]
        assert {r.json()["code"] for r in answers if r.status_code == 409} == {"not_retryable"}
        await wait_until(lambda: _status_is(stack.db, job, "DONE"), 20)
        await asyncio.sleep(0.5)  # a second run would show up here
    assert rec.calls[job] == 1
    runs = await stack.db.fetch("SELECT attempt, outcome FROM job_execution WHERE job_id = $1", job)
    assert [(r["attempt"], r["outcome"]) for r in runs] == [(4, "DONE")]


# -- reschedule ------------------------------------------------------------------------


async def test_reschedule_errors(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection
) -> None:
    cat = category()
    container.scheduler.register(cat, Recorder())
    r = await client.patch("/api/jobs/999999999999", json={"runAt": at(60)}, headers=SERVICE)
    assert (r.status_code, r.json()["code"]) == (404, "job_not_found")
    job = await _create(client, cat, at(3600))
    bad: list[Any] = [
        {},
        {"runAt": "2030-01-01T08:00:00"},  # no offset
        {"runAt": "9999-01-01T08:00:00+00:00"},
        {"runAt": "1999-12-31T23:59:59+00:00"},
        {"runAt": (now() + timedelta(days=6 * 366)).isoformat()},  # past the horizon
        {"runAt": "soon"},
        {"runAt": at(60), "urgency": 1},
        [],
    ]
    for body in bad:
        r = await client.patch(f"/api/jobs/{job}", json=body, headers=SERVICE)
        assert (r.status_code, r.json()["code"]) == (422, "validation_error"), (body, r.text)
    r = await client.patch(f"/api/jobs/{job}", content=b"{nope", headers=SERVICE)
    assert r.status_code == 422
    for status in ("RUNNING", "DONE", "DEAD", "CANCELLED"):
        await db.execute("UPDATE scheduled_job SET status = $2 WHERE id = $1", job, status)
        r = await client.patch(f"/api/jobs/{job}", json={"runAt": at(60)}, headers=SERVICE)
        assert (r.status_code, r.json()["code"]) == (409, "not_cancellable"), status
    assert (await client.patch(f"/api/jobs/{job}", json={"runAt": at(60)})).status_code == 401
    r = await client.patch(
        f"/api/jobs/{job}", json={"runAt": at(60)}, headers=auth("doctor", new_id())
    )
    assert (r.status_code, r.json()["code"]) == (403, "forbidden")


async def test_reschedule_returns_the_job_at_its_new_time(
    client: httpx.AsyncClient, container: Container
) -> None:
    cat = category()
    container.scheduler.register(cat, Recorder())
    job = await _create(client, cat, at(3600))
    new = (now() + timedelta(days=2)).replace(microsecond=0)
    r = await client.patch(f"/api/jobs/{job}", json={"runAt": new.isoformat()}, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "SCHEDULED"
    assert datetime.fromisoformat(r.json()["runAt"]) == new
    got = await client.get(f"/api/jobs/{job}", headers=SERVICE)
    assert datetime.fromisoformat(got.json()["runAt"]) == new


async def _status_is(db: asyncpg.Connection, job: int, status: str) -> bool:
    return bool(await db.fetchval("SELECT status FROM scheduled_job WHERE id = $1", job) == status)


async def _in_zset(stack: Stack, cat: str, job: int, urgency: int = 5) -> float | None:
    s = stack.container.scheduler
    score = await s.redis.zscore(s.keys.future(cat, urgency), str(job))
    return None if score is None else float(score)


async def test_a_job_moved_earlier_runs_at_its_new_time_although_redis_held_the_old(
    stack: Stack,
) -> None:
    cat, rec = category(), Recorder()
    stack.container.scheduler.register(cat, rec)
    job = await _create(stack.client, cat, at(120))
    old = await _in_zset(stack, cat, job)
    assert old is not None  # in Redis at its old time (the window is 300 s)
    new = now() + timedelta(seconds=1)
    r = await stack.client.patch(
        f"/api/jobs/{job}", json={"runAt": new.isoformat()}, headers=SERVICE
    )
    assert r.status_code == 200, r.text
    assert await _in_zset(stack, cat, job) == pytest.approx(new.timestamp() * 1000, abs=1)
    async with running(stack.container.scheduler):
        await wait_until(lambda: _status_is(stack.db, job, "DONE"), 15)
    assert rec.calls[job] == 1
    assert new.timestamp() <= rec.starts[job][0] < new.timestamp() + 5


async def test_a_job_moved_later_never_runs_at_its_old_time_even_from_a_stale_copy(
    stack: Stack,
) -> None:
    """The copy Redis holds at the old time, even one already in the due queue
    (as if moved just before the PATCH), is refused by the claim (the row's
    run_at is in the future) and loaded again at the new time."""
    cat, rec = category(), Recorder()
    s = stack.container.scheduler
    s.register(cat, rec)
    job = await _create(stack.client, cat, at(0.5))
    new = now() + timedelta(seconds=3)
    r = await stack.client.patch(
        f"/api/jobs/{job}", json={"runAt": new.isoformat()}, headers=SERVICE
    )
    assert r.status_code == 200, r.text
    await s.redis.lpush(s.keys.queue(cat, 5), str(job))  # a stale, due copy
    async with running(s):
        await wait_until(lambda: _status_is(stack.db, job, "DONE"), 15)
        await asyncio.sleep(0.3)
    assert rec.calls[job] == 1
    assert rec.starts[job][0] >= new.timestamp()


async def test_patch_racing_the_executor_runs_each_job_once_and_never_at_the_old_time(
    stack: Stack,
) -> None:
    cat, rec = category(), Recorder(delay_s=0.05)
    s = stack.container.scheduler
    s.register(cat, rec)
    due = now() + timedelta(seconds=1)
    jobs = [await _create(stack.client, cat, due.isoformat()) for _ in range(40)]
    new = due + timedelta(seconds=2)
    barrier = asyncio.Barrier(len(jobs))

    async def patch(job: int) -> tuple[int, httpx.Response, float]:
        await barrier.wait()
        r = await stack.client.patch(
            f"/api/jobs/{job}", json={"runAt": new.isoformat()}, headers=SERVICE
        )
        return job, r, time.time()

    async with running(s):
        await asyncio.sleep(max(0.0, due.timestamp() - time.time() - 0.02))
        answers = await asyncio.gather(*(patch(j) for j in jobs))
        await wait_until(lambda: _all_done(stack.db, jobs), 20)
        await asyncio.sleep(0.5)
    moved = [j for j, r, _ in answers if r.status_code == 200]
    kept = [j for j, r, _ in answers if r.status_code != 200]
    for _, r, _ in answers:
        assert r.status_code in (200, 409), r.text
        if r.status_code == 409:
            assert r.json()["code"] == "not_cancellable"
    for j in jobs:
        assert rec.calls[j] == 1, j
    for j in moved:
        assert rec.starts[j][0] >= new.timestamp(), j
    for j in kept:  # it was claimed before the PATCH: it ran at its old time
        assert rec.starts[j][0] < new.timestamp(), j


async def _all_done(db: asyncpg.Connection, jobs: list[int]) -> bool:
    n = await db.fetchval(
        "SELECT count(*) FROM scheduled_job WHERE id = ANY($1) AND status = 'DONE'", jobs
    )
    return bool(n == len(jobs))
